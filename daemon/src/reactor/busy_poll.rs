//! Busy polling (`[rdma] busy_poll_us`): while RDMA connections are active the reactor polls
//! their completion queues on every turn and waits in epoll with a zero timeout, instead of
//! sleeping until a completion channel fires. After `busy_poll_us` without any work it
//! re-arms the CQs and sleeps again, so an idle daemon costs no CPU.
//!
//! Entering costs one channel event (the CQ was armed); while polling, channel events no
//! longer re-arm the CQ, so completions raise no further events. Leaving re-arms every CQ and
//! drains it once more: a completion that landed between the last poll and the re-arm raises
//! no event, and would otherwise wait for the next one.

use std::time::{Duration, Instant};

use transport::conn::ConnStatus;

use super::Reactor;

/// The polling window and whether the reactor is in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusyPoll {
    window: Duration,
    /// Polling until then (extended by every turn that did work); `None` = sleeping mode.
    until: Option<Instant>,
    /// For the summary line at exit: how often polling started, and the completions that
    /// polling (rather than a channel event) handled.
    starts: u64,
    polled: u64,
}

/// What the connections must be told after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    None,
    /// Polling starts: channel events stop re-arming the CQs.
    Start,
    /// Polling ends: re-arm and drain every CQ, then sleep.
    Stop,
}

impl BusyPoll {
    pub fn new(window_us: u32) -> Self {
        Self {
            window: Duration::from_micros(window_us.into()),
            until: None,
            starts: 0,
            polled: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        !self.window.is_zero()
    }

    pub fn polling(&self) -> bool {
        self.until.is_some()
    }

    /// The epoll timeout of the next wait: zero while polling.
    pub fn timeout_ms(&self, sleeping_ms: u16) -> u16 {
        if self.polling() {
            0
        } else {
            sleeping_ms
        }
    }

    /// After one reactor turn: `pollable` = connections with a CQ exist; `active` = the turn
    /// handled readiness events or polled completions.
    pub fn after_turn(&mut self, now: Instant, pollable: bool, active: bool) -> Switch {
        if !self.enabled() {
            return Switch::None;
        }
        let was_polling = self.polling();
        if pollable && active {
            self.until = Some(now + self.window);
            if was_polling {
                return Switch::None;
            }
            self.starts += 1;
            return Switch::Start;
        }
        match self.until {
            Some(until) if !pollable || now >= until => {
                self.until = None;
                Switch::Stop
            }
            _ => Switch::None,
        }
    }
}

impl Reactor {
    /// One line when the reactor stops: evidence that polling, not the channel, did the work.
    pub(super) fn busy_poll_summary(&self) {
        if self.busy.enabled() {
            tracing::info!(
                reactor = self.id,
                window_us = self.busy.window.as_micros() as u64,
                starts = self.busy.starts,
                polled_completions = self.busy.polled,
                "RDMA busy polling"
            );
        }
    }

    /// One busy-poll turn (after the ready events of the turn were handled): polls every
    /// pollable connection while polling, or once after a wake-up, then switches modes.
    pub(super) fn busy_poll_turn(&mut self, had_events: bool) {
        if !self.busy.enabled() || !(self.busy.polling() || had_events) {
            return;
        }
        let mut pollable = false;
        let mut polled = 0;
        for index in 0..self.slots.len() as u32 {
            let live = matches!(self.slots.get(index as usize), Some(Some(slot)) if !slot.closed);
            if !live {
                continue;
            }
            let mut result = None;
            let status = self.with_conn(index, |conn, io| {
                result = conn.busy_poll(io);
                result.map_or(ConnStatus::Open, |(status, _)| status)
            });
            if let Some((_, n)) = result {
                pollable = true;
                polled += n;
                self.after_callback(index, status);
            }
        }
        self.busy.polled += polled as u64;
        let switch = self
            .busy
            .after_turn(Instant::now(), pollable, had_events || polled > 0);
        if switch == Switch::None {
            return;
        }
        let on = switch == Switch::Start;
        tracing::trace!(reactor = self.id, on, "RDMA busy polling");
        for index in 0..self.slots.len() as u32 {
            let live = matches!(self.slots.get(index as usize), Some(Some(slot)) if !slot.closed);
            if live {
                let status = self.with_conn(index, |conn, io| conn.set_busy_poll(on, io));
                self.after_callback(index, status);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn disabled_never_polls() {
        let mut b = BusyPoll::new(0);
        let t = Instant::now();
        assert!(!b.enabled());
        assert_eq!(b.after_turn(t, true, true), Switch::None);
        assert_eq!(b.timeout_ms(100), 100);
    }

    #[test]
    fn work_starts_polling_and_idleness_past_the_window_stops_it() {
        let mut b = BusyPoll::new(50);
        let t = Instant::now();
        assert_eq!(b.after_turn(t, true, false), Switch::None, "idle: sleep");
        assert_eq!(b.timeout_ms(100), 100);
        assert_eq!(b.after_turn(t, true, true), Switch::Start);
        assert_eq!(b.timeout_ms(100), 0, "epoll does not sleep while polling");
        // Work keeps extending the window.
        assert_eq!(b.after_turn(t + 40 * US, true, true), Switch::None);
        assert_eq!(b.after_turn(t + 80 * US, true, false), Switch::None);
        assert!(b.polling());
        assert_eq!(b.after_turn(t + 90 * US, true, false), Switch::Stop);
        assert!(!b.polling());
        assert_eq!(b.timeout_ms(100), 100);
        assert_eq!(b.after_turn(t + 200 * US, true, false), Switch::None);
    }

    #[test]
    fn no_pollable_connection_means_no_polling() {
        let mut b = BusyPoll::new(1000);
        let t = Instant::now();
        // TCP traffic alone does not make the reactor spin.
        assert_eq!(b.after_turn(t, false, true), Switch::None);
        assert_eq!(b.after_turn(t, true, true), Switch::Start);
        // The last RDMA connection went away: stop at once.
        assert_eq!(b.after_turn(t + US, false, true), Switch::Stop);
        assert!(!b.polling());
    }
}
