//! The metrics endpoint: `GET /metrics` over HTTP/1.x on `[metrics] listen`, served by a
//! thread of its own (never a reactor), one connection at a time with short timeouts — a
//! scraper is one trusted client polling every few seconds, not a web server's load.
//!
//! The body is OpenMetrics 1.0 text when the request's `Accept` prefers
//! `application/openmetrics-text` (as Prometheus does), and the Prometheus text format 0.0.4
//! otherwise — for `text/plain`, `*/*` or no `Accept` at all (curl, promtool), as the
//! Prometheus client libraries answer.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::{Format, Sources};

/// A request line and headers longer than this are refused.
const MAX_HEAD: usize = 8 * 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the accept loop looks at the stop flag (a connection wakes it at once).
const STOP_POLL_MS: u16 = 200;

/// The running endpoint; dropping it stops the thread.
#[derive(Debug)]
pub struct Endpoint {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    pub fn start(addr: SocketAddr, sources: Sources) -> io::Result<Endpoint> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        // Non-blocking accept behind poll, so that the thread notices a stop request.
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || serve(listener, sources, &thread_stop))?;
        tracing::info!(%addr, "metrics endpoint listening (GET /metrics)");
        Ok(Endpoint {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: TcpListener, sources: Sources, stop: &AtomicBool) {
    let mut body = String::new();
    while !stop.load(Ordering::Acquire) {
        // Waiting in poll rather than sleeping between accept attempts: a scrape is answered
        // as soon as it connects.
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(STOP_POLL_MS)).unwrap_or(0) == 0 {
            continue;
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, &sources, &mut body) {
                    tracing::debug!(%peer, error = %e, "metrics request failed");
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                // EMFILE and friends: back off instead of spinning on a readable listener.
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                std::thread::sleep(Duration::from_millis(STOP_POLL_MS.into()));
            }
        }
    }
}

/// Reads one request head and answers it (the body written into `body`); the connection is
/// closed afterwards.
fn answer(stream: TcpStream, sources: &Sources, body: &mut String) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?.take(MAX_HEAD as u64));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut accept = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("accept") {
                // Several Accept headers are one list (RFC 9110 §5.3).
                if !accept.is_empty() {
                    accept.push(',');
                }
                accept.push_str(value.trim());
            }
        }
    }
    let (status, content_type) = route(&request_line, &accept, sources, body);
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    out.write_all(body.as_bytes())?;
    out.flush()
}

/// The status and content type of the answer to `request_line`, its body in `body`.
fn route(
    request_line: &str,
    accept: &str,
    sources: &Sources,
    body: &mut String,
) -> (&'static str, &'static str) {
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next(), parts.next());
    let path = target.map(|t| t.split('?').next().unwrap_or(t));
    let (status, content_type, text) = match (method, path) {
        (Some("GET"), Some("/metrics")) => {
            let format = negotiate(accept);
            match sources.encode_into(format, body) {
                Ok(()) => return ("200 OK", format.content_type()),
                Err(_) => (
                    "500 Internal Server Error",
                    "text/plain",
                    "encoding failed\n",
                ),
            }
        }
        (Some("GET"), Some(_)) => ("404 Not Found", "text/plain", "try /metrics\n"),
        _ => ("405 Method Not Allowed", "text/plain", "only GET\n"),
    };
    body.clear();
    body.push_str(text);
    (status, content_type)
}

/// The format an `Accept` value asks for: OpenMetrics when `application/openmetrics-text`
/// has the highest quality among the types offered (the first of equals wins), the text
/// format otherwise.
pub fn negotiate(accept: &str) -> Format {
    let mut best: Option<(f32, Format)> = None;
    for range in accept.split(',') {
        let mut params = range.split(';').map(str::trim);
        let media = params.next().unwrap_or("").to_ascii_lowercase();
        let mut q = 1.0f32;
        for p in params {
            if let Some(v) = p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")) {
                q = v.trim().parse().unwrap_or(0.0);
            }
        }
        let format = match media.as_str() {
            "application/openmetrics-text" => Format::OpenMetrics,
            "text/plain" | "text/*" | "*/*" => Format::Text,
            _ => continue,
        };
        let better = match best {
            None => true,
            Some((b, _)) => q > b,
        };
        if q > 0.0 && better {
            best = Some((q, format));
        }
    }
    best.map_or(Format::Text, |(_, f)| f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_picks_the_format() {
        // What Prometheus 2.x sends.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(prometheus), Format::OpenMetrics);
        assert_eq!(negotiate("text/plain;version=0.0.4"), Format::Text);
        assert_eq!(
            negotiate("text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5"),
            Format::Text
        );
        assert_eq!(
            negotiate("application/openmetrics-text"),
            Format::OpenMetrics
        );
        assert_eq!(negotiate("*/*"), Format::Text);
        assert_eq!(negotiate(""), Format::Text);
        assert_eq!(negotiate("application/openmetrics-text;q=0"), Format::Text);
    }
}
