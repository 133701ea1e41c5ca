//! Reservations (NVMe Base 2.0 §8.19; commands NVMe Base 2.0 §7.5–7.8): the sans-I/O state of
//! one namespace, its commands' rules and the conflict table applied to I/O.
//!
//! A registrant is a host, keyed by its 128-bit Host Identifier (Connect data HOSTID): two
//! controllers of one host, or one host through TCP and RDMA, share one registration.
//!
//! Persist Through Power Loss (§8.19.10): with a state file (`[global] state_dir`), a state
//! whose PTPL is set is written durably on every change (temporary file, fsync, rename, fsync
//! of the directory) before the command completes, and read back when the namespace is opened.
//! Without a state file PTPL is not offered. Those changes run on one persistence thread
//! ([`offload`]), not on the reactor that received the command: the reactor parks the command
//! like a submitted backend op and completes it when the thread posts its tag.
//!
//! Reservation notifications (§8.19.5–8.19.7): each command returns the [`Notice`]s it causes
//! (which host is told what); the subsystem hands them to that host's controllers, each of
//! which keeps its own queue of Reservation Notification log pages ([`NotificationLog`], log
//! 80h) and raises the "Reservation Log Page Available" event. Preempt and Abort preempts as
//! Preempt does, and completes only once the writes in flight on the namespace have drained
//! (`nvm::reservations::preempts_with_abort`): the preempted hosts' writes may complete, but none after it.
//!
//! Where the state lives is a [`Store`] ([`store`]): the PTPL state file, or the RADOS object a
//! gateway group shares (docs/gateway-reservations.md). With a shared store every command
//! reads the stored state, applies these rules and writes the result only if nobody wrote in
//! between (else it reads again and re-applies); I/O checks use the cached copy, which a
//! change's publication refreshes on every gateway before the command completes.

pub mod store;

pub use store::{FileStore, OpenStore, SharedStores, Store, StoreError, Version};

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};

use codec::{coded_enum, DecodeError, Reader, Writer};
use storage::ExternalCompletions;

use crate::command::Completion;
use crate::spec::nvm_opcode;
use crate::spec::resv::{
    ACQUIRE_ACQUIRE, ACQUIRE_PREEMPT, ACQUIRE_PREEMPT_ABORT, CPTPL_CLEAR, CPTPL_NO_CHANGE,
    CPTPL_SET, EXT_ENTRY_SIZE, EXT_HEADER_SIZE, IEKEY, NOTICE_REGISTRATION_PREEMPTED,
    NOTICE_RESERVATION_PREEMPTED, NOTICE_RESERVATION_RELEASED, NOTIFICATION_MASK_BITS, RCSTS_HOLDS,
    REGISTER_REGISTER, REGISTER_REPLACE, REGISTER_UNREGISTER, RELEASE_CLEAR, RELEASE_RELEASE,
    REPORT_EDS,
};
use crate::spec::status::Status;
use crate::spec::CNTLID_DYNAMIC;
use crate::wire::log::ReservationNotificationLog;
use crate::wire::Sqe;

pub type HostId = [u8; 16];

coded_enum! {
    /// Reservation types (NVMe Base 2.0 Figure 334 "Reservation Type Encoding").
    pub enum ResvType: u8, from_raw {
        WriteExclusive = 1,
        ExclusiveAccess = 2,
        WriteExclusiveRegistrantsOnly = 3,
        ExclusiveAccessRegistrantsOnly = 4,
        WriteExclusiveAllRegistrants = 5,
        ExclusiveAccessAllRegistrants = 6,
    }
}

impl ResvType {
    pub const ALL: [ResvType; 6] = [
        ResvType::WriteExclusive,
        ResvType::ExclusiveAccess,
        ResvType::WriteExclusiveRegistrantsOnly,
        ResvType::ExclusiveAccessRegistrantsOnly,
        ResvType::WriteExclusiveAllRegistrants,
        ResvType::ExclusiveAccessAllRegistrants,
    ];

    /// All-registrants types: every registrant is a reservation holder (§8.19.1).
    fn all_registrants(self) -> bool {
        matches!(
            self,
            ResvType::WriteExclusiveAllRegistrants | ResvType::ExclusiveAccessAllRegistrants
        )
    }

    /// Releasing a reservation of this type tells the other registrants (§8.19.6: every type
    /// but Write Exclusive and Exclusive Access, whose registrants gain nothing from it).
    fn release_notifies(self) -> bool {
        !matches!(self, ResvType::WriteExclusive | ResvType::ExclusiveAccess)
    }
}

coded_enum! {
    /// Reservation notification types (the Reservation Notification log page type);
    /// `from_code` gives `None` for an empty or reserved code.
    pub enum NoticeKind: u8, from_code {
        RegistrationPreempted = NOTICE_REGISTRATION_PREEMPTED,
        ReservationReleased = NOTICE_RESERVATION_RELEASED,
        ReservationPreempted = NOTICE_RESERVATION_PREEMPTED,
    }
}

impl NoticeKind {
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Its bit in the Reservation Notification Mask feature (82h): REGPRE is bit 1, RESREL
    /// bit 2, RESPRE bit 3, i.e. the bit numbered like the type.
    fn mask_bit(self) -> u32 {
        1 << self.code()
    }
}

/// A notification a reservation command causes: every controller of `host` is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notice {
    pub host: HostId,
    pub kind: NoticeKind,
}

/// Who is asking, relative to the reservation (the columns of NVMe Base 2.0 Figure 333).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Holder,
    Registrant,
    NonRegistrant,
}

/// The command groups of NVMe Base 2.0 Figure 333 (NVM Command Set 1.0 §5.2 places each
/// command: Read and Compare read; Write, Write Zeroes, Dataset Management and Flush write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl Access {
    /// The group of an NVM I/O opcode; `None` for commands reservations do not restrict.
    pub fn of_opcode(opcode: u8) -> Option<Self> {
        match opcode {
            nvm_opcode::READ | nvm_opcode::COMPARE => Some(Access::Read),
            nvm_opcode::WRITE
            | nvm_opcode::WRITE_ZEROES
            | nvm_opcode::DATASET_MANAGEMENT
            | nvm_opcode::FLUSH => Some(Access::Write),
            _ => None,
        }
    }
}

/// NVMe Base 2.0 Figure 333: is `access` by a host in `role` allowed under `rtype`?
pub fn allowed(rtype: ResvType, role: Role, access: Access) -> bool {
    use ResvType::*;
    match (role, access) {
        (Role::Holder, _) => true,
        // Write Exclusive variants leave reads open to everyone.
        (_, Access::Read)
            if matches!(
                rtype,
                WriteExclusive | WriteExclusiveRegistrantsOnly | WriteExclusiveAllRegistrants
            ) =>
        {
            true
        }
        // Registrants-only and all-registrants types admit every registrant.
        (Role::Registrant, _) => !matches!(rtype, WriteExclusive | ExclusiveAccess),
        (Role::NonRegistrant, _) => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registrant {
    host: HostId,
    key: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reservation {
    rtype: ResvType,
    /// The holder; for all-registrants types every registrant holds it and this is the host
    /// that acquired it.
    host: HostId,
}

/// The reservation state of one namespace (what a [`Store`] keeps).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct State {
    registrants: Vec<Registrant>,
    reservation: Option<Reservation>,
    /// Reservation Report GEN: incremented on every registration change (§7.8).
    generation: u32,
    /// Persist Through Power Loss state (Register CPTPL, feature 83h).
    ptpl: bool,
}

/// Who sends a reservation command: the Host Identifier of its controller.
#[derive(Debug, Clone, Copy)]
pub struct Requester {
    pub host: HostId,
}

/// The reservation state of one namespace, shared by every queue of every controller.
#[derive(Debug, Default)]
pub struct Reservations {
    /// The state as last read or written, with its store version.
    state: Mutex<(State, Version)>,
    /// A reservation is held: the I/O path takes the lock only then.
    held: AtomicBool,
    /// Where the state is kept; `None`: in memory only, PTPL not supported.
    store: Option<Arc<dyn Store>>,
    /// Held by a change from start to end (including its durable save), so that changes
    /// apply one after the other while `state` is locked only briefly: a reactor checking
    /// I/O or reporting never waits for a save.
    changing: Mutex<()>,
}

/// Tries of a change that keeps finding the stored state changed under it (each try is a
/// read and a conditional write; other gateways' changes are rare and short).
const CHANGE_TRIES: usize = 32;

/// The key at byte `at` of a command's parameter data (Figures 390, 392, 394); data shorter
/// than the command's structure is a transfer length error.
fn key_at(data: &[u8], at: usize) -> Result<u64, Status> {
    let mut r = Reader::new(data);
    r.take(at)
        .and_then(|_| r.u64())
        .map_err(|_| Status::DATA_SGL_LENGTH_INVALID.with_dnr())
}

const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr();
const INVALID: Status = Status::INVALID_FIELD.with_dnr();
/// No room for another registrant ([`MAX_REGISTRANTS`]). The spec names no status for it;
/// like SPDK's full registrant table, an internal error, not to be retried.
const FULL: Status = Status::INTERNAL_ERROR.with_dnr();
/// Registrants a namespace keeps: what the Reservation Report's 16-bit REGCTL can count
/// (§7.8, Figure 396), and the bound the state file and the RADOS record decode against. A
/// host connecting under ever new Host Identifiers cannot grow the list (and the file) past it.
const MAX_REGISTRANTS: usize = u16::MAX as usize;

impl State {
    fn find(&self, host: &HostId) -> Option<usize> {
        self.registrants.iter().position(|r| &r.host == host)
    }

    fn role(&self, host: &HostId) -> Role {
        self.role_of(host, self.find(host).is_some())
    }

    /// The role of `host`, whose registration the caller already knows.
    fn role_of(&self, host: &HostId, registered: bool) -> Role {
        match self.reservation {
            Some(r) if r.rtype.all_registrants() && registered => Role::Holder,
            Some(r) if r.host == *host => Role::Holder,
            _ if registered => Role::Registrant,
            _ => Role::NonRegistrant,
        }
    }

    /// The requester's registration, checked against CRKEY unless IEKEY (§8.19.3, §8.19.5).
    fn check_key(&self, host: &HostId, crkey: u64, iekey: bool) -> Result<usize, Status> {
        match self.find(host) {
            Some(i) if iekey || self.registrants[i].key == crkey => Ok(i),
            _ => Err(CONFLICT),
        }
    }

    /// Removes a registration; a reservation held by it (or by the last registrant of an
    /// all-registrants reservation) goes with it (§8.19.5).
    fn unregister(&mut self, i: usize) {
        let gone = self.registrants.remove(i);
        if let Some(r) = self.reservation {
            let released = if r.rtype.all_registrants() {
                self.registrants.is_empty()
            } else {
                r.host == gone.host
            };
            if released {
                self.reservation = None;
            } else if r.rtype.all_registrants() && r.host == gone.host {
                // Someone still registered keeps it; the reported holder moves.
                self.reservation = Some(Reservation {
                    rtype: r.rtype,
                    host: self.registrants[0].host,
                });
            }
        }
        self.generation = self.generation.wrapping_add(1);
    }

    /// Removes every registrant with `key` except `keep` (preempt, §8.19.7); each one removed
    /// is told its registration was preempted.
    fn unregister_key(&mut self, key: u64, keep: &HostId, out: &mut Vec<Notice>) {
        while let Some(i) = self
            .registrants
            .iter()
            .position(|r| r.key == key && &r.host != keep)
        {
            out.push(Notice {
                host: self.registrants[i].host,
                kind: NoticeKind::RegistrationPreempted,
            });
            self.unregister(i);
        }
    }

    /// `kind` for every registrant but `except` (the host that issued the command).
    fn notify_registrants(&self, kind: NoticeKind, except: &HostId, out: &mut Vec<Notice>) {
        out.extend(
            self.registrants
                .iter()
                .filter(|r| &r.host != except)
                .map(|r| Notice { host: r.host, kind }),
        );
    }

    fn register(
        &mut self,
        who: Requester,
        cdw10: u32,
        data: &[u8],
        persistent: bool,
        out: &mut Vec<Notice>,
    ) -> Result<(), Status> {
        let crkey = key_at(data, 0)?;
        let nrkey = key_at(data, 8)?;
        let iekey = cdw10 & IEKEY != 0;
        // CPTPL: 01b is reserved; 11b (set) needs a state file (RESCAP bit 0).
        let ptpl = match cdw10 >> 30 {
            CPTPL_NO_CHANGE => self.ptpl,
            CPTPL_SET if persistent => true,
            CPTPL_CLEAR => false,
            _ => return Err(INVALID),
        };
        self.register_action(who, cdw10, crkey, nrkey, iekey, out)?;
        // Applied once the registration action succeeded (§7.6).
        self.ptpl = ptpl;
        Ok(())
    }

    fn register_action(
        &mut self,
        who: Requester,
        cdw10: u32,
        crkey: u64,
        nrkey: u64,
        iekey: bool,
        out: &mut Vec<Notice>,
    ) -> Result<(), Status> {
        match cdw10 & 0x7 {
            REGISTER_REGISTER => match self.find(&who.host) {
                // Registering again with the same key succeeds; another key is a conflict.
                Some(i) if self.registrants[i].key == nrkey => Ok(()),
                Some(_) => Err(CONFLICT),
                None if self.registrants.len() >= MAX_REGISTRANTS => {
                    tracing::warn!(
                        host = ?who.host,
                        limit = MAX_REGISTRANTS,
                        "reservation register refused: the namespace's registrant list is full"
                    );
                    Err(FULL)
                }
                None => {
                    self.registrants.push(Registrant {
                        host: who.host,
                        key: nrkey,
                    });
                    self.generation = self.generation.wrapping_add(1);
                    Ok(())
                }
            },
            REGISTER_UNREGISTER => {
                let i = self.check_key(&who.host, crkey, iekey)?;
                let before = self.reservation;
                self.unregister(i);
                // The holder unregistering releases its reservation (§8.19.5), which the
                // other registrants hear of as a release would tell them (§8.19.6).
                if let (Some(r), None) = (before, self.reservation) {
                    if r.rtype.release_notifies() {
                        self.notify_registrants(NoticeKind::ReservationReleased, &who.host, out);
                    }
                }
                Ok(())
            }
            REGISTER_REPLACE => {
                let i = self.check_key(&who.host, crkey, iekey)?;
                self.registrants[i].key = nrkey;
                self.generation = self.generation.wrapping_add(1);
                Ok(())
            }
            _ => Err(INVALID),
        }
    }

    fn acquire(
        &mut self,
        who: Requester,
        cdw10: u32,
        data: &[u8],
        out: &mut Vec<Notice>,
    ) -> Result<(), Status> {
        let crkey = key_at(data, 0)?;
        let prkey = key_at(data, 8)?;
        let action = cdw10 & 0x7;
        if !matches!(
            action,
            ACQUIRE_ACQUIRE | ACQUIRE_PREEMPT | ACQUIRE_PREEMPT_ABORT
        ) {
            return Err(INVALID);
        }
        let rtype = ResvType::from_raw((cdw10 >> 8) as u8).ok_or(INVALID)?;
        // IEKEY is obsolete for Acquire and Release since NVMe 1.3 (RESCAP bit 7).
        if cdw10 & IEKEY != 0 {
            return Err(INVALID);
        }
        self.check_key(&who.host, crkey, false)?;
        let new = Reservation {
            rtype,
            host: who.host,
        };
        if action == ACQUIRE_ACQUIRE {
            return match self.reservation {
                None => {
                    self.reservation = Some(new);
                    Ok(())
                }
                // The holder acquiring the same type again is a no-op (§8.19.4).
                Some(r) if self.role(&who.host) == Role::Holder && r.rtype == rtype => Ok(()),
                Some(_) => Err(CONFLICT),
            };
        }
        // Preempt (§8.19.7).
        match self.reservation {
            None => {
                if prkey == 0 {
                    return Err(INVALID);
                }
                self.unregister_key(prkey, &who.host, out);
            }
            Some(r) if r.rtype.all_registrants() => {
                if prkey == 0 {
                    // Every other registrant goes; the requester holds the new reservation.
                    let others: Vec<HostId> = self
                        .registrants
                        .iter()
                        .map(|r| r.host)
                        .filter(|h| h != &who.host)
                        .collect();
                    for h in others {
                        if let Some(i) = self.find(&h) {
                            out.push(Notice {
                                host: h,
                                kind: NoticeKind::RegistrationPreempted,
                            });
                            self.unregister(i);
                        }
                    }
                    self.reservation = Some(new);
                } else {
                    self.unregister_key(prkey, &who.host, out);
                }
            }
            Some(r) => {
                let holder_key = self.find(&r.host).map(|i| self.registrants[i].key);
                if holder_key == Some(prkey) {
                    self.unregister_key(prkey, &who.host, out);
                    self.reservation = Some(new);
                    // The old reservation is gone and one of another type replaces it: the
                    // registrants left are told it was released (as Linux nvmet does).
                    if r.rtype != rtype {
                        self.notify_registrants(NoticeKind::ReservationReleased, &who.host, out);
                    }
                } else if prkey == 0 {
                    return Err(INVALID);
                } else {
                    self.unregister_key(prkey, &who.host, out);
                }
            }
        }
        Ok(())
    }

    fn release(
        &mut self,
        who: Requester,
        cdw10: u32,
        data: &[u8],
        out: &mut Vec<Notice>,
    ) -> Result<(), Status> {
        let crkey = key_at(data, 0)?;
        let action = cdw10 & 0x7;
        if !matches!(action, RELEASE_RELEASE | RELEASE_CLEAR) || cdw10 & IEKEY != 0 {
            return Err(INVALID);
        }
        self.check_key(&who.host, crkey, false)?;
        if action == RELEASE_CLEAR {
            // §8.19.6: every other registrant is told its reservation was preempted.
            self.notify_registrants(NoticeKind::ReservationPreempted, &who.host, out);
            self.registrants.clear();
            self.reservation = None;
            self.generation = self.generation.wrapping_add(1);
            return Ok(());
        }
        match self.reservation {
            // Releasing nothing, or a reservation held by another host, has no effect.
            None => Ok(()),
            Some(_) if self.role(&who.host) != Role::Holder => Ok(()),
            Some(r) if r.rtype as u32 != (cdw10 >> 8) & 0xff => Err(INVALID),
            Some(r) => {
                self.reservation = None;
                if r.rtype.release_notifies() {
                    self.notify_registrants(NoticeKind::ReservationReleased, &who.host, out);
                }
                Ok(())
            }
        }
    }

    /// Reservation Status data structure, extended (NVMe Base 2.0 Figures 396 and 398).
    fn report(&self) -> Vec<u8> {
        let len = EXT_HEADER_SIZE + EXT_ENTRY_SIZE * self.registrants.len();
        Writer::to_vec(len, |w| {
            w.u32(self.generation);
            w.u8(self.reservation.map_or(0, |r| r.rtype as u8));
            // REGCTL: registration stops at MAX_REGISTRANTS, which is u16::MAX.
            w.u16(u16::try_from(self.registrants.len()).unwrap_or(u16::MAX));
            w.zeros(2);
            w.u8(self.ptpl as u8);
            w.pad_to(EXT_HEADER_SIZE);
            for r in &self.registrants {
                let entry = w.position();
                // One registration serves every controller of the host (dynamic model): FFFFh.
                w.u16(CNTLID_DYNAMIC);
                // `r` is a registrant: no search of the list per entry (quadratic).
                let holds = self.role_of(&r.host, true) == Role::Holder;
                w.u8(if holds { RCSTS_HOLDS } else { 0 });
                w.zeros(5);
                w.u64(r.key);
                w.bytes(&r.host);
                w.pad_to(entry + EXT_ENTRY_SIZE);
            }
        })
    }
}

impl Reservations {
    /// Reservations whose PTPL state is kept in `file`, restored from it when it exists.
    pub fn persistent(file: PathBuf) -> Result<Self, StoreError> {
        Self::open(Arc::new(FileStore::new(file)))
    }

    /// Reservations kept in `store`, restored from it (blocking: run where the namespaces
    /// are opened, not on a reactor).
    pub fn open(store: Arc<dyn Store>) -> Result<Self, StoreError> {
        let (state, version) = power_on(store.as_ref())?;
        // Started here, on the thread that opens the namespaces (not a reactor, whose CPU
        // affinity a thread spawned from it would inherit).
        persist_thread();
        Ok(Self {
            held: AtomicBool::new(state.reservation.is_some()),
            state: Mutex::new((state, version)),
            store: Some(store),
            changing: Mutex::new(()),
        })
    }

    /// PTPL can be set (RESCAP bit 0).
    pub fn ptpl_capable(&self) -> bool {
        self.store.is_some()
    }

    /// A change may write the store (a file: open, write, fsync, rename; RADOS: network round
    /// trips): it must run on the persistence thread ([`offload`]), never on a reactor.
    pub(crate) fn saves(&self) -> bool {
        self.store.is_some()
    }

    /// Other gateways share the state: a report reads the store too, so it is offloaded
    /// like a change.
    pub fn shared(&self) -> bool {
        self.store.as_ref().is_some_and(|s| s.shared())
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let t = f(&mut s.0);
        self.held
            .store(s.0.reservation.is_some(), Ordering::Release);
        t
    }

    /// Takes `state` at `version` as the current state unless a newer one is cached (a
    /// change's own result may arrive after a later change another gateway published).
    fn install(&self, state: State, version: Version) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if version > s.1 {
            *s = (state, version);
            self.held
                .store(s.0.reservation.is_some(), Ordering::Release);
        }
    }

    /// Reads the stored state again (blocking): another gateway changed it. Without a
    /// shared store there is nothing to read.
    pub fn refresh(&self) -> Result<(), StoreError> {
        let Some(store) = self.store.as_ref().filter(|s| s.shared()) else {
            return Ok(());
        };
        let (state, version) = store.load()?;
        self.install(state, version);
        Ok(())
    }

    /// The cached version (what the last read, write or refresh saw).
    pub fn version(&self) -> Version {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Applies a change to a copy of the current state (with a shared store: the stored
    /// state, read now) and stores the result if it differs, before it takes effect, so a
    /// completed command is never lost by a crash and a failed write changes nothing. A
    /// store that another writer changed since the read refuses the write; the change is
    /// then applied again to what is stored now. After a write the store publishes the new
    /// version (other gateways refresh before the command completes).
    /// Returns the notifications the change causes (none when it fails).
    ///
    /// The state lock is not held during the save (`changing` orders the changes), so I/O
    /// checks and reports meanwhile see the state before the change, as they would while the
    /// command is still executing.
    /// `abort`: a Preempt and Abort (the other gateways drain their writes in flight before
    /// they acknowledge it).
    fn change(
        &self,
        abort: bool,
        mut f: impl FnMut(&mut State, &mut Vec<Notice>) -> Result<(), Status>,
    ) -> Result<Vec<Notice>, Status> {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..CHANGE_TRIES {
            let (before, version) = match self.store.as_ref().filter(|s| s.shared()) {
                Some(store) => store.load().map_err(|e| store_failed(&e))?,
                None => self.state.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            };
            let mut next = before.clone();
            let mut notices = Vec::new();
            let applied = f(&mut next, &mut notices);
            // What was read is the current state, whatever the command's outcome.
            self.install(before.clone(), version);
            applied?;
            if next == before {
                return Ok(notices);
            }
            let Some(store) = &self.store else {
                self.install(next, version + 1);
                return Ok(notices);
            };
            match store.replace(version, &before, &next) {
                Ok(stored) => {
                    self.install(next, stored);
                    store.publish(stored, &notices, abort);
                    return Ok(notices);
                }
                Err(StoreError::Stale) => continue,
                Err(e) => return Err(store_failed(&e)),
            }
        }
        tracing::error!(
            tries = CHANGE_TRIES,
            "reservation state kept changing under this change"
        );
        Err(Status::INTERNAL_ERROR)
    }

    /// Reservation Register (§7.6): CDW10 and the 16-byte data (CRKEY, NRKEY).
    pub fn register(&self, who: Requester, cdw10: u32, data: &[u8]) -> Result<Vec<Notice>, Status> {
        let persistent = self.ptpl_capable();
        self.change(false, |s, out| {
            s.register(who, cdw10, data, persistent, out)
        })
    }

    /// Reservation Acquire (§7.5): CDW10 and the 16-byte data (CRKEY, PRKEY).
    pub fn acquire(&self, who: Requester, cdw10: u32, data: &[u8]) -> Result<Vec<Notice>, Status> {
        let abort = cdw10 & 0x7 == ACQUIRE_PREEMPT_ABORT;
        self.change(abort, |s, out| s.acquire(who, cdw10, data, out))
    }

    /// Reservation Release (§7.7): CDW10 and the 8-byte data (CRKEY).
    pub fn release(&self, who: Requester, cdw10: u32, data: &[u8]) -> Result<Vec<Notice>, Status> {
        self.change(false, |s, out| s.release(who, cdw10, data, out))
    }

    /// The extended Reservation Status data structure (§7.8, EDS = 1) of the cached state.
    pub fn report(&self) -> Vec<u8> {
        self.with(|s| s.report())
    }

    /// [`Reservations::report`] of the stored state: with a shared store another gateway may
    /// have changed it, so it is read first (blocking).
    #[cfg(test)]
    fn report_current(&self) -> Result<Vec<u8>, Status> {
        if let Some(store) = self.store.as_ref().filter(|s| s.shared()) {
            let (state, version) = store.load().map_err(|e| store_failed(&e))?;
            self.install(state.clone(), version);
            return Ok(state.report());
        }
        Ok(self.report())
    }

    /// Reservation Persistence feature (83h) value: PTPL.
    pub fn ptpl(&self) -> bool {
        self.with(|s| s.ptpl)
    }

    /// Set Features Reservation Persistence (§5.27.1.14); Invalid Field without a state file.
    pub fn set_ptpl(&self, on: bool) -> Result<(), Status> {
        if on && !self.ptpl_capable() {
            return Err(INVALID);
        }
        self.change(false, |s, _| {
            s.ptpl = on;
            Ok(())
        })
        .map(drop)
    }

    /// Figure 333 for an I/O command from `host`: `Err(Reservation Conflict)` when refused.
    #[inline]
    pub fn check_io(&self, host: &HostId, opcode: u8) -> Result<(), Status> {
        if !self.held.load(Ordering::Acquire) {
            return Ok(());
        }
        self.check_io_held(host, opcode)
    }

    #[cold]
    fn check_io_held(&self, host: &HostId, opcode: u8) -> Result<(), Status> {
        let Some(access) = Access::of_opcode(opcode) else {
            return Ok(());
        };
        self.with(|s| match s.reservation {
            Some(r) if !allowed(r.rtype, s.role(host), access) => Err(CONFLICT),
            _ => Ok(()),
        })
    }
}

/// The state a namespace opens with. NVMe Base 2.0 §8.19.10: without PTPL, registrations
/// and the reservation do not survive a power loss. One process starting is one; for a
/// gateway group it is the first gateway to start, when no other serves the namespace (the
/// conditional write keeps a gateway from clearing what another one's host just stored).
fn power_on(store: &dyn Store) -> Result<(State, Version), StoreError> {
    for _ in 0..CHANGE_TRIES {
        let (state, version) = store.load()?;
        if state.ptpl || state == State::default() || !store.alone()? {
            return Ok((state, version));
        }
        match store.replace(version, &state, &State::default()) {
            Ok(v) => return Ok((State::default(), v)),
            Err(StoreError::Stale) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Stale)
}

/// A store that failed a command's read or write: logged, and the command fails with an
/// internal error (nothing changed).
fn store_failed(e: &StoreError) -> Status {
    tracing::error!(error = %e, "reservation state not read or stored");
    Status::INTERNAL_ERROR
}

/// Reservation Notification log pages waiting on one controller, oldest first.
pub const NOTIFICATION_QUEUE: usize = 64;

/// One controller's reservation notifications: the queue of unread log pages (80h) and the
/// Reservation Notification Mask (feature 82h) per namespace. Sans-I/O; the controller keeps
/// it behind its mutex.
#[derive(Debug, Default)]
pub struct NotificationLog {
    pages: VecDeque<ReservationNotificationLog>,
    /// The count of the newest notification, stored or lost.
    count: u64,
    /// Masks set by Set Features 82h; a namespace not listed masks nothing (the default).
    masks: BTreeMap<u32, u32>,
}

impl NotificationLog {
    /// Records `kind` on namespace `nsid` unless masked; false when masked (no log page, no
    /// event).
    ///
    /// Log Page Count (NVMe Base 2.0 §5.16.1, Reservation Notification): incremented for
    /// every page created, rolling over from FFFFFFFF_FFFFFFFFh to 1h (0h marks an empty
    /// page). When the queue is full the notification is lost, and the newest queued page
    /// takes the count of the lost one, so the host sees from the gap that pages were lost.
    pub fn add(&mut self, kind: NoticeKind, nsid: u32) -> bool {
        if self.mask(nsid) & kind.mask_bit() != 0 {
            return false;
        }
        self.count = self.count.checked_add(1).unwrap_or(1);
        if self.pages.len() == NOTIFICATION_QUEUE {
            if let Some(last) = self.pages.back_mut() {
                last.count = self.count;
            }
            tracing::warn!(
                nsid,
                kind = kind.code(),
                "reservation notification lost: queue full"
            );
        } else {
            self.pages.push_back(ReservationNotificationLog {
                count: self.count,
                kind: kind.code(),
                available: 0,
                nsid,
            });
        }
        true
    }

    /// Get Log Page 80h: the oldest page, which the read removes (`consume`), with the
    /// number of pages still waiting after it; an empty page (all zeroes) when none waits.
    pub fn read(&mut self, consume: bool) -> ReservationNotificationLog {
        let page = if consume {
            self.pages.pop_front()
        } else {
            self.pages.front().copied()
        };
        let Some(mut page) = page else {
            return ReservationNotificationLog::default();
        };
        let after = self.pages.len() - usize::from(!consume);
        page.available = after.min(u8::MAX as usize) as u8;
        page
    }

    /// Feature 82h value of namespace `nsid`.
    pub fn mask(&self, nsid: u32) -> u32 {
        self.masks.get(&nsid).copied().unwrap_or(0)
    }

    pub fn set_mask(&mut self, nsid: u32, mask: u32) {
        self.masks.insert(nsid, mask & NOTIFICATION_MASK_BITS);
    }

    /// Controller Level Reset: the queue empties and the count starts again from 0.
    pub fn reset(&mut self) {
        self.pages.clear();
        self.count = 0;
    }
}

/// State file: magic, then PTPL (1), RTYPE (1, 0 = none), holder (16), GEN (4), registrant
/// count (4), and per registrant host (16) and key (8); integers little-endian.
const MAGIC: &[u8; 8] = b"NVMFDRV1";
const FIXED: usize = 8 + 1 + 1 + 16 + 4 + 4;
const ENTRY: usize = 16 + 8;

fn encode(s: &State) -> Vec<u8> {
    Writer::to_vec(FIXED + ENTRY * s.registrants.len(), |w| {
        w.bytes(MAGIC);
        w.u8(s.ptpl as u8);
        w.u8(s.reservation.map_or(0, |r| r.rtype as u8));
        w.bytes(&s.reservation.map_or([0; 16], |r| r.host));
        w.u32(s.generation);
        w.u32(s.registrants.len() as u32);
        for r in &s.registrants {
            w.bytes(&r.host);
            w.u64(r.key);
        }
    })
}

fn decode(b: &[u8]) -> Result<State, StoreError> {
    let mut r = Reader::new(b);
    let magic = r.take_array::<8>()?;
    if magic != *MAGIC {
        return Err(invalid("magic", u64::from_le_bytes(magic)));
    }
    let ptpl = match r.u8()? {
        0 => false,
        1 => true,
        v => return Err(invalid("PTPL", v)),
    };
    let rtype = r.u8()?;
    let holder = r.take_array::<16>()?;
    let generation = r.u32()?;
    let count = r.u32()?;
    if count as usize > MAX_REGISTRANTS {
        return Err(invalid("registrant count", count));
    }
    // The entries, exactly: the count is checked against the bytes in the file before any
    // registrant is kept.
    let mut entries = r.sub(count as usize * ENTRY)?;
    r.expect_empty()?;
    let registrants = (0..count)
        .map(|_| {
            Ok(Registrant {
                host: entries.take_array()?,
                key: entries.u64()?,
            })
        })
        .collect::<Result<Vec<_>, DecodeError>>()?;
    let reservation = match rtype {
        0 => None,
        t => {
            let rtype = ResvType::from_raw(t).ok_or(invalid("RTYPE", t))?;
            // A holder is always a registrant.
            if !registrants.iter().any(|r| r.host == holder) {
                return Err(StoreError::Malformed("holder not registered"));
            }
            Some(Reservation {
                rtype,
                host: holder,
            })
        }
    };
    Ok(State {
        registrants,
        reservation,
        generation,
        ptpl,
    })
}

/// A stored field whose value is not defined for it.
fn invalid(field: &'static str, value: impl Into<u64>) -> StoreError {
    StoreError::Decode(DecodeError::InvalidValue {
        field,
        value: value.into(),
    })
}

/// What a reservation change run by [`offload`] produced: the command's completion and the
/// notifications to deliver. Filled by the persistence thread before it completes the tag.
pub(crate) type Outcome = (Completion, Vec<Notice>);

/// Where the persistence thread leaves an [`Outcome`] for the queue that waits for it.
#[derive(Debug, Clone, Default)]
pub(crate) struct PendingChange(Arc<Mutex<Option<Outcome>>>);

impl PendingChange {
    /// The outcome, once the tag completed (`None` only if the job never ran to its end).
    pub(crate) fn take(&self) -> Option<Outcome> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

type PersistJob = Box<dyn FnOnce() + Send>;

/// The one thread that runs reservation changes which may write a state file: each save
/// is an open, a write, two fsyncs and a rename, and a reactor must not wait for a disk
/// (ARCHITECTURE.md, reactor contract). Changes are rare (a host registering, acquiring,
/// releasing), so one thread for the daemon serves every namespace, in order. Started on first
/// use; `None` if the thread could not be created.
fn persist_thread() -> Option<&'static mpsc::Sender<PersistJob>> {
    static THREAD: OnceLock<Option<mpsc::Sender<PersistJob>>> = OnceLock::new();
    THREAD
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<PersistJob>();
            let spawned = std::thread::Builder::new()
                .name("nvmfd-persist".into())
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                });
            match spawned {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::error!(error = %e, "reservation persistence thread not started");
                    None
                }
            }
        })
        .as_ref()
}

/// Runs `change` on the persistence thread and completes `tag` through `done` (result 0)
/// once its [`Outcome`] is in the returned [`PendingChange`]. A panic in `change` becomes an
/// Internal Error, so the tag always completes. `Err`: no thread to run it on (logged).
pub(crate) fn offload(
    done: &Arc<ExternalCompletions>,
    tag: u64,
    change: impl FnOnce() -> Outcome + Send + 'static,
) -> Result<PendingChange, Status> {
    let tx = persist_thread().ok_or(Status::INTERNAL_ERROR)?;
    let pending = PendingChange::default();
    let slot = pending.clone();
    let done_by = Arc::clone(done);
    done.begin();
    let job: PersistJob = Box::new(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(change))
            .unwrap_or_else(|_| (Completion::fail(Status::INTERNAL_ERROR), Vec::new()));
        *slot.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        done_by.complete(tag, 0);
    });
    if tx.send(job).is_err() {
        done.abandon();
        tracing::error!("reservation persistence thread gone");
        return Err(Status::INTERNAL_ERROR);
    }
    Ok(pending)
}

/// The state file of the namespace with `nguid` in `dir` (the NGUID names the namespace
/// across restarts and reloads).
pub fn state_file(dir: &Path, nguid: &[u8; 16]) -> PathBuf {
    let hex: String = nguid.iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("reservations-{hex}.bin"))
}

/// Replaces `file` atomically and durably: a crash leaves the old or the new content.
pub(crate) fn save(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Largest data transfer of a reservation command (Figures 389, 391, 393; Report: NUMD).
pub(crate) fn data_limit(sqe: &Sqe) -> u32 {
    match sqe.opcode {
        nvm_opcode::RESERVATION_REGISTER | nvm_opcode::RESERVATION_ACQUIRE => 16,
        nvm_opcode::RESERVATION_RELEASE => 8,
        // NUMD (CDW10) is a 0's based number of dwords.
        _ => (sqe.cdw10 as u64 + 1)
            .saturating_mul(4)
            .min(u32::MAX as u64) as u32,
    }
}

/// Executes a reservation command of the host `host` against `resv`. `data` is the host's
/// parameter data (Register, Acquire, Release) or the buffer for the report. Returns the
/// completion and the notifications to deliver.
pub(crate) fn execute(
    resv: &Reservations,
    host: HostId,
    sqe: &Sqe,
    data: &mut [u8],
) -> (Completion, Vec<Notice>) {
    let who = Requester { host };
    let r = match sqe.opcode {
        nvm_opcode::RESERVATION_REGISTER => resv.register(who, sqe.cdw10, data),
        nvm_opcode::RESERVATION_ACQUIRE => resv.acquire(who, sqe.cdw10, data),
        nvm_opcode::RESERVATION_RELEASE => resv.release(who, sqe.cdw10, data),
        nvm_opcode::RESERVATION_REPORT => return (report(resv, sqe, data), Vec::new()),
        _ => Err(Status::INVALID_OPCODE.with_dnr()),
    };
    let done = match r {
        Ok(notices) => return (Completion::ok(), notices),
        Err(status) => {
            tracing::debug!(
                opcode = sqe.opcode,
                nsid = sqe.nsid,
                cdw10 = sqe.cdw10,
                status = status.to_field(),
                "reservation command refused"
            );
            // CDW10 holds the action, type and IEKEY; the keys are in the data.
            Completion::err(status).at(40)
        }
    };
    (done, Vec::new())
}

/// Reads a gateway group's stored state into `resv` (blocking: the persistence thread) ahead
/// of a Reservation Report, which then answers from it.
pub(crate) fn refresh(resv: &Reservations) -> Outcome {
    match resv.refresh() {
        Ok(()) => (Completion::ok(), Vec::new()),
        Err(e) => (Completion::fail(store_failed(&e)), Vec::new()),
    }
}

/// Reservation Report (§7.8). Fabrics Host Identifiers are 128-bit, so only the extended
/// data structure (EDS) can carry them; without it the command fails with Host Identifier
/// Inconsistent Format.
fn report(resv: &Reservations, sqe: &Sqe, data: &mut [u8]) -> Completion {
    if sqe.cdw11 & REPORT_EDS == 0 {
        return Completion::fail(Status::HOST_ID_INCONSISTENT_FORMAT).at(44);
    }
    let want = (data_limit(sqe) as usize).min(data.len());
    if want < EXT_HEADER_SIZE {
        return Completion::fail(Status::INVALID_FIELD).at(40);
    }
    let page = resv.report();
    let n = want.min(page.len());
    data[..n].copy_from_slice(&page[..n]);
    // The rest of the host's buffer reads as zero (no stale bytes of another command).
    data[n..want].fill(0);
    Completion::data(want)
}

#[cfg(test)]
mod tests;
