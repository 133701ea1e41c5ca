//! The control socket: a Unix stream socket (`global.control_socket`) served by one small
//! thread plus one thread per client, never by a reactor. Requests are parsed here and handed
//! to the main thread, which owns the running configuration and applies every change through
//! the same path as a SIGHUP reload (`Target::apply`); the client thread waits for the answer.
//!
//! Access: the socket is created mode 0600 in a directory created mode 0700, and every peer's
//! `SO_PEERCRED` uid must be root or the daemon's own uid (a socket file made reachable by
//! hand, or inherited through a bind mount, still admits no one else).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::proto::{Envelope, Request, Response, MAX_REQUEST_LINE};

/// Concurrent clients; more are answered with an error and closed.
const MAX_CLIENTS: usize = 8;
/// An idle client is dropped after this long without a complete request.
const CLIENT_IDLE: Duration = Duration::from_secs(60);
/// How long a client thread waits for the main thread (a reload opening large files).
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the accept loop checks for shutdown.
const ACCEPT_POLL_MS: u16 = 200;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {path}: cannot create directory {dir}: {source}")]
    Directory {
        path: PathBuf,
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("control socket {0}: another process is serving it")]
    InUse(PathBuf),
    #[error("control socket {0}: exists and is not a socket")]
    NotASocket(PathBuf),
    #[error("control socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One request on its way to the main thread.
pub struct ControlCall {
    pub request: Request,
    /// An edit that must not be written to the configuration file.
    pub transient: bool,
    pub reply: SyncSender<Response>,
}

/// Wakes the main thread's poll (the signal self-pipe) after a call was queued.
pub type Waker = Box<dyn Fn() + Send + Sync>;

/// The listening socket and its accept thread. Dropping it stops accepting and removes the
/// socket file (only if it is still ours).
pub struct ControlSocket {
    path: PathBuf,
    identity: (u64, u64),
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn socket_error(path: &Path) -> impl FnOnce(io::Error) -> ControlError + '_ {
    move |source| ControlError::Socket {
        path: path.to_owned(),
        source,
    }
}

/// Removes a socket file left by a daemon that died (nobody accepts on it); refuses to touch
/// a live one or anything that is not a socket.
fn clear_stale(path: &Path) -> Result<(), ControlError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(socket_error(path)(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(ControlError::NotASocket(path.to_owned()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(ControlError::InUse(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing stale control socket");
            std::fs::remove_file(path).map_err(socket_error(path))
        }
        Err(e) => Err(socket_error(path)(e)),
    }
}

impl ControlSocket {
    /// Creates the socket and starts accepting. Calls arrive on `calls`; `wake` is invoked
    /// after each one is queued.
    pub fn open(
        path: &Path,
        calls: Sender<ControlCall>,
        wake: Waker,
    ) -> Result<ControlSocket, ControlError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|source| ControlError::Directory {
                        path: path.to_owned(),
                        dir: dir.to_owned(),
                        source,
                    })?;
            }
        }
        clear_stale(path)?;
        let listener = UnixListener::bind(path).map_err(socket_error(path))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(socket_error(path))?;
        let meta = std::fs::symlink_metadata(path).map_err(socket_error(path))?;
        listener.set_nonblocking(true).map_err(socket_error(path))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("control".to_owned())
                .spawn(move || accept_loop(listener, stop, calls, Arc::new(wake)))
                .map_err(socket_error(path))?
        };
        tracing::info!(path = %path.display(), "control socket listening");
        Ok(ControlSocket {
            path: path.to_owned(),
            identity: (meta.dev(), meta.ino()),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // A successor may already have replaced the file: remove only our own.
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.identity {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

fn accept_loop(
    listener: UnixListener,
    stop: Arc<AtomicBool>,
    calls: Sender<ControlCall>,
    wake: Arc<Waker>,
) {
    let clients = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(ACCEPT_POLL_MS)).unwrap_or(0) == 0 {
            continue;
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning on a readable listener.
                tracing::warn!(error = %e, "control socket accept failed");
                std::thread::sleep(Duration::from_millis(ACCEPT_POLL_MS.into()));
                continue;
            }
        };
        if let Err(reason) = admit(&stream) {
            tracing::warn!("control client refused: {reason}");
            let _ = reply(&stream, &Response::failure(reason));
            continue;
        }
        if clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
            clients.fetch_sub(1, Ordering::AcqRel);
            let _ = reply(&stream, &Response::failure("too many control clients"));
            continue;
        }
        let calls = calls.clone();
        let wake = Arc::clone(&wake);
        let count = Arc::clone(&clients);
        let spawned = std::thread::Builder::new()
            .name("control-client".to_owned())
            .spawn(move || {
                serve_client(stream, &calls, &**wake);
                count.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            clients.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "cannot start a control client thread");
        }
    }
}

/// SO_PEERCRED: root, or the user the daemon runs as.
fn admit(stream: &UnixStream) -> Result<(), String> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let creds = getsockopt(stream, PeerCredentials)
        .map_err(|e| format!("cannot read peer credentials: {e}"))?;
    let me = nix::unistd::geteuid().as_raw();
    if creds.uid() == 0 || creds.uid() == me {
        Ok(())
    } else {
        Err(format!(
            "uid {} (pid {}) is not allowed: root or uid {me} only",
            creds.uid(),
            creds.pid()
        ))
    }
}

fn reply(mut stream: &UnixStream, response: &Response) -> io::Result<()> {
    let mut line = serde_json::to_vec(response).map_err(io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)
}

/// Reads one request line of at most `MAX_REQUEST_LINE` bytes. `Ok(None)`: the client closed.
fn read_line(reader: &mut BufReader<&UnixStream>) -> Result<Option<Vec<u8>>, String> {
    let mut line = Vec::new();
    let limit = MAX_REQUEST_LINE as u64 + 1;
    match reader.by_ref().take(limit).read_until(b'\n', &mut line) {
        Ok(0) => Ok(None),
        Ok(_) if line.last() == Some(&b'\n') => {
            line.pop();
            Ok(Some(line))
        }
        Ok(_) if line.len() > MAX_REQUEST_LINE => {
            Err(format!("request longer than {MAX_REQUEST_LINE} bytes"))
        }
        // The client closed after an unterminated request: answer it anyway.
        Ok(_) => Ok(Some(line)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err("idle for too long".to_owned())
        }
        Err(e) => Err(e.to_string()),
    }
}

fn serve_client(stream: UnixStream, calls: &Sender<ControlCall>, wake: &dyn Fn()) {
    if stream.set_nonblocking(false).is_err()
        || stream.set_read_timeout(Some(CLIENT_IDLE)).is_err()
        || stream.set_write_timeout(Some(CLIENT_IDLE)).is_err()
    {
        return;
    }
    let mut reader = BufReader::new(&stream);
    loop {
        let line = match read_line(&mut reader) {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(reason) => {
                let _ = reply(&stream, &Response::failure(reason));
                return;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let response = match serde_json::from_slice::<Envelope>(&line) {
            Ok(Envelope { request, transient }) => call(request, transient, calls, wake),
            Err(e) => Response::failure(format!("bad request: {e}")),
        };
        if reply(&stream, &response).is_err() {
            return;
        }
    }
}

fn call(
    request: Request,
    transient: bool,
    calls: &Sender<ControlCall>,
    wake: &dyn Fn(),
) -> Response {
    let (reply, answer) = mpsc::sync_channel(1);
    let call = ControlCall {
        request,
        transient,
        reply,
    };
    if calls.send(call).is_err() {
        return Response::failure("nvmfd is shutting down");
    }
    wake();
    match answer.recv_timeout(REPLY_TIMEOUT) {
        Ok(response) => response,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            Response::failure("no answer from the main thread in time")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Response::failure("nvmfd is shutting down"),
    }
}

/// The main thread's end: calls queued since the last look.
pub fn pending(calls: &Receiver<ControlCall>) -> Vec<ControlCall> {
    calls.try_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nvmfd-control-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// A stand-in for the main thread: answers every call with the request echoed back.
    fn echo_main(calls: Receiver<ControlCall>) {
        std::thread::spawn(move || {
            for call in calls {
                let _ = call.reply.send(Response::success(&call.request));
            }
        });
    }

    fn exchange(stream: &mut UnixStream, line: &str) -> Response {
        stream.write_all(line.as_bytes()).unwrap();
        let mut reader = BufReader::new(&*stream);
        let mut answer = String::new();
        reader.read_line(&mut answer).unwrap();
        serde_json::from_str(&answer).unwrap()
    }

    #[test]
    fn creates_private_directory_and_socket_and_removes_it_on_drop() {
        let dir = scratch("perm");
        let path = dir.join("sub/control.sock");
        let (tx, rx) = mpsc::channel();
        echo_main(rx);
        let socket = ControlSocket::open(&path, tx, Box::new(|| {})).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("sub")), 0o700);
        assert_eq!(mode(&path), 0o600);

        let mut client = UnixStream::connect(&path).unwrap();
        let r = exchange(&mut client, "{\"command\":\"ports\"}\n");
        assert!(r.ok);
        assert_eq!(r.result["command"], "ports");
        // Several requests on one connection; garbage gets an error, not a hang-up.
        let r = exchange(&mut client, "not json\n");
        assert!(!r.ok && r.error.unwrap().starts_with("bad request"));
        let r = exchange(&mut client, "{\"command\":\"subsystem\",\"nqn\":\"x\"}\n");
        assert_eq!(r.result["nqn"], "x");

        // A second daemon on the same path is refused while the first one serves it.
        let (tx2, _rx2) = mpsc::channel();
        assert!(matches!(
            ControlSocket::open(&path, tx2, Box::new(|| {})),
            Err(ControlError::InUse(_))
        ));
        drop(socket);
        assert!(!path.exists(), "socket file removed on drop");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replaces_a_stale_socket_but_never_another_file() {
        let dir = scratch("stale");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("control.sock");
        // A socket whose listener is gone (a daemon killed with SIGKILL).
        drop(UnixListener::bind(&path).unwrap());
        let (tx, rx) = mpsc::channel();
        echo_main(rx);
        let socket = ControlSocket::open(&path, tx, Box::new(|| {})).unwrap();
        drop(socket);

        let file = dir.join("not-a-socket");
        std::fs::write(&file, b"keep me").unwrap();
        let (tx, _rx) = mpsc::channel();
        assert!(matches!(
            ControlSocket::open(&file, tx, Box::new(|| {})),
            Err(ControlError::NotASocket(_))
        ));
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn oversized_request_lines_are_refused_without_buffering_them() {
        let dir = scratch("long");
        let path = dir.join("control.sock");
        let (tx, rx) = mpsc::channel();
        echo_main(rx);
        let _socket = ControlSocket::open(&path, tx, Box::new(|| {})).unwrap();
        let mut client = UnixStream::connect(&path).unwrap();
        let long = vec![b'x'; MAX_REQUEST_LINE + 10];
        // The server answers after MAX_REQUEST_LINE + 1 bytes; the rest may not be read.
        let _ = client.write_all(&long);
        let mut answer = String::new();
        BufReader::new(&client).read_line(&mut answer).unwrap();
        let r: Response = serde_json::from_str(&answer).unwrap();
        assert!(!r.ok);
        assert!(r.error.unwrap().contains("longer than"));
        drop(_socket);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Refusal of other uids is tested against the binary (tests/control.rs), where a client
    /// can run under another uid.
    #[test]
    fn our_own_uid_is_admitted() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(admit(&a).is_ok());
    }
}
