//! The main thread while serving: signals, control requests, gateway polls, the watchdog,
//! and the stop.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::error::ServeError;
use super::signals::SignalsGuard;
use super::Server;
use crate::reactor;

/// A reactor that has not ticked (every 100 ms) for this long is considered wedged.
const STALL_AFTER: Duration = Duration::from_secs(2);
/// Extra time, beyond the reactors' own drain bound, before the main thread gives up on them.
const JOIN_GRACE: Duration = Duration::from_secs(1);
/// Main-thread poll period when no watchdog is configured.
const IDLE_POLL: Duration = Duration::from_secs(1);

impl Server {
    /// Serves until SIGTERM/SIGINT; returns after a graceful stop.
    pub fn serve(mut self, signals_installed: SignalsGuard) -> Result<(), ServeError> {
        let signals = signals_installed.0;
        let control = self.open_control(&signals);
        if let Some(gateway) = &mut self.gateway {
            let wake = signals.waker().map_err(ServeError::Signals)?;
            if let Err(e) = gateway.start(wake) {
                drop(control);
                self.stop_reactors();
                return Err(ServeError::Gateway(e));
            }
        }
        self.notifier.ready(&self.status_line());
        tracing::info!("ready");
        let watchdog = self.notifier.watchdog_interval();
        let period = watchdog.unwrap_or(IDLE_POLL).min(IDLE_POLL);
        let mut last_beats: Vec<u64> = self.heartbeats();
        let mut advanced_at: Vec<Instant> = vec![Instant::now(); last_beats.len()];
        let mut last_ping = Instant::now();
        let mut last_status = Instant::now();
        loop {
            signals.wait(period);
            if signals.terminate.load(Ordering::Acquire) {
                break;
            }
            // A reactor only returns when told to stop: one that has ended on its own
            // (a panic) took its connections with it and serves nothing more. Exit with
            // a failure instead of running half-dead, so the service manager restarts us.
            if let Some(id) = self.threads.iter().position(|t| t.is_finished()) {
                tracing::error!(reactor = id, "reactor thread ended unexpectedly; stopping");
                self.notifier.stopping();
                drop(control);
                self.stop_reactors();
                return Err(ServeError::ReactorDied { id });
            }
            if signals.hangup.swap(false, Ordering::AcqRel) {
                let _ = self.reload();
            }
            if let Some(control) = &control {
                for call in crate::control::pending(&control.calls) {
                    let response = self.control_call(call.request, call.transient);
                    let _ = call.reply.send(response);
                }
            }
            if self.gateway_poll() {
                self.notifier.stopping();
                drop(control);
                self.stop_reactors();
                return Err(ServeError::Fenced);
            }
            // Storage resized underneath (RBD): republish and notify hosts (AEN).
            for (nqn, nsid) in self.target.refresh_capacities() {
                tracing::info!(subsystem = %nqn, nsid, "namespace capacity changed; hosts notified");
            }
            let now = Instant::now();
            let beats = self.heartbeats();
            for (id, (beat, last)) in beats.iter().zip(last_beats.iter_mut()).enumerate() {
                if beat != last {
                    *last = *beat;
                    advanced_at[id] = now;
                }
            }
            if let Some(interval) = watchdog {
                if now.duration_since(last_ping) >= interval {
                    last_ping = now;
                    // Ping only while every reactor is still ticking: a wedged reactor must
                    // make systemd restart us rather than be papered over.
                    let stalled: Vec<usize> = advanced_at
                        .iter()
                        .enumerate()
                        .filter(|(_, at)| now.duration_since(**at) > STALL_AFTER)
                        .map(|(id, _)| id)
                        .collect();
                    if stalled.is_empty() {
                        self.notifier.watchdog();
                    } else {
                        tracing::error!(?stalled, "reactor(s) stalled; withholding watchdog ping");
                    }
                }
            }
            if now.duration_since(last_status) >= Duration::from_secs(10) {
                last_status = now;
                self.notifier.status(&self.status_line());
            }
        }
        tracing::info!("stopping on signal");
        self.notifier.stopping();
        // No more control requests: the socket file goes before the listeners do.
        drop(control);
        self.stop_reactors();
        // After the reactors: no I/O in flight when the groups are handed back.
        if let Some(gateway) = &mut self.gateway {
            gateway.stop();
        }
        if let Some(health) = self.health.take() {
            health.shut_down();
        }
        tracing::info!("stopped");
        Ok(())
    }

    /// Applies the gateway group's ANA changes (hosts get the ANA change AEN); `true` when
    /// this gateway is fenced and must stop.
    fn gateway_poll(&mut self) -> bool {
        let Some(gateway) = &mut self.gateway else {
            return false;
        };
        let poll = gateway.poll();
        if poll.changed {
            match self.apply_config(self.config.clone()) {
                Ok(summary) => tracing::info!(%summary, "gateway group: ANA states applied"),
                Err(e) => tracing::error!("gateway group: ANA states not applied: {e}"),
            }
        }
        poll.fenced
    }

    fn heartbeats(&self) -> Vec<u64> {
        self.handles
            .iter()
            .map(|h| h.heartbeat.load(Ordering::Relaxed))
            .collect()
    }

    pub(super) fn stop_reactors(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        for handle in &self.handles {
            handle.wake();
        }
        // Reactors bound their own drain (DRAIN_TIMEOUT); a reactor stuck in a system call
        // must still not keep the process alive past this.
        let deadline = Instant::now() + reactor::DRAIN_TIMEOUT + JOIN_GRACE;
        while Instant::now() < deadline && !self.threads.iter().all(|t| t.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
        }
        for thread in self.threads.drain(..) {
            if !thread.is_finished() {
                tracing::error!(thread = ?thread.thread().name(), "reactor did not stop in time; exiting without it");
                continue;
            }
            if thread.join().is_err() {
                tracing::error!("a reactor thread panicked");
            }
        }
    }
}
