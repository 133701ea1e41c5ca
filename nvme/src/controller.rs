//! Controller state shared by one admin queue and its I/O queues, which may run on different
//! reactor threads: registers (CC/CSTS), features, asynchronous events, the error log, SMART
//! counters and keep-alive.
//!
//! The admin path takes the `state` mutex. The I/O path only reads atomics (`ready`,
//! `terminated`, `enable_epoch`, `activity`, `volatile_write_cache`) and bumps its own
//! per-queue counters.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::abort::AbortBoard;
use crate::command::TerminateReason;
use crate::limits::Limits;
use crate::peer::PeerInfo;
use crate::reservation::{NoticeKind, NotificationLog};
use crate::spec::{aen_type, cc, csts, lid};
use crate::wire::identify::ctrl_bits;
use crate::wire::log::{ChangedNsList, ErrorLogEntry, ReservationNotificationLog};

/// Admin queue entries accepted at Connect (the Linux host uses 32, NVME_AQ_DEPTH); also the
/// ASQSZ reported in discovery log entries.
pub const ADMIN_QUEUE_ENTRIES: u16 = 32;
/// Outstanding Asynchronous Event Requests allowed (AERL is 0's based).
pub const MAX_AERS: usize = 4;
/// Error log entries kept (ELPE is 0's based).
pub const ERROR_LOG_ENTRIES: usize = 64;
/// Keep-alive granularity advertised in KAS, in 100 ms units (1 s, like nvmet: KATO is
/// rounded up to whole seconds).
pub const KAS_100MS: u16 = 10;

/// Asynchronous events nvmfd raises (NVMe Base 2.0 §5.2, Figure 148/151).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// Notice, Namespace Attribute Changed; the host reads log 04h.
    NamespaceAttributeChanged,
    /// Notice, Discovery Log Page Change; the host reads log 70h.
    DiscoveryLogChanged,
    /// Notice, Asymmetric Namespace Access Change; the host reads log 0Ch.
    AnaChange,
    /// I/O Command Specific Status, Reservation Log Page Available; the host reads log 80h.
    ReservationLogAvailable,
}

impl AsyncEvent {
    /// Completion DW0: event type (2:0), event information (15:8), log page (23:16).
    pub fn dw0(self) -> u32 {
        let (etype, info, lid) = match self {
            Self::NamespaceAttributeChanged => (aen_type::NOTICE, 0x00, lid::CHANGED_NS),
            Self::DiscoveryLogChanged => (aen_type::NOTICE, 0xf0, lid::DISCOVERY),
            Self::AnaChange => (aen_type::NOTICE, 0x03, lid::ANA),
            Self::ReservationLogAvailable => (
                aen_type::IO_COMMAND_SPECIFIC,
                0x00,
                lid::RESERVATION_NOTIFICATION,
            ),
        };
        etype | info << 8 | (lid as u32) << 16
    }

    /// The Asynchronous Event Configuration (feature 0Bh) bit enabling this event. None:
    /// reservation notifications are enabled per type and namespace by the Reservation
    /// Notification Mask feature (82h) instead.
    pub fn config_bit(self) -> Option<u32> {
        match self {
            Self::NamespaceAttributeChanged => Some(ctrl_bits::OAES_NS_ATTR),
            Self::DiscoveryLogChanged => Some(ctrl_bits::OAES_DISC_LOG_CHANGE),
            Self::AnaChange => Some(ctrl_bits::OAES_ANA_CHANGE),
            Self::ReservationLogAvailable => None,
        }
    }

    /// This event's bit in the set of raised events whose log page was not read yet.
    fn mask_bit(self) -> u32 {
        1 << self as u32
    }
}

/// Feature values (NVMe Base 2.0 §5.27.1).
#[derive(Debug, Clone, Copy)]
pub struct Features {
    pub arbitration: u32,
    pub power_state: u32,
    /// Temperature thresholds for the composite sensor (Kelvin): over, under.
    pub temp_over: u16,
    pub temp_under: u16,
    /// Asynchronous Event Configuration (0Bh).
    pub async_event_config: u32,
    /// Error Recovery (05h): TLER in 100 ms units. DULBE is not supported (no namespace
    /// reports deallocated blocks as errors, NSFEAT bit 2 is clear), so it is always 0.
    pub tler: u16,
    /// Timestamp (0Eh): milliseconds since the epoch the host set, and when.
    pub timestamp: Option<(u64, Instant)>,
}

impl Features {
    /// Default over-temperature threshold: 0, like every temperature nvmfd reports. A
    /// fabrics target has no temperature sensor: Identify reports WCTEMP and CCTEMP 0 (no
    /// threshold reported, NVMe Base 2.0 §5.17.2.1) and SMART a Composite Temperature of 0, as
    /// Linux nvmet does; the threshold is kept for the host (the feature is mandatory) but
    /// nothing is ever compared with it.
    pub const DEFAULT_TEMP_OVER: u16 = 0;
}

/// Admin-path state behind the controller mutex.
#[derive(Debug)]
pub struct ControllerState {
    pub cc: u32,
    pub csts: u32,
    /// Keep alive timeout in ms (rounded up to whole seconds); 0 = disabled.
    pub kato_ms: u32,
    ka_deadline: Option<Instant>,
    pub features: Features,
    /// I/O queues granted by Set Features Number of Queues (default: the target maximum).
    pub io_queues_granted: u16,
    /// Connected I/O queues and the reactor serving each (`PeerInfo::reactor`).
    io_queues: BTreeMap<u16, Option<u16>>,
    events: VecDeque<AsyncEvent>,
    /// Events (`AsyncEvent::mask_bit`) raised whose log page was not read yet.
    aen_masked: u32,
    /// Reservation Notification log pages and mask (log 80h, feature 82h).
    pub resv_log: NotificationLog,
    error_log: VecDeque<ErrorLogEntry>,
    error_count: u64,
    changed_ns: BTreeSet<u32>,
}

impl ControllerState {
    pub fn io_queues_connected(&self) -> bool {
        !self.io_queues.is_empty()
    }
}

/// Parameters from the admin Connect.
#[derive(Debug, Clone)]
pub struct ControllerParams {
    /// NQN of the subsystem the controller belongs to (for log lines).
    pub subnqn: String,
    /// A discovery controller (NVMe Base 2.0 §3.1.3.3)?
    pub discovery: bool,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// The admin queue's connection (discovery reports `peer.local` for wildcard ports).
    pub peer: PeerInfo,
    pub limits: Limits,
    /// KATO from Connect in ms (0 = disabled).
    pub kato_ms: u32,
    /// A namespace of the subsystem has a volatile write cache (`Capabilities`), as the
    /// subsystem stands when the controller is created: its VWC (see `vwc_present`).
    pub volatile_cache: bool,
}

#[derive(Debug)]
pub struct Controller {
    pub cntlid: u16,
    /// The subsystem's NQN; the subsystem itself is held by the queues (`fabrics::Association`)
    /// and holds its controllers, so the controller needs no link back.
    pub subnqn: String,
    discovery: bool,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub peer: PeerInfo,
    pub limits: Limits,
    /// CSTS.RDY, read on the I/O path.
    ready: AtomicBool,
    /// Bumped on every CC.EN 1 → 0; I/O queues created under an older epoch are gone.
    enable_epoch: AtomicU32,
    terminated: AtomicU8,
    /// Set by every command (traffic based keep alive, CTRATT.TBKAS); consumed by `poll`.
    activity: AtomicBool,
    /// Identify Controller VWC bit 0, fixed for the controller's life (`vwc_present`).
    vwc_present: bool,
    /// Feature 06h WCE; when off, every write is made durable (FUA).
    volatile_write_cache: AtomicBool,
    state: Mutex<ControllerState>,
    /// Abort requests from the admin queue to the I/O queues (`abort`).
    pub aborts: AbortBoard,
}

/// Rounds a KATO in ms up to whole seconds, as nvmet does (NVMe Base 2.0 §5.27.1.12 lets the
/// controller round to its KAS granularity).
pub fn round_kato_ms(kato_ms: u32) -> u32 {
    kato_ms.div_ceil(1000).saturating_mul(1000)
}

impl Controller {
    pub fn new(cntlid: u16, p: ControllerParams) -> Self {
        let aec = if p.discovery {
            ctrl_bits::OAES_DISC_LOG_CHANGE
        } else {
            ctrl_bits::OAES_NS_ATTR | ctrl_bits::OAES_ANA_CHANGE
        };
        let granted = p.limits.max_io_queues;
        Self {
            cntlid,
            subnqn: p.subnqn,
            discovery: p.discovery,
            hostnqn: p.hostnqn,
            hostid: p.hostid,
            peer: p.peer,
            limits: p.limits,
            ready: AtomicBool::new(false),
            enable_epoch: AtomicU32::new(0),
            terminated: AtomicU8::new(0),
            activity: AtomicBool::new(false),
            vwc_present: p.volatile_cache && !p.discovery,
            volatile_write_cache: AtomicBool::new(true),
            state: Mutex::new(ControllerState {
                cc: 0,
                csts: 0,
                kato_ms: round_kato_ms(p.kato_ms),
                ka_deadline: None,
                features: Features {
                    arbitration: 0,
                    power_state: 0,
                    temp_over: Features::DEFAULT_TEMP_OVER,
                    temp_under: 0,
                    async_event_config: aec,
                    tler: 0,
                    timestamp: None,
                },
                io_queues_granted: granted,
                io_queues: BTreeMap::new(),
                events: VecDeque::new(),
                aen_masked: 0,
                resv_log: NotificationLog::default(),
                error_log: VecDeque::new(),
                error_count: 0,
                changed_ns: BTreeSet::new(),
            }),
            aborts: AbortBoard::default(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, ControllerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_discovery(&self) -> bool {
        self.discovery
    }

    /// CSTS.RDY (I/O path).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn enable_epoch(&self) -> u32 {
        self.enable_epoch.load(Ordering::Acquire)
    }

    pub fn terminated(&self) -> Option<TerminateReason> {
        TerminateReason::from_code(self.terminated.load(Ordering::Acquire))
    }

    /// Ends the controller; the first reason wins.
    pub fn terminate(&self, reason: TerminateReason) {
        if self
            .terminated
            .compare_exchange(0, reason as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.ready.store(false, Ordering::Release);
            tracing::info!(
                subnqn = %self.subnqn,
                cntlid = self.cntlid,
                hostnqn = %self.hostnqn,
                peer = %self.peer.remote,
                ?reason,
                "controller terminated"
            );
        }
    }

    /// Any command counts as keep-alive traffic. Checked before storing so the cache line is
    /// only written once per keep-alive period, not once per command.
    pub fn note_activity(&self) {
        if !self.activity.load(Ordering::Relaxed) {
            self.activity.store(true, Ordering::Relaxed);
        }
    }

    /// Keep-alive timer: commands since the last check restart it; no command for KATO ends
    /// the controller (NVMe Base 2.0 §3.9.4, traffic based keep alive).
    pub fn check_keep_alive(&self, now: Instant) -> Option<TerminateReason> {
        if let Some(r) = self.terminated() {
            return Some(r);
        }
        let mut st = self.lock();
        if st.kato_ms == 0 {
            return None;
        }
        let kato = Duration::from_millis(st.kato_ms as u64);
        let active = self.activity.swap(false, Ordering::Relaxed);
        match st.ka_deadline {
            Some(deadline) if !active && now >= deadline => {
                drop(st);
                tracing::warn!(
                    subnqn = %self.subnqn,
                    cntlid = self.cntlid,
                    hostnqn = %self.hostnqn,
                    peer = %self.peer.remote,
                    "keep alive timeout expired"
                );
                self.terminate(TerminateReason::KeepAliveTimeout);
                self.terminated()
            }
            Some(_) if !active => None,
            _ => {
                st.ka_deadline = Some(now + kato);
                None
            }
        }
    }

    /// Set Features Keep Alive Timer: restarts the timer with the new value.
    pub fn set_kato(&self, kato_ms: u32) {
        let mut st = self.lock();
        st.kato_ms = round_kato_ms(kato_ms);
        st.ka_deadline = None;
    }

    /// Identify Controller VWC bit 0 (NVMe Base 2.0 §5.17.2.1): a volatile write cache is
    /// present, so the host sends Flush (§7.1) and FUA when it needs data durable; absent,
    /// it sends neither and counts every completed write as durable. Decided once, when the
    /// controller is created, because the host reads it once: Linux keeps `ctrl->vwc` from
    /// the Identify at controller setup (and so its block queue's write-cache and FUA flags)
    /// until the next reset. A reload that later adds a namespace with a cache to the
    /// subsystem does not change it; such a controller keeps its promise by writing with FUA
    /// (`volatile_write_cache`). Controllers created after the reload report the cache.
    pub fn vwc_present(&self) -> bool {
        self.vwc_present
    }

    /// Writes of this controller may complete from a volatile cache: VWC is present and the
    /// host left it enabled (Feature 06h). When false, every write must be durable when it
    /// completes, and the I/O path makes it FUA (a no-op for storage without a cache).
    pub fn volatile_write_cache(&self) -> bool {
        self.vwc_present && self.write_cache_enabled()
    }

    /// Feature 06h WCE, as the host set it (meaningful only when `vwc_present`).
    pub fn write_cache_enabled(&self) -> bool {
        self.volatile_write_cache.load(Ordering::Relaxed)
    }

    pub fn set_volatile_write_cache(&self, on: bool) {
        self.volatile_write_cache.store(on, Ordering::Relaxed);
    }

    /// CAP (NVMe Base 2.0 Figure 36): MQES, CQR, TO = 7.5 s, CSS = NVM; MPSMIN = MPSMAX = 4 KiB.
    pub fn cap(&self) -> u64 {
        let mqes = (self.limits.max_queue_size - 1) as u64;
        mqes | 1 << 16 | 15 << 24 | 1 << 37
    }

    /// Property Set CC: the enable and shutdown handshakes (NVMe Base 2.0 §3.6.1, §3.6.2).
    pub fn write_cc(&self, value: u32) {
        let mut st = self.lock();
        let old = st.cc;
        let new = value & cc::WRITABLE;
        st.cc = new;
        let was_enabled = old & cc::EN != 0;
        let enable = new & cc::EN != 0;
        if enable && !was_enabled {
            let field = |shift: u32, bits: u32| (new >> shift) & ((1 << bits) - 1);
            let valid = field(cc::IOSQES_SHIFT, 4) == 6
                && field(cc::IOCQES_SHIFT, 4) == 4
                && field(cc::MPS_SHIFT, 4) == 0
                && field(cc::AMS_SHIFT, 3) == 0
                && field(cc::CSS_SHIFT, 3) == 0;
            if valid {
                st.csts = csts::RDY;
                self.ready.store(true, Ordering::Release);
            } else {
                // Unsupported queue entry sizes / page size / arbitration / command set.
                st.csts = csts::CFS;
                tracing::warn!(
                    cntlid = self.cntlid,
                    cc = new,
                    "CC enable with unsupported settings"
                );
            }
        } else if !enable && was_enabled {
            // Controller reset: I/O queues are deleted (NVMe Base 2.0 §3.7.2).
            st.csts &= !(csts::RDY | csts::CFS);
            st.resv_log.reset();
            self.ready.store(false, Ordering::Release);
            self.enable_epoch.fetch_add(1, Ordering::AcqRel);
        }
        let shn = (new >> cc::SHN_SHIFT) & 0x3;
        let old_shn = (old >> cc::SHN_SHIFT) & 0x3;
        if shn != 0 && old_shn == 0 {
            // Nothing is cached in the controller: writes are on their way to the backend,
            // and the host flushes before shutting down, so shutdown completes at once.
            st.csts |= csts::SHST_COMPLETE;
        } else if shn == 0 {
            st.csts &= !csts::SHST_COMPLETE;
        }
    }

    /// Raises an asynchronous event if enabled and not masked (NVMe Base 2.0 §5.2: an event
    /// type stays masked until its log page is read).
    pub fn raise_event(&self, event: AsyncEvent) {
        let mut st = self.lock();
        Self::raise_locked(&mut st, event);
    }

    fn raise_locked(st: &mut ControllerState, event: AsyncEvent) {
        let enabled = match event.config_bit() {
            Some(bit) => st.features.async_event_config & bit != 0,
            None => true,
        };
        if !enabled || st.aen_masked & event.mask_bit() != 0 {
            return;
        }
        st.aen_masked |= event.mask_bit();
        st.events.push_back(event);
    }

    /// A reservation notification for this controller's host on namespace `nsid`: a log page
    /// and the Reservation Log Page Available event, unless feature 82h masks it.
    pub fn reservation_notice(&self, kind: NoticeKind, nsid: u32) {
        let mut st = self.lock();
        if st.resv_log.add(kind, nsid) {
            Self::raise_locked(&mut st, AsyncEvent::ReservationLogAvailable);
        }
    }

    /// Get Log Page 80h: the oldest reservation notification (removed when `consume`).
    pub fn read_reservation_log(&self, consume: bool) -> ReservationNotificationLog {
        self.lock().resv_log.read(consume)
    }

    /// Oldest pending event, for an outstanding Asynchronous Event Request.
    pub fn take_event(&self) -> Option<AsyncEvent> {
        self.lock().events.pop_front()
    }

    /// Unmask an event type: its log page was read without Retain Asynchronous Event.
    pub fn clear_event_mask(&self, event: AsyncEvent) {
        self.lock().aen_masked &= !event.mask_bit();
    }

    /// Records namespaces whose attributes changed (log 04h) and raises the event.
    pub fn namespaces_changed(&self, nsids: impl Iterator<Item = u32>) {
        {
            let mut st = self.lock();
            for nsid in nsids {
                // Past 1024 entries the page only says "overflow"; stop growing.
                if st.changed_ns.len() <= ChangedNsList::MAX_ENTRIES {
                    st.changed_ns.insert(nsid);
                }
            }
        }
        self.raise_event(AsyncEvent::NamespaceAttributeChanged);
    }

    /// Reads and clears the changed namespace list (Figure 210).
    pub fn take_changed_ns(&self) -> ChangedNsList {
        let mut st = self.lock();
        ChangedNsList {
            nsids: std::mem::take(&mut st.changed_ns).into_iter().collect(),
        }
    }

    /// Adds an entry to the error log ring (newest first in log 01h).
    pub fn record_error(&self, mut entry: ErrorLogEntry) {
        let mut st = self.lock();
        st.error_count += 1;
        entry.error_count = st.error_count;
        if st.error_log.len() == ERROR_LOG_ENTRIES {
            st.error_log.pop_back();
        }
        st.error_log.push_front(entry);
    }

    pub fn error_log(&self) -> Vec<ErrorLogEntry> {
        self.lock().error_log.iter().copied().collect()
    }

    /// I/O Connect: the queue must be within the granted count and not connected already.
    /// `reactor`: the reactor serving the queue's connection (`PeerInfo::reactor`).
    pub fn register_io_queue(&self, qid: u16, reactor: Option<u16>) -> Result<(), IoQueueRefusal> {
        let mut st = self.lock();
        if qid == 0 || qid > st.io_queues_granted {
            return Err(IoQueueRefusal::QidOutOfRange {
                granted: st.io_queues_granted,
            });
        }
        if st.io_queues.contains_key(&qid) {
            return Err(IoQueueRefusal::AlreadyConnected);
        }
        st.io_queues.insert(qid, reactor);
        Ok(())
    }

    pub fn unregister_io_queue(&self, qid: u16) {
        self.lock().io_queues.remove(&qid);
    }

    /// I/O queues connected right now (the control socket's controller listing).
    pub fn io_queue_count(&self) -> usize {
        self.lock().io_queues.len()
    }

    /// Every connected queue (admin queue 0 first) with the reactor serving it.
    pub fn queue_reactors(&self) -> Vec<(u16, Option<u16>)> {
        let st = self.lock();
        std::iter::once((0, self.peer.reactor))
            .chain(st.io_queues.iter().map(|(&qid, &r)| (qid, r)))
            .collect()
    }

    /// Error Information Log Entries over the life of this controller (SMART, Figure 207).
    pub fn error_log_entries(&self) -> u64 {
        self.lock().error_count
    }

    /// CSTS as the host reads it.
    pub fn csts(&self) -> u32 {
        self.lock().csts
    }
}

/// Why an I/O queue Connect was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoQueueRefusal {
    QidOutOfRange { granted: u16 },
    AlreadyConnected,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kato_rounds_up_to_whole_seconds() {
        assert_eq!(round_kato_ms(0), 0);
        assert_eq!(round_kato_ms(1), 1000);
        assert_eq!(round_kato_ms(5000), 5000);
        assert_eq!(round_kato_ms(5001), 6000);
        assert_eq!(
            round_kato_ms(u32::MAX),
            u32::MAX,
            "saturates instead of wrapping"
        );
    }

    #[test]
    fn async_event_completion_dwords() {
        // Figure 151: type 2 (notice) in bits 2:0, information in 15:8, log page in 23:16.
        assert_eq!(AsyncEvent::NamespaceAttributeChanged.dw0(), 0x0004_0002);
        assert_eq!(AsyncEvent::DiscoveryLogChanged.dw0(), 0x0070_f002);
        // ANA change: information 03h, log page 0Ch.
        assert_eq!(AsyncEvent::AnaChange.dw0(), 0x000c_0302);
        // Type 6h (I/O command specific status), information 00h (Reservation Log Page
        // Available), log page 80h.
        assert_eq!(AsyncEvent::ReservationLogAvailable.dw0(), 0x0080_0006);
    }

    #[test]
    fn terminate_reason_codes_round_trip() {
        for r in [
            TerminateReason::KeepAliveTimeout,
            TerminateReason::AdminQueueGone,
            TerminateReason::ControllerReset,
            TerminateReason::HostDisconnect,
            TerminateReason::SubsystemRemoved,
            TerminateReason::HostRemoved,
        ] {
            assert_eq!(TerminateReason::from_code(r as u8), Some(r));
        }
        assert_eq!(TerminateReason::from_code(0), None);
    }
}
