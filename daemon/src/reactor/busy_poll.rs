//! Polling after work (`[global] poll_window_us`, and `[rdma] busy_poll_us`, the same
//! mechanism): a reactor that just handled traffic waits in epoll with a zero timeout — which
//! reports socket readiness without sleeping — and polls the completion queues of RDMA
//! connections on every turn, for a bounded window, instead of paying a sleep and a wake-up
//! per command. At QD1 the host's next command arrives one round trip after the response;
//! spinning through that gap saves the scheduler's wake-up latency. After a window without
//! work the reactor sleeps again, so an idle daemon costs no CPU.
//!
//! The window adapts to the traffic: it follows the gaps between turns that found work (an
//! exponentially weighted mean). While the gaps are within the configured window the reactor
//! polls for the whole window; as they grow past it polling pays less and less, and the window
//! shrinks linearly to zero at twice the configured window. A sleeping reactor still measures
//! the gaps, so the window comes back when traffic becomes dense again.
//!
//! RDMA: entering costs one channel event (the CQ was armed); while polling, channel events no
//! longer re-arm the CQ, so completions raise no further events. Leaving re-arms every CQ and
//! drains it once more: a completion that landed between the last poll and the re-arm raises
//! no event, and would otherwise wait for the next one.

use std::time::{Duration, Instant};

use transport::conn::ConnStatus;

use super::Reactor;

/// The polling window and whether the reactor is in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusyPoll {
    /// The configured (largest) window.
    max: Duration,
    /// The window after the next turn with work (adapted to the gaps).
    window: Duration,
    /// Mean gap between turns that found work.
    gap: Duration,
    /// The last turn that found work.
    last_active: Option<Instant>,
    /// Polling until then (extended by every turn that did work); `None` = sleeping mode.
    until: Option<Instant>,
    /// For the summary line at exit: how often polling started, the turns during polling
    /// that found work (each saved a sleep and a wake-up), and the completions that RDMA
    /// polling (rather than a channel event) handled.
    starts: u64,
    hits: u64,
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
        let max = Duration::from_micros(window_us.into());
        Self {
            max,
            window: max,
            gap: Duration::ZERO,
            last_active: None,
            until: None,
            starts: 0,
            hits: 0,
            polled: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        !self.max.is_zero()
    }

    pub fn polling(&self) -> bool {
        self.until.is_some()
    }

    /// The window the next turn with work opens.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The epoll timeout of the next wait: zero while polling.
    pub fn timeout_ms(&self, sleeping_ms: u16) -> u16 {
        if self.polling() {
            0
        } else {
            sleeping_ms
        }
    }

    /// A turn found work `gap` after the previous one: update the mean gap (a long pause
    /// counts as three times the window, so one pause does not switch polling off for long)
    /// and the window.
    fn adapt(&mut self, gap: Duration) {
        let gap = gap.min(3 * self.max);
        self.gap = (3 * self.gap + gap) / 4;
        // Full window while the mean gap fits in it, then down to zero at twice the window.
        self.window = if self.gap <= self.max {
            self.max
        } else {
            (2 * self.max).saturating_sub(self.gap)
        };
    }

    /// After one reactor turn: `live` = the reactor has connections; `active` = the turn
    /// handled readiness events or polled completions.
    pub fn after_turn(&mut self, now: Instant, live: bool, active: bool) -> Switch {
        if !self.enabled() {
            return Switch::None;
        }
        let was_polling = self.polling();
        if active {
            if let Some(last) = self.last_active {
                self.adapt(now.saturating_duration_since(last));
            }
            self.last_active = Some(now);
            if was_polling {
                self.hits += 1;
            }
        }
        if live && active && !self.window.is_zero() {
            self.until = Some(now + self.window);
            if was_polling {
                return Switch::None;
            }
            self.starts += 1;
            return Switch::Start;
        }
        match self.until {
            Some(until) if !live || active || now >= until => {
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
                window_us = self.busy.max.as_micros() as u64,
                last_window_us = self.busy.window().as_micros() as u64,
                starts = self.busy.starts,
                hits = self.busy.hits,
                polled_completions = self.busy.polled,
                "polling after work"
            );
        }
    }

    /// One polling turn (after the ready events of the turn were handled): polls every
    /// pollable (RDMA) connection while polling, or once after a wake-up, then switches modes.
    pub(super) fn busy_poll_turn(&mut self, had_events: bool) {
        if !self.busy.enabled() || !(self.busy.polling() || had_events) {
            return;
        }
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
                polled += n;
                self.after_callback(index, status);
            }
        }
        self.busy.polled += polled as u64;
        let live = self
            .handle
            .connections
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0;
        let switch = self
            .busy
            .after_turn(Instant::now(), live, had_events || polled > 0);
        if switch == Switch::None {
            return;
        }
        let on = switch == Switch::Start;
        tracing::trace!(reactor = self.id, on, "polling after work");
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
    fn no_connection_means_no_polling() {
        let mut b = BusyPoll::new(1000);
        let t = Instant::now();
        // A wake-up with no connection (a listener, the control eventfd) does not spin.
        assert_eq!(b.after_turn(t, false, true), Switch::None);
        assert_eq!(b.after_turn(t, true, true), Switch::Start);
        // The last connection went away: stop at once.
        assert_eq!(b.after_turn(t + US, false, true), Switch::Stop);
        assert!(!b.polling());
    }

    #[test]
    fn the_window_shrinks_to_zero_as_gaps_grow_and_comes_back() {
        let mut b = BusyPoll::new(50);
        let mut t = Instant::now();
        // Dense traffic (QD1 round trips of 20 µs): the full window.
        for _ in 0..10 {
            b.after_turn(t, true, true);
            t += 20 * US;
        }
        assert_eq!(b.window(), 50 * US);
        // Sparse traffic (a command every 5 ms): polling cannot catch the next one; the
        // window goes to zero and the reactor sleeps right after each command.
        for _ in 0..20 {
            t += 5000 * US;
            b.after_turn(t, true, true);
        }
        assert_eq!(b.window(), Duration::ZERO);
        assert!(!b.polling());
        assert_eq!(b.timeout_ms(100), 100);
        // Dense again: the gaps measured while sleeping bring the window back.
        let mut started = false;
        for _ in 0..20 {
            t += 20 * US;
            started |= b.after_turn(t, true, true) == Switch::Start;
        }
        assert!(started);
        assert_eq!(b.window(), 50 * US);
    }

    #[test]
    fn one_pause_does_not_switch_polling_off() {
        let mut b = BusyPoll::new(50);
        let mut t = Instant::now();
        for _ in 0..10 {
            b.after_turn(t, true, true);
            t += 10 * US;
        }
        // Ten seconds of silence count as twice the window.
        t += Duration::from_secs(10);
        b.after_turn(t, true, true);
        assert!(b.window() > 25 * US, "window {:?}", b.window());
        assert!(b.polling());
    }
}
