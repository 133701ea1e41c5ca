//! The OpenMetrics endpoint: `GET /metrics` over HTTP/1.x on `[metrics] listen`, served by a
//! thread of its own (never a reactor), one connection at a time with short timeouts — a
//! scraper is one trusted client polling every few seconds, not a web server's load.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::Sources;

/// A request line and headers longer than this are refused.
const MAX_HEAD: usize = 8 * 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the accept loop looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
        // Non-blocking accept so that the thread notices a stop request.
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
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, &sources) {
                    tracing::debug!(%peer, error = %e, "metrics request failed");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(STOP_POLL),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                std::thread::sleep(STOP_POLL);
            }
        }
    }
}

/// Reads one request head and answers it; the connection is closed afterwards.
fn answer(stream: TcpStream, sources: &Sources) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?.take(MAX_HEAD as u64));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Headers are read and ignored, up to the blank line.
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
    }
    let (status, content_type, body) = route(&request_line, sources);
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    out.write_all(body.as_bytes())?;
    out.flush()
}

fn route(request_line: &str, sources: &Sources) -> (&'static str, &'static str, String) {
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next(), parts.next());
    let path = target.map(|t| t.split('?').next().unwrap_or(t));
    match (method, path) {
        (Some("GET"), Some("/metrics")) => match sources.encode() {
            Ok(body) => ("200 OK", CONTENT_TYPE, body),
            Err(_) => (
                "500 Internal Server Error",
                "text/plain",
                "encoding failed\n".into(),
            ),
        },
        (Some("GET"), Some(_)) => ("404 Not Found", "text/plain", "try /metrics\n".into()),
        _ => ("405 Method Not Allowed", "text/plain", "only GET\n".into()),
    }
}
