//! One round of a gateway: renew what it holds, survey the group, act on the machine's
//! decisions. Generic over the [`Store`] (RADOS in the daemon, an in-memory cluster in tests)
//! and the clock, so that the order of the RADOS steps — above all "blocklist the old owner,
//! then lock, then report Optimized" — is the same code in both.

use std::sync::Mutex;

use super::lease::{Fault, Instance, Machine, Ms, Record, Step, Survey};

/// The RADOS objects of a gateway group, as one gateway instance sees them.
pub trait Store {
    /// Take or renew this instance's membership (a shared lock with the lease).
    fn renew_member(&self) -> Result<(), Fault>;
    /// Members and, per group, lock holder and owner record.
    fn survey(&self, groups: &[u32]) -> Result<Survey, Fault>;
    /// Renew `group`'s lock, failing with [`Fault::Lost`] when it is no longer ours.
    fn renew(&self, group: u32) -> Result<(), Fault>;
    /// Fence the client instance at `addr`; returns once the OSDs refuse it.
    fn blocklist(&self, addr: &str) -> Result<(), Fault>;
    /// Remove `holder`'s lock on `group` (gone already is fine).
    fn break_lock(&self, group: u32, holder: &Instance) -> Result<(), Fault>;
    /// Take (or renew) `group`'s lock.
    fn lock(&self, group: u32) -> Result<(), Fault>;
    fn write_record(&self, group: u32, record: &Record) -> Result<(), Fault>;
    fn unlock(&self, group: u32) -> Result<(), Fault>;
}

/// Monotonic milliseconds.
pub trait Clock {
    fn now(&self) -> Ms;
}

/// What a round reports besides the steps: renewal latencies.
pub trait Sink {
    /// An ANA change or [`Step::Fenced`] (never a RADOS step).
    fn step(&mut self, step: Step);
    /// One lease renewal took `ms`.
    fn renew_latency(&mut self, ms: Ms);
}

fn lock(machine: &Mutex<Machine>) -> std::sync::MutexGuard<'_, Machine> {
    // A panic while holding it cannot leave the machine half-updated in a way that matters
    // more than stopping: every method finishes its own update before returning.
    machine.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends ANA changes and [`Step::Fenced`] to the sink, keeps RADOS steps for the round.
fn dispatch(steps: Vec<Step>, pending: &mut Vec<Step>, sink: &mut impl Sink) {
    for step in steps {
        match step {
            Step::Ana { .. } | Step::Fenced => sink.step(step),
            other => pending.push(other),
        }
    }
}

/// Runs one round. Returns `false` once the instance is fenced (the driver then stops).
pub fn round(
    machine: &Mutex<Machine>,
    store: &impl Store,
    clock: &impl Clock,
    sink: &mut impl Sink,
) -> bool {
    let mut pending: Vec<Step> = Vec::new();
    // Renewals first: they keep the leases this gateway serves under.
    let r = store.renew_member();
    let steps = lock(machine).member_renewed(clock.now(), r);
    dispatch(steps, &mut pending, sink);
    let held = lock(machine).held();
    for group in held {
        let sent = clock.now();
        let r = store.renew(group);
        let done = clock.now();
        if r.is_ok() {
            sink.renew_latency(done.saturating_sub(sent));
        } else if let Err(e) = &r {
            tracing::warn!(group, error = %e, "ANA group lease renewal failed");
        }
        let steps = lock(machine).renewed(done, group, sent, r);
        dispatch(steps, &mut pending, sink);
    }
    if lock(machine).is_fenced() {
        return false;
    }

    let groups = lock(machine).settings().groups.clone();
    match store.survey(&groups) {
        Ok(s) => {
            let steps = lock(machine).survey(clock.now(), s);
            dispatch(steps, &mut pending, sink);
        }
        Err(Fault::Blocklisted) => {
            let steps = lock(machine).fence();
            dispatch(steps, &mut pending, sink);
        }
        Err(e) => tracing::warn!(error = %e, "gateway group survey failed; retrying next round"),
    }

    let me = lock(machine).me().clone();
    for step in std::mem::take(&mut pending) {
        match step {
            Step::Takeover {
                group,
                fence,
                stale,
            } => {
                let (sent, r) = take(store, clock, &me, group, fence.as_ref(), stale.as_ref());
                let steps = lock(machine).took(clock.now(), group, sent, fence, r);
                dispatch(steps, &mut pending, sink);
            }
            Step::Release { group } => {
                let r = store
                    .write_record(group, &Record::Released)
                    .and_then(|()| store.unlock(group));
                if let Err(e) = &r {
                    tracing::warn!(group, error = %e, "handing back: unlock failed; the lease expires instead");
                }
                let steps = lock(machine).released(clock.now(), group, r);
                dispatch(steps, &mut pending, sink);
            }
            Step::Ana { .. } | Step::Fenced => {}
        }
    }
    // Outcomes only produce ANA changes (sent) or a fence (sent); nothing is left for later.
    debug_assert!(pending.is_empty());
    !lock(machine).is_fenced()
}

/// The takeover sequence: fence first, then break the stale lock, then lock and record.
/// Returns when the lock request was sent (the lease counts from there) and the outcome.
fn take(
    store: &impl Store,
    clock: &impl Clock,
    me: &Instance,
    group: u32,
    fence: Option<&Instance>,
    stale: Option<&Instance>,
) -> (Ms, Result<(), Fault>) {
    if let Some(old) = fence {
        tracing::warn!(group, owner = %old, "fencing the previous owner of the ANA group (blocklisting its RADOS client) before taking it over");
        if let Err(e) = store.blocklist(&old.addr) {
            tracing::error!(group, owner = %old, error = %e, "blocklisting failed; not taking the group");
            return (clock.now(), Err(e));
        }
    }
    if let Some(old) = stale {
        if let Err(e) = store.break_lock(group, old) {
            return (clock.now(), Err(e));
        }
    }
    let sent = clock.now();
    let r = store
        .lock(group)
        .and_then(|()| store.write_record(group, &Record::Owner(me.clone())));
    (sent, r)
}
