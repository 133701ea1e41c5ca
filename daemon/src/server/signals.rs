//! SIGTERM/SIGINT/SIGHUP as the main loop sees them.

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use super::error::ServeError;

/// Signals, as seen by the main loop: flags set by the handlers plus a self-pipe to wake
/// `poll`. A second SIGTERM/SIGINT while stopping exits at once (handled in the handler by
/// `register_conditional_shutdown`, so it works even if the main thread is stuck).
pub(super) struct Signals {
    pub(super) terminate: Arc<AtomicBool>,
    pub(super) hangup: Arc<AtomicBool>,
    wake: UnixStream,
    /// The write end of the self-pipe, for the control socket to wake `wait`.
    waker: UnixStream,
}

impl Signals {
    fn install() -> io::Result<Signals> {
        let terminate = Arc::new(AtomicBool::new(false));
        let hangup = Arc::new(AtomicBool::new(false));
        let (wake, writer) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        for signal in [SIGTERM, SIGINT] {
            // Order matters: the conditional exit checks the flag before this signal sets it.
            signal_hook::flag::register_conditional_shutdown(signal, 1, Arc::clone(&terminate))?;
            signal_hook::flag::register(signal, Arc::clone(&terminate))?;
        }
        signal_hook::flag::register(SIGHUP, Arc::clone(&hangup))?;
        for signal in [SIGTERM, SIGINT, SIGHUP] {
            signal_hook::low_level::pipe::register(signal, writer.try_clone()?)?;
        }
        Ok(Signals {
            terminate,
            hangup,
            wake,
            waker: writer,
        })
    }

    /// A function that wakes `wait` (a full pipe already means "awake": errors are moot).
    pub(super) fn waker(&self) -> io::Result<crate::control::Waker> {
        let writer = self.waker.try_clone()?;
        Ok(Box::new(move || {
            let _ = std::io::Write::write(&mut &writer, &[1]);
        }))
    }

    /// Sleeps until a signal or `timeout`.
    pub(super) fn wait(&self, timeout: Duration) {
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.wake.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::from(millis));
        let mut sink = [0u8; 64];
        while matches!((&self.wake).read(&mut sink), Ok(n) if n > 0) {}
    }
}

/// Signal handlers are installed before anything is bound, so that a SIGTERM during start-up
/// is not lost (it is acted upon as soon as the main loop runs).
pub struct SignalsGuard(pub(super) Signals);

pub fn install_signals() -> Result<SignalsGuard, ServeError> {
    Signals::install()
        .map(SignalsGuard)
        .map_err(ServeError::Signals)
}
