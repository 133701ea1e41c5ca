//! systemd service notification (`sd_notify(3)` protocol) without libsystemd.
//!
//! The protocol is one datagram of newline-separated `KEY=VALUE` assignments to the
//! `AF_UNIX` socket named by `$NOTIFY_SOCKET`: a filesystem path, or an abstract-namespace
//! name written with a leading `@`. With `Type=notify` systemd waits for `READY=1`; with
//! `WatchdogSec=` it expects `WATCHDOG=1` at least every `$WATCHDOG_USEC` microseconds.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Sends notifications to the service manager, or does nothing when not started by one.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
}

fn socket_address(name: &str) -> io::Result<SocketAddr> {
    match name.strip_prefix('@') {
        Some(abstract_name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(abstract_name.as_bytes())
        }
        None => SocketAddr::from_pathname(name),
    }
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET`, `$WATCHDOG_USEC` and `$WATCHDOG_PID` (the watchdog applies to
    /// us only if the PID is absent or ours, as in `sd_watchdog_enabled(3)`).
    pub fn from_env() -> io::Result<Notifier> {
        let socket = std::env::var("NOTIFY_SOCKET").ok();
        let watchdog_usec = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|v| v.parse::<u64>().ok());
        let for_us = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .map_or(true, |pid| pid == std::process::id());
        Self::new(
            socket.as_deref(),
            watchdog_usec.filter(|&u| u > 0 && for_us),
        )
    }

    /// `socket`: the `$NOTIFY_SOCKET` value; `watchdog_usec`: the watchdog period.
    pub fn new(socket: Option<&str>, watchdog_usec: Option<u64>) -> io::Result<Notifier> {
        let target = match socket.filter(|s| !s.is_empty()) {
            Some(name) => Some((UnixDatagram::unbound()?, socket_address(name)?)),
            None => None,
        };
        Ok(Notifier {
            watchdog: target
                .as_ref()
                .and(watchdog_usec)
                .map(Duration::from_micros),
            target,
        })
    }

    pub fn is_active(&self) -> bool {
        self.target.is_some()
    }

    /// How often to send `WATCHDOG=1`: half the period systemd enforces (its recommendation).
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|period| period / 2)
    }

    /// Sends `state` (e.g. `"READY=1\nSTATUS=serving"`). A failure is logged, never fatal: the
    /// target must keep serving even if the manager went away.
    pub fn notify(&self, state: &str) {
        if let Some((socket, address)) = &self.target {
            if let Err(e) = socket.send_to_addr(state.as_bytes(), address) {
                tracing::warn!(error = %e, "sd_notify failed");
            }
        }
    }

    pub fn ready(&self, status: &str) {
        self.notify(&format!(
            "READY=1\nSTATUS={status}\nMAINPID={}",
            std::process::id()
        ));
    }

    pub fn reloading(&self) {
        self.notify("RELOADING=1\nSTATUS=reloading configuration");
    }

    pub fn status(&self, status: &str) {
        self.notify(&format!("STATUS={status}"));
    }

    pub fn stopping(&self) {
        self.notify("STOPPING=1\nSTATUS=stopping");
    }

    pub fn watchdog(&self) {
        self.notify("WATCHDOG=1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(socket: &UnixDatagram) -> String {
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn sends_to_a_path_socket() {
        let dir = std::env::temp_dir().join(format!("nvmfd-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::new(path.to_str(), Some(4_000_000)).unwrap();
        assert!(notifier.is_active());
        assert_eq!(notifier.watchdog_interval(), Some(Duration::from_secs(2)));
        notifier.ready("serving 1 port");
        assert_eq!(
            receive(&listener),
            format!(
                "READY=1\nSTATUS=serving 1 port\nMAINPID={}",
                std::process::id()
            )
        );
        notifier.watchdog();
        assert_eq!(receive(&listener), "WATCHDOG=1");
        notifier.stopping();
        assert_eq!(receive(&listener), "STOPPING=1\nSTATUS=stopping");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sends_to_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("nvmfd-notify-test-{}", std::process::id());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&address).unwrap();
        let notifier = Notifier::new(Some(&format!("@{name}")), None).unwrap();
        assert_eq!(notifier.watchdog_interval(), None);
        notifier.status("reloaded");
        assert_eq!(receive(&listener), "STATUS=reloaded");
    }

    #[test]
    fn is_inert_without_a_socket() {
        let notifier = Notifier::new(None, Some(1_000_000)).unwrap();
        assert!(!notifier.is_active());
        // No socket means no watchdog either: nobody would be listening for the pings.
        assert_eq!(notifier.watchdog_interval(), None);
        notifier.ready("x");
    }
}
