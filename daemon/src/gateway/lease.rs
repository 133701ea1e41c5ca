//! The lease/fence state machine of one gateway of a gateway group, sans I/O.
//!
//! Time and RADOS observations go in, steps come out; the machine never sleeps or calls Ceph
//! (quinn-proto's shape). [`super::round`] drives it against RADOS (or, in tests, against an
//! in-memory store with a virtual clock).
//!
//! The rules, each enforced here:
//! * A gateway reports Optimized for an ANA group only after it took the group's RADOS lock
//!   (and wrote itself as the group's owner record), and only until its local lease deadline:
//!   the send time of its last successful renewal plus the lease, minus one renew interval
//!   (the OSD starts the lease when it processes the request, later than the send, so the
//!   local deadline always falls before the OSD's). Time is monotonic; a jump (a stall, a
//!   SIGSTOP) only brings the deadline closer.
//! * Taking a group whose previous owner did not hand it back (its lock expired, or is held by
//!   a client instance that is no longer a member) first fences that owner: its client address
//!   is blocklisted before the lock is taken, so a paused owner that wakes up can write nothing.
//! * A gateway that finds itself blocklisted reports every group Inaccessible and stops
//!   ([`Step::Fenced`]); it rejoins as a new client instance after a restart.
//! * Groups go to their preferred gateway once it has been a member for the failback hold
//!   time; otherwise they stay with a live holder; unowned groups are spread over the live
//!   gateways. Every gateway computes the same assignment from the same survey.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use nvme::ana::AnaState;

/// Monotonic milliseconds (CLOCK_MONOTONIC in the daemon, a virtual clock in tests).
pub type Ms = u64;

/// One RADOS client instance of a gateway, as the OSD knows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instance {
    /// The gateway's configured id (the lock cookie).
    pub gateway: String,
    /// `client.<instance id>`.
    pub client: String,
    /// `IP:port/nonce`, what a blocklist entry names.
    pub addr: String,
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} at {})", self.gateway, self.client, self.addr)
    }
}

/// The durable owner record of a group (the content of its lock object): who owned it last,
/// unless that owner handed it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    None,
    Owner(Instance),
    Released,
}

/// Why a RADOS step failed, as far as the machine cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// This client instance is blocklisted (fenced): nothing it does can succeed any more.
    Blocklisted,
    /// The lock is held by someone else.
    Busy,
    /// The lock is not held by us any more (expired or broken).
    Lost,
    /// Anything else (timeouts, connection trouble), by errno.
    Other(i32),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Blocklisted => f.write_str("blocklisted"),
            Fault::Busy => f.write_str("held by another gateway"),
            Fault::Lost => f.write_str("lock no longer held"),
            Fault::Other(e) => write!(f, "{}", std::io::Error::from_raw_os_error(*e)),
        }
    }
}

/// What one survey of the group's RADOS objects saw.
#[derive(Debug, Clone, Default)]
pub struct Survey {
    /// Member instances (holders of the shared membership lock), expired ones excluded.
    pub members: Vec<Instance>,
    /// Per managed group: the lock holder (if any) and the owner record. A group missing here
    /// could not be read this round and is left alone.
    pub groups: BTreeMap<u32, (Option<Instance>, Record)>,
}

/// Why an ANA group changed state here (journal lines and metrics labels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Took a group nobody held; `fenced` names the previous owner blocklisted first.
    Takeover { fenced: Option<Instance> },
    /// The group's preferred gateway is back: handing it over (still holding the lock while
    /// the I/O already sent to Ceph drains).
    Handback { to: String },
    /// Gave up during a handback because this gateway is the group's owner again.
    HandbackCancelled,
    /// The local lease deadline passed without a successful renewal.
    LeaseExpired,
    /// A renewal said the lock is no longer ours, or the survey shows another holder.
    LockLost,
    /// This client instance is blocklisted.
    Fenced,
}

impl Reason {
    /// Short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Takeover { fenced: Some(_) } => "takeover-fenced",
            Reason::Takeover { fenced: None } => "takeover",
            Reason::Handback { .. } => "handback",
            Reason::HandbackCancelled => "handback-cancelled",
            Reason::LeaseExpired => "lease-expired",
            Reason::LockLost => "lock-lost",
            Reason::Fenced => "fenced",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Takeover { fenced: Some(i) } => {
                write!(f, "took over after fencing the previous owner {i}")
            }
            Reason::Takeover { fenced: None } => {
                f.write_str("took over (the previous owner handed it back, or none)")
            }
            Reason::Handback { to } => write!(f, "handing back to preferred gateway {to}"),
            Reason::HandbackCancelled => f.write_str("handback cancelled: owner again"),
            Reason::LeaseExpired => f.write_str("lease not renewed before the local deadline"),
            Reason::LockLost => f.write_str("lock no longer held by this gateway"),
            Reason::Fenced => f.write_str("this gateway's RADOS client is blocklisted"),
        }
    }
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Report `state` for `group` on every port of this gateway.
    Ana {
        group: u32,
        state: AnaState,
        reason: Reason,
    },
    /// Take `group`: blocklist `fence` (if any), break `stale` holder's lock (if any), take
    /// the lock, write this instance as owner record, then report [`Machine::took`].
    Takeover {
        group: u32,
        fence: Option<Instance>,
        stale: Option<Instance>,
    },
    /// Hand `group` back: write the Released record, unlock, report [`Machine::released`].
    Release { group: u32 },
    /// This instance is fenced: stop (a restart rejoins as a new instance).
    Fenced,
}

/// The machine's fixed settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Gateway ids in configuration order (tie-break for spreading groups).
    pub members: Vec<String>,
    /// Managed ANA groups.
    pub groups: Vec<u32>,
    /// Group → preferred gateway.
    pub preferred: BTreeMap<u32, String>,
    pub lease: Ms,
    pub renew: Ms,
    pub failback_hold: Ms,
    pub handover_drain: Ms,
    /// Reported for groups not owned here (Inaccessible or Non-Optimized).
    pub standby: AnaState,
}

/// This gateway's role for one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Standby,
    /// A takeover step is out.
    Taking,
    /// Optimized until `deadline`.
    Owner {
        deadline: Ms,
        renewed: Ms,
    },
    /// Handing back: standby reported, lock still held (and renewed) until `until`.
    Draining {
        deadline: Ms,
        renewed: Ms,
        until: Ms,
    },
}

impl Role {
    /// Whether this gateway holds the group's lock (and must renew it).
    pub fn holds(self) -> bool {
        matches!(self, Role::Owner { .. } | Role::Draining { .. })
    }
}

/// Counters the daemon exports (ownership changes by reason are counted by the driver from
/// the steps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub takeovers: u64,
    pub fences: u64,
    pub handbacks: u64,
    pub losses: u64,
}

/// One member instance in [`View`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberView {
    pub gateway: String,
    pub client: String,
    pub addr: String,
    /// Since this gateway first saw the instance as a member.
    pub up_ms: Option<Ms>,
}

/// One ANA group in [`View`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupView {
    pub group: u32,
    pub preferred: Option<String>,
    /// The lock holder's gateway id and client instance, as last surveyed.
    pub owner: Option<String>,
    pub owner_client: Option<String>,
    /// Since this gateway first saw that holder holding it.
    pub held_ms: Option<Ms>,
    /// This gateway's role: standby, taking, owner, handing-back.
    pub role: String,
    /// The ANA state this gateway reports for the group.
    pub state: String,
    /// Since this gateway's last successful renewal was sent (when it holds the lock).
    pub lease_age_ms: Option<Ms>,
}

/// A gateway's view of its group (`nvmfd ctl gateways`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct View {
    pub gateway: String,
    pub client: String,
    pub addr: String,
    pub fenced: bool,
    pub survey_age_ms: Option<Ms>,
    pub members: Vec<MemberView>,
    pub groups: Vec<GroupView>,
    pub takeovers: u64,
    pub fences: u64,
    pub handbacks: u64,
    pub losses: u64,
}

/// The lease/fence state machine of one gateway.
#[derive(Debug)]
pub struct Machine {
    settings: Settings,
    /// This gateway's client instance (set once connected).
    me: Instance,
    roles: BTreeMap<u32, Role>,
    /// Member client → when this gateway first saw it in a survey.
    first_seen: BTreeMap<String, Ms>,
    /// Latest survey (for views).
    last_survey: Option<(Ms, Survey)>,
    /// Group → (holder client, first seen holding) for lease ages in views.
    held_since: BTreeMap<u32, (String, Ms)>,
    fenced: bool,
    now: Ms,
    counts: Counts,
}

impl Machine {
    /// A machine for instance `me`; every group starts in standby (the driver reports the
    /// standby state for all of them before serving).
    pub fn new(settings: Settings, me: Instance, now: Ms) -> Machine {
        let roles = settings
            .groups
            .iter()
            .map(|&g| (g, Role::Standby))
            .collect();
        Machine {
            settings,
            me,
            roles,
            first_seen: BTreeMap::new(),
            last_survey: None,
            held_since: BTreeMap::new(),
            fenced: false,
            now,
            counts: Counts::default(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn me(&self) -> &Instance {
        &self.me
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    #[cfg(test)]
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// What `nvmfd ctl gateways` shows: this gateway, the members and the groups as of the
    /// latest survey, with ages at `now`.
    pub fn view(&self, now: Ms) -> View {
        let now = now.max(self.now);
        let (surveyed, members, holders) = match &self.last_survey {
            Some((at, s)) => (
                Some(now.saturating_sub(*at)),
                s.members.clone(),
                s.groups.clone(),
            ),
            None => (None, Vec::new(), BTreeMap::new()),
        };
        View {
            gateway: self.me.gateway.clone(),
            client: self.me.client.clone(),
            addr: self.me.addr.clone(),
            fenced: self.fenced,
            survey_age_ms: surveyed,
            members: members
                .into_iter()
                .map(|m| MemberView {
                    up_ms: self
                        .first_seen
                        .get(&m.client)
                        .map(|&t| now.saturating_sub(t)),
                    gateway: m.gateway,
                    client: m.client,
                    addr: m.addr,
                })
                .collect(),
            groups: self
                .settings
                .groups
                .iter()
                .map(|&g| {
                    let holder = holders.get(&g).and_then(|(h, _)| h.clone());
                    let role = self.roles.get(&g).copied().unwrap_or(Role::Standby);
                    GroupView {
                        group: g,
                        preferred: self.settings.preferred.get(&g).cloned(),
                        owner: holder.as_ref().map(|h| h.gateway.clone()),
                        owner_client: holder.as_ref().map(|h| h.client.clone()),
                        held_ms: self
                            .held_since
                            .get(&g)
                            .filter(|(c, _)| holder.as_ref().is_some_and(|h| h.client == *c))
                            .map(|(_, t)| now.saturating_sub(*t)),
                        role: match role {
                            Role::Standby => "standby",
                            Role::Taking => "taking",
                            Role::Owner { .. } => "owner",
                            Role::Draining { .. } => "handing-back",
                        }
                        .to_owned(),
                        state: self.ana_state(g).name().to_owned(),
                        lease_age_ms: match role {
                            Role::Owner { renewed, .. } | Role::Draining { renewed, .. } => {
                                Some(now.saturating_sub(renewed))
                            }
                            _ => None,
                        },
                    }
                })
                .collect(),
            takeovers: self.counts.takeovers,
            fences: self.counts.fences,
            handbacks: self.counts.handbacks,
            losses: self.counts.losses,
        }
    }

    /// The state to report for `group` now.
    pub fn ana_state(&self, group: u32) -> AnaState {
        match self.roles.get(&group) {
            Some(Role::Owner { .. }) if !self.fenced => AnaState::Optimized,
            _ if self.fenced => AnaState::Inaccessible,
            _ => self.settings.standby,
        }
    }

    /// Groups whose lock this gateway must renew this round.
    pub fn held(&self) -> Vec<u32> {
        if self.fenced {
            return Vec::new();
        }
        self.roles
            .iter()
            .filter(|(_, r)| r.holds())
            .map(|(&g, _)| g)
            .collect()
    }

    /// Monotonic time as the machine last saw it; an earlier `now` is taken as no progress.
    fn advance(&mut self, now: Ms) -> Ms {
        self.now = self.now.max(now);
        self.now
    }

    fn deadline_after(&self, sent: Ms) -> Ms {
        (sent + self.settings.lease).saturating_sub(self.settings.renew)
    }

    fn set(&mut self, group: u32, role: Role, reason: Reason, out: &mut Vec<Step>) {
        let before = self.ana_state(group);
        self.roles.insert(group, role);
        let after = self.ana_state(group);
        if before != after {
            out.push(Step::Ana {
                group,
                state: after,
                reason,
            });
        }
    }

    /// The clock alone: an owner whose local lease deadline passed goes to standby at once.
    /// Called often (a clock thread) and before every decision, independently of RADOS calls
    /// that may hang.
    pub fn tick(&mut self, now: Ms) -> Vec<Step> {
        let now = self.advance(now);
        let mut out = Vec::new();
        if self.fenced {
            return out;
        }
        let expired: Vec<u32> = self
            .roles
            .iter()
            .filter(|(_, r)| match r {
                Role::Owner { deadline, .. } | Role::Draining { deadline, .. } => now >= *deadline,
                _ => false,
            })
            .map(|(&g, _)| g)
            .collect();
        for group in expired {
            self.counts.losses += 1;
            self.set(group, Role::Standby, Reason::LeaseExpired, &mut out);
        }
        out
    }

    /// Blocklisted: every group Inaccessible, then stop.
    pub fn fence(&mut self) -> Vec<Step> {
        let mut out = Vec::new();
        if self.fenced {
            return out;
        }
        let before: Vec<(u32, AnaState)> = self
            .settings
            .groups
            .iter()
            .map(|&g| (g, self.ana_state(g)))
            .collect();
        self.fenced = true;
        for (group, state) in before {
            self.roles.insert(group, Role::Standby);
            if state != AnaState::Inaccessible {
                out.push(Step::Ana {
                    group,
                    state: AnaState::Inaccessible,
                    reason: Reason::Fenced,
                });
            }
        }
        out.push(Step::Fenced);
        out
    }

    /// Outcome of renewing `group`'s lock, sent at `sent`.
    pub fn renewed(
        &mut self,
        now: Ms,
        group: u32,
        sent: Ms,
        result: Result<(), Fault>,
    ) -> Vec<Step> {
        self.advance(now);
        let mut out = match result {
            Err(Fault::Blocklisted) => return self.fence(),
            Ok(()) => {
                let fresh = self.deadline_after(sent);
                if let Some(
                    Role::Owner { deadline, renewed }
                    | Role::Draining {
                        deadline, renewed, ..
                    },
                ) = self.roles.get_mut(&group)
                {
                    *deadline = (*deadline).max(fresh);
                    *renewed = (*renewed).max(sent);
                }
                Vec::new()
            }
            Err(Fault::Lost) => {
                let mut out = Vec::new();
                if self.roles.get(&group).is_some_and(|r| r.holds()) {
                    self.counts.losses += 1;
                    self.set(group, Role::Standby, Reason::LockLost, &mut out);
                }
                out
            }
            // Transient: the deadline decides.
            Err(_) => Vec::new(),
        };
        out.extend(self.tick(now));
        out
    }

    /// Outcome of renewing this gateway's membership.
    pub fn member_renewed(&mut self, now: Ms, result: Result<(), Fault>) -> Vec<Step> {
        self.advance(now);
        match result {
            Err(Fault::Blocklisted) => self.fence(),
            _ => self.tick(now),
        }
    }

    /// A survey taken at `now`: decide takeovers, handbacks and releases.
    pub fn survey(&mut self, now: Ms, survey: Survey) -> Vec<Step> {
        let now = self.advance(now);
        let mut out = self.tick(now);
        if self.fenced {
            return out;
        }
        // Membership: first-seen times per client instance (a restart is a new instance, so
        // the failback hold starts again).
        let listed: BTreeSet<&str> = survey.members.iter().map(|m| m.client.as_str()).collect();
        self.first_seen.retain(|c, _| listed.contains(c.as_str()));
        for m in &survey.members {
            self.first_seen.entry(m.client.clone()).or_insert(now);
        }
        for (&g, (holder, _)) in &survey.groups {
            match holder {
                Some(h) => {
                    let same = self.held_since.get(&g).is_some_and(|(c, _)| *c == h.client);
                    if !same {
                        self.held_since.insert(g, (h.client.clone(), now));
                    }
                }
                None => {
                    self.held_since.remove(&g);
                }
            }
        }
        let assignment = self.assign(now, &survey);
        let me = self.me.clone();
        let live_clients: BTreeSet<&str> = listed;
        for &group in &self.settings.groups.clone() {
            let Some((holder, record)) = survey.groups.get(&group) else {
                continue;
            };
            let target = assignment.get(&group).cloned().flatten();
            let role = self.roles[&group];
            let held_by_me = holder.as_ref().is_some_and(|h| h.client == me.client);
            match role {
                Role::Owner { deadline, renewed } => {
                    if !held_by_me {
                        self.counts.losses += 1;
                        self.set(group, Role::Standby, Reason::LockLost, &mut out);
                    } else if let Some(to) = target.filter(|t| *t != me.gateway) {
                        self.counts.handbacks += 1;
                        let until = now + self.settings.handover_drain;
                        let role = Role::Draining {
                            deadline,
                            renewed,
                            until,
                        };
                        self.set(group, role, Reason::Handback { to }, &mut out);
                    }
                }
                Role::Draining {
                    deadline,
                    renewed,
                    until,
                } => {
                    if !held_by_me {
                        self.set(group, Role::Standby, Reason::LockLost, &mut out);
                    } else if target.as_deref() == Some(me.gateway.as_str()) {
                        let role = Role::Owner { deadline, renewed };
                        self.set(group, role, Reason::HandbackCancelled, &mut out);
                    } else if now >= until {
                        out.push(Step::Release { group });
                    }
                }
                Role::Taking => {}
                Role::Standby => {
                    if target.as_deref() != Some(me.gateway.as_str()) {
                        continue;
                    }
                    // The owner to fence: whoever the record names, unless it handed the
                    // group back or is this very instance.
                    let recorded = match record {
                        Record::Owner(i) if i.client != me.client => Some(i.clone()),
                        _ => None,
                    };
                    let step = match holder {
                        None => Some(Step::Takeover {
                            group,
                            fence: recorded,
                            stale: None,
                        }),
                        // Ours already (a takeover that failed after locking): finish it.
                        Some(_) if held_by_me => Some(Step::Takeover {
                            group,
                            fence: recorded,
                            stale: None,
                        }),
                        // Held by an instance that is no longer a member: frozen or dead
                        // with its lease still running. Fence it, then break its lock.
                        Some(h) if !live_clients.contains(h.client.as_str()) => {
                            Some(Step::Takeover {
                                group,
                                fence: Some(h.clone()),
                                stale: Some(h.clone()),
                            })
                        }
                        // A live holder: it hands the group over (or dies) first.
                        Some(_) => None,
                    };
                    if let Some(step) = step {
                        self.roles.insert(group, Role::Taking);
                        out.push(step);
                    }
                }
            }
        }
        self.last_survey = Some((now, survey));
        out
    }

    /// Outcome of a [`Step::Takeover`]; `sent` is when the lock request went out.
    pub fn took(
        &mut self,
        now: Ms,
        group: u32,
        sent: Ms,
        fenced: Option<Instance>,
        result: Result<(), Fault>,
    ) -> Vec<Step> {
        let now = self.advance(now);
        if self.roles.get(&group) != Some(&Role::Taking) {
            return Vec::new();
        }
        match result {
            Err(Fault::Blocklisted) => self.fence(),
            Err(_) => {
                self.roles.insert(group, Role::Standby);
                Vec::new()
            }
            Ok(()) => {
                let deadline = self.deadline_after(sent);
                let mut out = Vec::new();
                if now >= deadline {
                    // Took too long: the lease is as good as gone. Standby; the next survey
                    // finds the lock still ours and takes it again with a fresh lease.
                    self.roles.insert(group, Role::Standby);
                    return out;
                }
                self.counts.takeovers += 1;
                if fenced.is_some() {
                    self.counts.fences += 1;
                }
                let role = Role::Owner {
                    deadline,
                    renewed: sent,
                };
                self.set(group, role, Reason::Takeover { fenced }, &mut out);
                out
            }
        }
    }

    /// Outcome of a [`Step::Release`]: the group is standby either way (an unlock that failed
    /// leaves a lock that expires, and the record says Released).
    pub fn released(&mut self, now: Ms, group: u32, result: Result<(), Fault>) -> Vec<Step> {
        self.advance(now);
        if let Err(Fault::Blocklisted) = result {
            return self.fence();
        }
        let mut out = Vec::new();
        if matches!(self.roles.get(&group), Some(Role::Draining { .. })) {
            self.set(group, Role::Standby, Reason::LockLost, &mut out);
        }
        out
    }

    /// Who should own each group, from `survey` alone (so that every gateway computes the
    /// same): the preferred gateway once it has been a member for the failback hold time
    /// (or when nobody holds the group); else a live holder; else the gateway with the
    /// fewest groups among those that have been members for a lease, ties in configuration
    /// order.
    fn assign(&self, now: Ms, survey: &Survey) -> BTreeMap<u32, Option<String>> {
        let live_clients: BTreeSet<&str> =
            survey.members.iter().map(|m| m.client.as_str()).collect();
        // Gateway → when its newest live instance was first seen.
        let mut up_since: BTreeMap<&str, Ms> = BTreeMap::new();
        for m in &survey.members {
            let seen = self.first_seen.get(&m.client).copied().unwrap_or(now);
            let e = up_since.entry(m.gateway.as_str()).or_insert(seen);
            *e = (*e).max(seen);
        }
        let stable = |g: &str| {
            up_since
                .get(g)
                .is_some_and(|&s| now.saturating_sub(s) >= self.settings.failback_hold)
        };
        let mut result: BTreeMap<u32, Option<String>> = BTreeMap::new();
        let mut load: BTreeMap<&str, usize> = up_since.keys().map(|&g| (g, 0)).collect();
        let live_holder = |g: u32| {
            survey
                .groups
                .get(&g)
                .and_then(|(h, _)| h.as_ref())
                .filter(|h| live_clients.contains(h.client.as_str()))
                .map(|h| h.gateway.clone())
        };
        for &g in &self.settings.groups {
            let preferred = self.settings.preferred.get(&g).map(String::as_str);
            let holder = live_holder(g);
            let choice = match (preferred, holder) {
                (Some(p), _) if stable(p) => Some(p.to_owned()),
                (_, Some(h)) => Some(h),
                (Some(p), None) if up_since.contains_key(p) => Some(p.to_owned()),
                _ => None,
            };
            if let Some(c) = &choice {
                if let Some(n) = load.get_mut(c.as_str()) {
                    *n += 1;
                }
            }
            result.insert(g, choice);
        }
        let order = |g: &str| {
            self.settings
                .members
                .iter()
                .position(|m| m == g)
                .unwrap_or(usize::MAX)
        };
        // Spreading only among gateways up for a lease at least: at a cold start every
        // gateway gets to register before groups are handed to whoever came first.
        let settled = |g: &str| {
            up_since
                .get(g)
                .is_some_and(|&s| now.saturating_sub(s) >= self.settings.lease)
        };
        for &g in &self.settings.groups {
            if result[&g].is_some() {
                continue;
            }
            let pick = load
                .iter()
                .filter(|(gw, _)| settled(gw))
                .min_by_key(|(gw, n)| (**n, order(gw), **gw))
                .map(|(gw, _)| gw.to_string());
            if let Some(p) = &pick {
                if let Some(n) = load.get_mut(p.as_str()) {
                    *n += 1;
                }
            }
            result.insert(g, pick);
        }
        result
    }
}

#[cfg(test)]
mod tests;
