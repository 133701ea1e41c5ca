//! Admin commands of an NVM (I/O) controller (NVMe Base 2.0 §5): Identify, Get Log Page,
//! Get/Set Features, Asynchronous Event Request, Keep Alive, Abort.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::ana::{ANATT_SECONDS, MAX_ANA_GROUP};
use crate::command::{Completion, DataLimit, Direction, Exec};
use crate::controller::{AsyncEvent, Controller, ERROR_LOG_ENTRIES, KAS_100MS, MAX_AERS};
use crate::limits::Limits;
use crate::namespace::{Namespace, NamespaceStatsSnapshot};
use crate::nvm;
use crate::peer::{PeerInfo, TransportKind};
use crate::reservation;
use crate::spec::{admin_opcode, cns, effects, error_recovery, fid, lid, resv, NVME_VERSION};
use crate::subsystem::Subsystem;
use crate::target::Target;
use crate::wire::identify::{
    self, cntrltype, ctrl_bits, encode_active_ns_list, ns_bits, space_padded, IdentifyController,
    IdentifyControllerNvm, IdentifyNamespace, NsDescriptor, IDENTIFY_DATA_SIZE,
};
use crate::wire::log::{AnaLog, CommandEffectsLog, ErrorLogEntry, FirmwareSlotLog, SmartLog};
use crate::wire::{Sqe, Status};
use storage::ExternalCompletions;

/// NN reported when fewer namespaces exist: room for NSIDs added by a reload, so the host's
/// view of the valid NSID range does not change (NVMe Base 2.0 §3.2.1.2).
pub const MIN_REPORTED_NN: u32 = 1024;

/// What an admin (or discovery) command may use of its queue: the target, the controller's
/// subsystem, the connection, the limits and the queue's held AERs. An Abort that removes a
/// held AER says so in `aborted_aer`; the queue then completes that AER.
pub(crate) struct AdminContext<'a> {
    pub target: &'a Target,
    pub subsys: &'a Subsystem,
    pub peer: &'a PeerInfo,
    pub limits: &'a Limits,
    pub aers: &'a mut HeldAers,
    pub aborted_aer: Option<u16>,
    /// Where a command that must leave the reactor completes (the reactor's external
    /// completions) and its tag; `None`: this submitter has no such channel.
    pub offload: Option<(&'a Arc<ExternalCompletions>, u64)>,
    /// Commands running on the persistence thread, by CID (`Queue::finish` takes them).
    pub changes: &'a mut Vec<(u16, reservation::PendingChange)>,
}

/// CIDs of the outstanding Asynchronous Event Requests of an admin queue, oldest first.
#[derive(Debug, Default)]
pub(crate) struct HeldAers(VecDeque<u16>);

impl HeldAers {
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    fn hold(&mut self, cid: u16) {
        self.0.push_back(cid);
    }
    /// Removes `cid`; false if it is not held.
    fn remove(&mut self, cid: u16) -> bool {
        match self.0.iter().position(|&c| c == cid) {
            Some(pos) => {
                self.0.remove(pos);
                true
            }
            None => false,
        }
    }
    pub fn pop_oldest(&mut self) -> Option<u16> {
        self.0.pop_front()
    }
}

/// One entry of an admin command table (this module's `COMMANDS`, `discovery::COMMANDS`):
/// what the opcode decides — its data direction (opcode bits 1:0, NVMe Base 2.0 Figure 139),
/// its data limit and its handler.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdminCommand {
    pub opcode: u8,
    pub dir: Direction,
    pub limit: DataLimit,
    pub execute: AdminExecute,
}

/// The handler of an admin command.
pub(crate) type AdminExecute = fn(&mut AdminContext, &Arc<Controller>, &Sqe, &mut [u8]) -> Exec;

impl AdminCommand {
    /// The entry of admin command `opcode` with handler `execute`: its data direction (opcode bits
    /// 1:0, NVMe Base 2.0 Figure 139) and limit are the same on NVM and discovery controllers.
    pub(crate) const fn new(opcode: u8, execute: AdminExecute) -> AdminCommand {
        use admin_opcode as o;
        use Direction::{ControllerToHost as ToHost, HostToController as FromHost, None as NoData};
        // Identify data, and the most a Get/Set Features data buffer carries.
        const PAGE: DataLimit = DataLimit::Bytes(IDENTIFY_DATA_SIZE as u32);
        let (dir, limit) = match opcode {
            // NUMD sizes the transfer; MDTS bounds it.
            o::GET_LOG_PAGE => (ToHost, DataLimit::Bytes(u32::MAX)),
            o::IDENTIFY | o::GET_FEATURES => (ToHost, PAGE),
            o::SET_FEATURES => (FromHost, PAGE),
            o::ABORT | o::ASYNC_EVENT_REQUEST | o::KEEP_ALIVE => (NoData, DataLimit::Bytes(0)),
            _ => panic!("an admin command without a direction and data limit"),
        };
        AdminCommand {
            opcode,
            dir,
            limit,
            execute,
        }
    }
}

/// Admin commands of an NVM (I/O) controller, by opcode. Discovery controllers have their own
/// (`discovery::COMMANDS`).
pub(crate) static COMMANDS: [AdminCommand; 7] = {
    use admin_opcode as o;
    [
        AdminCommand::new(o::GET_LOG_PAGE, |cx, ctrl, sqe, data| {
            get_log_page(cx, ctrl, sqe, data).into()
        }),
        AdminCommand::new(o::IDENTIFY, |cx, ctrl, sqe, data| {
            identify(cx, ctrl, sqe, data).into()
        }),
        AdminCommand::new(o::ABORT, |cx, ctrl, sqe, _| abort(cx, ctrl, sqe)),
        AdminCommand::new(o::SET_FEATURES, |cx, ctrl, sqe, data| {
            if sqe.cdw10 as u8 == fid::RESERVATION_PERSISTENCE {
                return set_reservation_persistence(cx, ctrl, sqe);
            }
            set_features(cx, ctrl, sqe, data).into()
        }),
        AdminCommand::new(o::GET_FEATURES, |cx, ctrl, sqe, data| {
            get_features(cx, ctrl, sqe, data).into()
        }),
        AdminCommand::new(o::ASYNC_EVENT_REQUEST, |cx, ctrl, sqe, _| {
            async_event_request(cx, ctrl, sqe)
        }),
        AdminCommand::new(o::KEEP_ALIVE, |_, _, _, _| Completion::ok().into()),
    ]
};

/// The entry of `opcode` in the admin command table `table`; `None`: Invalid Command Opcode.
pub(crate) fn command(table: &'static [AdminCommand], opcode: u8) -> Option<&'static AdminCommand> {
    table.iter().find(|c| c.opcode == opcode)
}

/// Copies `page` into the host's buffer (which may be shorter) and completes with its length.
pub(crate) fn copy_out(data: &mut [u8], page: &[u8]) -> Completion {
    let n = data.len().min(page.len());
    data[..n].copy_from_slice(&page[..n]);
    Completion::data(n)
}

/// Get Log Page dword fields (NVMe Base 2.0 Figure 197–199).
pub(crate) struct LogRequest {
    pub lid: u8,
    /// Retain Asynchronous Event: do not clear the event mask.
    pub rae: bool,
    /// Log Specific Parameter (CDW10 bits 14:8).
    pub lsp: u8,
    /// Bytes requested: (NUMDU:NUMDL + 1) * 4.
    pub len: u64,
    pub offset: u64,
}

impl LogRequest {
    pub fn from_sqe(sqe: &Sqe) -> Self {
        let numd = ((sqe.cdw11 & 0xffff) as u64) << 16 | (sqe.cdw10 >> 16) as u64;
        Self {
            lid: sqe.cdw10 as u8,
            rae: sqe.cdw10 & (1 << 15) != 0,
            lsp: ((sqe.cdw10 >> 8) & 0x7f) as u8,
            len: (numd + 1) * 4,
            offset: sqe.cdw12 as u64 | (sqe.cdw13 as u64) << 32,
        }
    }

    /// Copies `[offset, offset + len)` of `page` into `data`, zero-filling past the end of
    /// the page. An offset at or beyond the page, or not dword aligned, is Invalid Field
    /// (NVMe Base 2.0 §5.16: LPOL bits 1:0 are reserved).
    pub fn serve(&self, page: &[u8], data: &mut [u8]) -> Completion {
        self.serve_sized(page, page.len() as u64, data)
    }

    /// [`Self::serve`] for a page whose size as the host computes it (`size`) exceeds the
    /// bytes in `page`: everything past `page` reads as zeroes, up to `size`.
    pub fn serve_sized(&self, page: &[u8], size: u64, data: &mut [u8]) -> Completion {
        if self.len > data.len() as u64 {
            return Completion::fail(Status::DATA_SGL_LENGTH_INVALID);
        }
        if self.offset & 3 != 0 || self.offset >= size.max(page.len() as u64) {
            return Completion::fail(Status::INVALID_FIELD).at(48);
        }
        let len = self.len as usize;
        let start = (self.offset as usize).min(page.len());
        let avail = (page.len() - start).min(len);
        data[..avail].copy_from_slice(&page[start..start + avail]);
        data[avail..len].fill(0);
        Completion::data(len)
    }
}

/// Asynchronous Event Request (NVMe Base 2.0 §5.2): completes at once if an event is
/// pending, otherwise held until `poll` finds one.
pub(crate) fn async_event_request(cx: &mut AdminContext, ctrl: &Controller, sqe: &Sqe) -> Exec {
    if cx.aers.len() >= MAX_AERS {
        return Completion::fail(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED).into();
    }
    if let Some(event) = ctrl.take_event() {
        return Completion::value(event.dw0()).into();
    }
    cx.aers.hold(sqe.cid);
    Exec::Held
}

/// Abort (NVMe Base 2.0 §5.1). On the admin queue only a held AER can be aborted (every other
/// admin command completes as it runs). A command of an I/O queue is looked for by that queue's
/// transport: the Abort is posted on the controller's board and held until the answer comes
/// back (`Queue::poll`). Dword 0 bit 0: 0 = aborted, 1 = not aborted.
fn abort(cx: &mut AdminContext, ctrl: &Controller, sqe: &Sqe) -> Exec {
    let sqid = sqe.cdw10 as u16;
    let cid = (sqe.cdw10 >> 16) as u16;
    if sqid == 0 {
        if cx.aers.remove(cid) {
            // The queue completes the AER with Abort Requested before this command.
            cx.aborted_aer = Some(cid);
            return Completion::value(0).into();
        }
        return Completion::value(1).into();
    }
    match ctrl.aborts.post(sqid, cid, sqe.cid) {
        Ok(true) => Exec::Held,
        Ok(false) => Completion::value(1).into(),
        Err(status) => Completion::err(status).into(),
    }
}

/// Identify (NVMe Base 2.0 §5.17), the CNS values the Linux host uses.
fn identify(cx: &mut AdminContext, ctrl: &Controller, sqe: &Sqe, data: &mut [u8]) -> Completion {
    let cns = sqe.cdw10 as u8;
    let csi = (sqe.cdw11 >> 24) as u8;
    // The host's view: a namespace hidden from it is an inactive NSID here (`visibility`).
    let table = cx.subsys.namespaces_for(&ctrl.hostnqn);
    let nsid = sqe.nsid;
    // NSID 0 and FFFFFFFFh name no single namespace (no namespace management here).
    let ns_lookup = || -> Result<Option<&Arc<Namespace>>, Completion> {
        if nsid == 0 || nsid == u32::MAX {
            return Err(Completion::fail(Status::INVALID_NAMESPACE).at(4));
        }
        Ok(table.get(nsid))
    };
    match cns {
        cns::CONTROLLER => copy_out(data, &identify_controller(cx, ctrl).encode()[..]),
        cns::NAMESPACE => match ns_lookup() {
            Err(c) => c,
            Ok(Some(ns)) => {
                let resv = cx.subsys.reservations_supported();
                copy_out(data, &identify_namespace(ns, resv).encode()[..])
            }
            // An inactive NSID returns a zero-filled structure (NVMe Base 2.0 §5.17.2.1).
            Ok(None) => copy_out(data, &[0u8; IDENTIFY_DATA_SIZE]),
        },
        cns::ACTIVE_NAMESPACES => {
            if nsid >= 0xffff_fffe {
                return Completion::fail(Status::INVALID_NAMESPACE).at(4);
            }
            let mut page = [0u8; IDENTIFY_DATA_SIZE];
            encode_active_ns_list(table.nsids_after(nsid), &mut page);
            copy_out(data, &page)
        }
        cns::NS_DESCRIPTORS => match ns_lookup() {
            Err(c) => c,
            Ok(Some(ns)) => copy_out(
                data,
                &NsDescriptor::encode_list(&[
                    NsDescriptor::Nguid(ns.nguid),
                    NsDescriptor::Uuid(ns.uuid),
                    NsDescriptor::Csi(0),
                ])[..],
            ),
            Ok(None) => Completion::fail(Status::INVALID_NAMESPACE).at(4),
        },
        // I/O command set specific structures: the NVM command set's Identify Namespace
        // (CNS 05h) has no field nvmfd sets; its Identify Controller (CNS 06h) carries the
        // backends' Write Zeroes / Dataset Management limits.
        cns::CS_NAMESPACE | cns::CS_CONTROLLER if csi != 0 => {
            Completion::fail(Status::INVALID_FIELD).at(47)
        }
        cns::CS_NAMESPACE => match ns_lookup() {
            Err(c) => c,
            Ok(_) => copy_out(data, &[0u8; IDENTIFY_DATA_SIZE]),
        },
        cns::CS_CONTROLLER => copy_out(data, &identify_controller_nvm(&table).encode()[..]),
        _ => Completion::fail(Status::INVALID_FIELD).at(40),
    }
}

/// Identify Controller (NVMe Base 2.0 Figure 275) for I/O and discovery controllers.
pub(crate) fn identify_controller(cx: &AdminContext, ctrl: &Controller) -> IdentifyController {
    let settings = cx.subsys.settings();
    let discovery = ctrl.is_discovery();
    let limits = &cx.limits;
    let mut sgls = ctrl_bits::SGLS_SUPPORTED;
    if cx.peer.transport == TransportKind::Rdma {
        sgls |= ctrl_bits::SGLS_KEYED;
    }
    if limits.in_capsule_data_size > 0 {
        sgls |= ctrl_bits::SGLS_OFFSET;
    }
    let nn = if discovery {
        0
    } else {
        cx.subsys.namespaces().max_nsid().max(MIN_REPORTED_NN)
    };
    IdentifyController {
        vid: 0,
        ssvid: 0,
        sn: space_padded(&settings.serial),
        mn: space_padded(&settings.model),
        fr: space_padded(env!("CARGO_PKG_VERSION")),
        rab: 6,
        ieee: [0; 3],
        cmic: if discovery {
            0
        } else {
            ctrl_bits::CMIC_MULTI_PORT | ctrl_bits::CMIC_MULTI_CTRL | ctrl_bits::CMIC_ANA
        },
        // MDTS is a power of two in units of CAP.MPSMIN (4 KiB).
        mdts: (limits.max_data_transfer / 4096).trailing_zeros() as u8,
        cntlid: ctrl.cntlid,
        ver: NVME_VERSION,
        oaes: if discovery {
            ctrl_bits::OAES_DISC_LOG_CHANGE
        } else {
            ctrl_bits::OAES_NS_ATTR | ctrl_bits::OAES_ANA_CHANGE
        },
        ctratt: ctrl_bits::CTRATT_HOST_ID_128 | ctrl_bits::CTRATT_TBKAS,
        cntrltype: if discovery {
            cntrltype::DISCOVERY
        } else {
            cntrltype::IO
        },
        oacs: 0,
        acl: 3,
        aerl: (MAX_AERS - 1) as u8,
        // One firmware slot, read-only.
        frmw: if discovery { 0 } else { 0b11 },
        lpa: if discovery {
            ctrl_bits::LPA_EXTENDED_DATA
        } else {
            ctrl_bits::LPA_SMART_PER_NS | ctrl_bits::LPA_CMD_EFFECTS | ctrl_bits::LPA_EXTENDED_DATA
        },
        elpe: (ERROR_LOG_ENTRIES - 1) as u8,
        npss: 0,
        wctemp: 0,
        cctemp: 0,
        kas: KAS_100MS,
        // ANA (NVMe Base 2.0 §8.1.3); discovery controllers have no namespaces.
        anatt: if discovery { 0 } else { ANATT_SECONDS },
        anacap: if discovery {
            0
        } else {
            ctrl_bits::ANACAP_OPTIMIZED
                | ctrl_bits::ANACAP_NON_OPTIMIZED
                | ctrl_bits::ANACAP_INACCESSIBLE
                | ctrl_bits::ANACAP_PERSISTENT_LOSS
                | ctrl_bits::ANACAP_CHANGE
        },
        anagrpmax: if discovery { 0 } else { MAX_ANA_GROUP },
        nanagrpid: if discovery { 0 } else { MAX_ANA_GROUP },
        sqes: 0x66,
        cqes: 0x44,
        maxcmd: limits.max_queue_size,
        nn,
        oncs: if discovery {
            0
        } else {
            // Compare and Write Zeroes work on every backend; Dataset Management is
            // advertised when some namespace can give space back (the others take it as
            // the hint it is). The host reads this once per connection.
            let dsm = cx
                .subsys
                .namespaces()
                .iter()
                .any(|ns| ns.backend.capabilities().deallocate);
            ctrl_bits::ONCS_COMPARE
                | if dsm { ctrl_bits::ONCS_DSM } else { 0 }
                | ctrl_bits::ONCS_WRITE_ZEROES
                | ctrl_bits::ONCS_TIMESTAMP
                // Copy and Verify are reads (and a write) through the backend like any other
                // (`copy`): every backend serves them.
                | ctrl_bits::ONCS_VERIFY
                | ctrl_bits::ONCS_COPY
                | if cx.subsys.reservations_supported() {
                    resv::ONCS_RESERVATIONS
                } else {
                    0
                }
        },
        // Fused Compare and Write: `fused` pairs, `write_lock` makes it atomic.
        fuses: if discovery {
            0
        } else {
            ctrl_bits::FUSES_COMPARE_AND_WRITE
        },
        ocfs: if discovery {
            0
        } else {
            ctrl_bits::OCFS_FORMAT_0
        },
        fna: 0,
        // Decided when the controller was created (`Controller::vwc_present`): present when
        // a namespace then had a volatile cache.
        vwc: if ctrl.vwc_present() {
            ctrl_bits::VWC_PRESENT
        } else {
            0
        },
        awun: 0,
        awupf: 0,
        sgls,
        mnan: nn,
        subnqn: cx.subsys.nqn.clone(),
        ioccsz: (64 + limits.in_capsule_data_size) / 16,
        iorcsz: 1,
        icdoff: 0,
        fcatt: 0,
        msdbd: 1,
        // One power state (NPSS = 0) whose power and latencies nvmfd cannot know: 0 in
        // Maximum Power, Entry and Exit Latency means "not reported" (NVMe Base 2.0
        // §5.17.2.1, Power State Descriptor). Linux nvmet reports an invented 25 W with
        // 16/4 µs here.
        psd0_max_power: 0,
        psd0_entry_lat: 0,
        psd0_exit_lat: 0,
    }
}

/// Get Log Page (NVMe Base 2.0 §5.16) on an I/O controller.
fn get_log_page(
    cx: &mut AdminContext,
    ctrl: &Controller,
    sqe: &Sqe,
    data: &mut [u8],
) -> Completion {
    let req = LogRequest::from_sqe(sqe);
    if req.lid == lid::ANA {
        return ana_log_page(cx.subsys, ctrl, &req, data);
    }
    let page: Vec<u8> = match req.lid {
        lid::ERROR => {
            let mut page = vec![0u8; ERROR_LOG_ENTRIES * ErrorLogEntry::SIZE];
            for (slot, e) in page
                .chunks_exact_mut(ErrorLogEntry::SIZE)
                .zip(ctrl.error_log())
            {
                slot.copy_from_slice(&e.encode());
            }
            page
        }
        lid::SMART => {
            let Some(io) = smart_namespace_totals(cx, ctrl, sqe.nsid) else {
                return Completion::fail(Status::INVALID_NAMESPACE).at(4);
            };
            // Commands and data units live with the namespaces, as in Linux nvmet, which
            // reports its block devices' statistics (admin-cmd.c nvmet_get_smart_log_all);
            // they, the error counters and the power fields come from the target's health
            // store, so they keep growing across reconnects and (saved) restarts.
            let health = cx.target.health();
            let (media_errors, critical_warning) = health.subsystem_errors(&cx.subsys.nqn);
            let c = health.controller();
            SmartLog {
                critical_warning,
                data_units_read: SmartLog::data_units(io.bytes_read),
                data_units_written: SmartLog::data_units(io.bytes_written),
                host_read_commands: io.read_commands.into(),
                host_write_commands: io.write_commands.into(),
                power_cycles: c.power_cycles.into(),
                power_on_hours: c.power_on_hours.into(),
                unsafe_shutdowns: c.unsafe_shutdowns.into(),
                media_errors: media_errors.into(),
                error_log_entries: ctrl.error_log_entries().into(),
                ..SmartLog::default()
            }
            .encode()
            .to_vec()
        }
        lid::FIRMWARE_SLOT => {
            let mut log = FirmwareSlotLog {
                afi: 1,
                ..FirmwareSlotLog::default()
            };
            log.frs[0] = space_padded(env!("CARGO_PKG_VERSION"));
            log.encode().to_vec()
        }
        lid::CHANGED_NS => {
            let page = ctrl.take_changed_ns().encode().to_vec();
            if !req.rae {
                ctrl.clear_event_mask(AsyncEvent::NamespaceAttributeChanged);
            }
            page
        }
        lid::CMD_EFFECTS => command_effects(cx.subsys.reservations_supported())
            .encode()
            .to_vec(),
        // One notification per page; reading it removes it (a read at an offset only looks).
        lid::RESERVATION_NOTIFICATION if cx.subsys.reservations_supported() => {
            let page = ctrl.read_reservation_log(req.offset == 0).encode().to_vec();
            if !req.rae {
                ctrl.clear_event_mask(AsyncEvent::ReservationLogAvailable);
            }
            page
        }
        // The discovery log exists on discovery controllers only.
        _ => return Completion::fail(Status::INVALID_LOG_PAGE).at(40),
    };
    req.serve(&page, data)
}

/// Set Features Reservation Persistence (§5.27.1.14). Where the namespace keeps a state
/// file, the change (which may write and fsync it) runs on the persistence thread
/// (`reservation::offload`) and the command completes from `Queue::finish`.
fn set_reservation_persistence(cx: &mut AdminContext, ctrl: &Controller, sqe: &Sqe) -> Exec {
    let on = sqe.cdw11 & 1 != 0;
    let table = cx.subsys.namespaces_for(&ctrl.hostnqn);
    let offload = match (cx.offload, table.get(sqe.nsid)) {
        (Some(off), Some(ns)) if cx.subsys.reservations_supported() && ns.reservations.saves() => {
            Some((off, Arc::clone(ns)))
        }
        _ => None,
    };
    let Some(((done, tag), ns)) = offload else {
        return reservation_persistence(cx, ctrl, sqe, Some(on)).into();
    };
    let job = move || {
        let c = match ns.reservations.set_ptpl(on) {
            Ok(()) => Completion::ok(),
            Err(status) => Completion::err(status).at(44),
        };
        (c, Vec::new())
    };
    match reservation::offload(done, tag, job) {
        Ok(pending) => {
            cx.changes.push((sqe.cid, pending));
            Exec::Submitted
        }
        Err(status) => Completion::fail(status).into(),
    }
}

/// Set Features (NVMe Base 2.0 §5.27).
fn set_features(cx: &mut AdminContext, ctrl: &Controller, sqe: &Sqe, data: &[u8]) -> Completion {
    let fid = sqe.cdw10 as u8;
    if fid == fid::RESERVATION_NOTIFICATION_MASK {
        return reservation_notification_mask(cx, ctrl, sqe, true);
    }
    if sqe.cdw10 & (1 << 31) != 0 {
        // SV: nothing is persisted across power cycles here.
        return Completion::fail(Status::FEATURE_NOT_SAVEABLE).at(43);
    }
    let v = sqe.cdw11;
    let invalid = || Completion::fail(Status::INVALID_FIELD).at(44);
    match fid {
        fid::ARBITRATION => ctrl.lock().features.arbitration = v,
        // Only power state 0 exists (NPSS = 0).
        fid::POWER_MANAGEMENT if v & 0x1f == 0 => ctrl.lock().features.power_state = v,
        fid::POWER_MANAGEMENT => return invalid(),
        fid::TEMPERATURE_THRESHOLD => {
            let (tmpsel, thsel) = ((v >> 16) & 0xf, (v >> 20) & 0x3);
            let mut st = ctrl.lock();
            match (tmpsel, thsel) {
                (0, 0) => st.features.temp_over = v as u16,
                (0, 1) => st.features.temp_under = v as u16,
                _ => return invalid(),
            }
        }
        // NVMe Base 2.0 §5.27.1.6: DULBE may only be set if the namespace supports it (NSFEAT
        // bit 2), which none does here.
        fid::ERROR_RECOVERY if v & error_recovery::DULBE != 0 => return invalid(),
        fid::ERROR_RECOVERY => ctrl.lock().features.tler = (v & error_recovery::TLER_MASK) as u16,
        // The feature controls a volatile write cache "if present" (NVMe Base 2.0
        // §5.27.1.4); without one there is nothing to switch.
        fid::VOLATILE_WRITE_CACHE if !ctrl.vwc_present() => return invalid(),
        fid::VOLATILE_WRITE_CACHE => ctrl.set_volatile_write_cache(v & 1 != 0),
        fid::NUMBER_OF_QUEUES => return set_number_of_queues(cx, ctrl, v),
        fid::ASYNC_EVENT_CONFIG => return set_async_event_config(ctrl, v),
        fid::TIMESTAMP => {
            if data.len() < 8 {
                return Completion::fail(Status::DATA_SGL_LENGTH_INVALID);
            }
            let mut ms = [0u8; 8];
            ms[..6].copy_from_slice(&data[..6]);
            ctrl.lock().features.timestamp = Some((u64::from_le_bytes(ms), Instant::now()));
        }
        fid::KEEP_ALIVE_TIMER => ctrl.set_kato(v),
        // NVMe-oF: the host identifier comes from Connect and cannot be changed.
        fid::HOST_IDENTIFIER => return Completion::fail(Status::COMMAND_SEQUENCE_ERROR),
        _ => return Completion::fail(Status::INVALID_FIELD).at(40),
    }
    Completion::ok()
}

/// Reservation Persistence (NVMe Base 2.0 §5.27.1.14), namespace specific: PTPL of an
/// active namespace, settable only where a state directory backs it. `set`: Set Features'
/// PTPL bit; `None`: Get Features (SEL 3: changeable and namespace specific; the value is
/// saved by nature, so SEL 1 is 0 and SEL 2 the current value).
fn reservation_persistence(
    cx: &AdminContext,
    ctrl: &Controller,
    sqe: &Sqe,
    set: Option<bool>,
) -> Completion {
    if !cx.subsys.reservations_supported() {
        return Completion::fail(Status::INVALID_FIELD).at(40);
    }
    let table = cx.subsys.namespaces_for(&ctrl.hostnqn);
    let Some(ns) = table.get(sqe.nsid) else {
        return Completion::fail(Status::INVALID_NAMESPACE).at(4);
    };
    let resv = &ns.reservations;
    match (set, (sqe.cdw10 >> 8) & 0x7) {
        (Some(on), _) => match resv.set_ptpl(on) {
            Ok(()) => Completion::ok(),
            Err(status) => Completion::err(status).at(44),
        },
        (None, 0 | 2) => Completion::value(resv.ptpl() as u32),
        (None, 1) => Completion::value(0),
        (None, 3) => Completion::value(if resv.ptpl_capable() { 0b110 } else { 0b010 }),
        (None, _) => Completion::fail(Status::INVALID_FIELD).at(41),
    }
}

/// Reservation Notification Mask (NVMe Base 2.0 §5.27.1, feature 82h): namespace specific,
/// kept per controller (`reservation::NotificationLog`). Set with NSID FFFFFFFFh applies to
/// every active namespace; Get names one. Not saveable (SEL 2 reads the default, 0).
fn reservation_notification_mask(
    cx: &AdminContext,
    ctrl: &Controller,
    sqe: &Sqe,
    set: bool,
) -> Completion {
    if !cx.subsys.reservations_supported() {
        return Completion::fail(Status::INVALID_FIELD).at(40);
    }
    let table = cx.subsys.namespaces_for(&ctrl.hostnqn);
    let all = set && sqe.nsid == u32::MAX;
    if !all && (sqe.nsid == 0 || table.get(sqe.nsid).is_none()) {
        return Completion::fail(Status::INVALID_NAMESPACE).at(4);
    }
    if set {
        if sqe.cdw10 & (1 << 31) != 0 {
            return Completion::fail(Status::FEATURE_NOT_SAVEABLE).at(43);
        }
        let v = sqe.cdw11;
        if v & !resv::NOTIFICATION_MASK_BITS != 0 {
            return Completion::fail(Status::INVALID_FIELD).at(44);
        }
        let mut st = ctrl.lock();
        if all {
            for ns in table.iter() {
                st.resv_log.set_mask(ns.nsid, v);
            }
        } else {
            st.resv_log.set_mask(sqe.nsid, v);
        }
        return Completion::ok();
    }
    match (sqe.cdw10 >> 8) & 0x7 {
        0 => Completion::value(ctrl.lock().resv_log.mask(sqe.nsid)),
        1 | 2 => Completion::value(0),
        // Changeable, namespace specific, not saveable.
        3 => Completion::value(0b110),
        _ => Completion::fail(Status::INVALID_FIELD).at(41),
    }
}

/// Number of Queues (NVMe Base 2.0 §5.27.1.5): grant min(requested, max_io_queues); both
/// counts are 0's based; only before any I/O queue exists.
fn set_number_of_queues(cx: &AdminContext, ctrl: &Controller, v: u32) -> Completion {
    let (nsqr, ncqr) = (v & 0xffff, v >> 16);
    if nsqr == 0xffff || ncqr == 0xffff {
        return Completion::fail(Status::INVALID_FIELD).at(44);
    }
    let granted = (nsqr.min(ncqr) + 1).min(cx.limits.max_io_queues as u32) as u16;
    let mut st = ctrl.lock();
    if st.io_queues_connected() {
        return Completion::fail(Status::COMMAND_SEQUENCE_ERROR);
    }
    st.io_queues_granted = granted;
    let n = (granted - 1) as u32;
    Completion::value(n | n << 16)
}

/// Get Features (NVMe Base 2.0 §5.15); SEL 0 current, 1 default, 2 saved (= default, as
/// nothing is saveable), 3 supported capabilities.
fn get_features(
    cx: &mut AdminContext,
    ctrl: &Controller,
    sqe: &Sqe,
    data: &mut [u8],
) -> Completion {
    let fid = sqe.cdw10 as u8;
    let sel = (sqe.cdw10 >> 8) & 0x7;
    if fid == fid::RESERVATION_PERSISTENCE {
        return reservation_persistence(cx, ctrl, sqe, None);
    }
    if fid == fid::RESERVATION_NOTIFICATION_MASK {
        return reservation_notification_mask(cx, ctrl, sqe, false);
    }
    let supported = matches!(
        fid,
        fid::ARBITRATION
            | fid::POWER_MANAGEMENT
            | fid::TEMPERATURE_THRESHOLD
            | fid::ERROR_RECOVERY
            | fid::VOLATILE_WRITE_CACHE
            | fid::NUMBER_OF_QUEUES
            | fid::ASYNC_EVENT_CONFIG
            | fid::TIMESTAMP
            | fid::KEEP_ALIVE_TIMER
            | fid::HOST_IDENTIFIER
    );
    // Volatile Write Cache only where one is present (NVMe Base 2.0 §5.27.1.4).
    if !supported || (fid == fid::VOLATILE_WRITE_CACHE && !ctrl.vwc_present()) {
        return Completion::fail(Status::INVALID_FIELD).at(40);
    }
    match sel {
        0 => {}
        1 | 2 => return default_feature(cx, ctrl, fid, sqe, data),
        // Changeable (bit 2), not saveable, not namespace specific.
        3 => {
            return Completion::value(if fid == fid::HOST_IDENTIFIER {
                0
            } else {
                1 << 2
            })
        }
        _ => return Completion::fail(Status::INVALID_FIELD).at(41),
    }
    let st = ctrl.lock();
    let f = st.features;
    let value = match fid {
        fid::ARBITRATION => f.arbitration,
        fid::POWER_MANAGEMENT => f.power_state,
        fid::TEMPERATURE_THRESHOLD => {
            let v = sqe.cdw11;
            match ((v >> 16) & 0xf, (v >> 20) & 0x3) {
                (0, 0) => f.temp_over as u32,
                (0, 1) => f.temp_under as u32,
                _ => return Completion::fail(Status::INVALID_FIELD).at(44),
            }
        }
        fid::ERROR_RECOVERY => f.tler as u32,
        fid::VOLATILE_WRITE_CACHE => ctrl.write_cache_enabled() as u32,
        fid::NUMBER_OF_QUEUES => {
            let n = (st.io_queues_granted - 1) as u32;
            n | n << 16
        }
        fid::ASYNC_EVENT_CONFIG => f.async_event_config,
        fid::KEEP_ALIVE_TIMER => st.kato_ms,
        fid::TIMESTAMP => {
            drop(st);
            return timestamp(f.timestamp, data);
        }
        _ => {
            drop(st);
            return host_identifier(ctrl, sqe, data);
        }
    };
    Completion::value(value)
}

fn default_feature(
    cx: &AdminContext,
    ctrl: &Controller,
    fid: u8,
    sqe: &Sqe,
    data: &mut [u8],
) -> Completion {
    let n = (cx.limits.max_io_queues - 1) as u32;
    Completion::value(match fid {
        fid::TEMPERATURE_THRESHOLD if (sqe.cdw11 >> 20) & 0x3 == 0 => {
            crate::controller::Features::DEFAULT_TEMP_OVER as u32
        }
        fid::VOLATILE_WRITE_CACHE => 1,
        fid::NUMBER_OF_QUEUES => n | n << 16,
        fid::ASYNC_EVENT_CONFIG if ctrl.is_discovery() => ctrl_bits::OAES_DISC_LOG_CHANGE,
        fid::ASYNC_EVENT_CONFIG => ctrl_bits::OAES_NS_ATTR | ctrl_bits::OAES_ANA_CHANGE,
        fid::TIMESTAMP => return timestamp(None, data),
        fid::HOST_IDENTIFIER => return host_identifier(ctrl, sqe, data),
        _ => 0,
    })
}

/// The command and data unit counters SMART reports for `nsid` (LPA bit 0: per namespace):
/// that namespace's, or for 0h / FFFFFFFFh the controller-level view, the sum over every
/// namespace the controller's subsystem has had (NVMe Base 2.0 §5.16.1.3). `None` for an
/// NSID that is not active.
fn smart_namespace_totals(
    cx: &AdminContext,
    ctrl: &Controller,
    nsid: u32,
) -> Option<NamespaceStatsSnapshot> {
    if nsid != 0 && nsid != u32::MAX {
        return cx
            .subsys
            .namespaces_for(&ctrl.hostnqn)
            .get(nsid)
            .map(|ns| ns.stats.snapshot());
    }
    Some(cx.target.health().subsystem_totals(&cx.subsys.nqn))
}

/// The ANA log page (0Ch) as seen through the port this controller was created on. Hosts size
/// it as 16 + NANAGRPID × 32 + MNAN × 4 bytes and nvme-cli reads it in 4 KiB pieces, so every
/// offset below that size is valid and reads zeroes past the descriptors.
fn ana_log_page(
    subsys: &Subsystem,
    ctrl: &Controller,
    req: &LogRequest,
    data: &mut [u8],
) -> Completion {
    // Only the namespaces attached to this controller (NVMe Base 2.0 §5.16.1.13).
    let (namespaces, ana, _) = subsys.published_for(&ctrl.hostnqn);
    let rgo = req.lsp & AnaLog::LSP_RGO != 0;
    let page = ana.log_page(ctrl.peer.port_id, &namespaces, rgo).encode();
    let mnan = namespaces.max_nsid().max(MIN_REPORTED_NN) as u64;
    let size = AnaLog::HEADER as u64 + MAX_ANA_GROUP as u64 * 32 + mnan * 4;
    let done = req.serve_sized(&page, size, data);
    if done.status.is_success() && !req.rae {
        ctrl.clear_event_mask(AsyncEvent::AnaChange);
    }
    done
}

/// Asynchronous Event Configuration (NVMe Base 2.0 §5.27.1.7): SMART critical warning bits
/// 7:0 plus the notices this controller reports.
pub(crate) fn set_async_event_config(ctrl: &Controller, v: u32) -> Completion {
    let supported = 0xff
        | if ctrl.is_discovery() {
            ctrl_bits::OAES_DISC_LOG_CHANGE
        } else {
            ctrl_bits::OAES_NS_ATTR | ctrl_bits::OAES_ANA_CHANGE
        };
    if v & !supported != 0 {
        return Completion::fail(Status::INVALID_FIELD).at(44);
    }
    ctrl.lock().features.async_event_config = v;
    Completion::ok()
}

/// Timestamp data (NVMe Base 2.0 Figure 338): 48-bit milliseconds since the Unix epoch, then
/// attributes: bits 3:1 origin (001b = set by a host; 000b otherwise, here the system clock).
fn timestamp(set: Option<(u64, Instant)>, data: &mut [u8]) -> Completion {
    let (ms, origin) = match set {
        Some((base, at)) => (base + at.elapsed().as_millis() as u64, 1u8),
        None => (
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            0,
        ),
    };
    let mut page = [0u8; 8];
    page[..6].copy_from_slice(&ms.to_le_bytes()[..6]);
    page[6] = origin << 1;
    copy_out(data, &page)
}

/// Host Identifier (NVMe Base 2.0 §5.27.1.25): the 128-bit form (EXHID = 1) only.
fn host_identifier(ctrl: &Controller, sqe: &Sqe, data: &mut [u8]) -> Completion {
    if sqe.cdw11 & 1 == 0 {
        return Completion::fail(Status::INVALID_FIELD).at(44);
    }
    copy_out(data, &ctrl.hostid)
}

/// Identify Namespace (NVM Command Set 1.0 §4.1.5.1) for an active namespace.
/// `reservations`: the subsystem serves reservations (RESCAP advertised only then).
pub(crate) fn identify_namespace(ns: &Namespace, reservations: bool) -> IdentifyNamespace {
    let caps = ns.backend.capabilities();
    // Preferred write granularity and alignment (NPWG/NPWA, also used for deallocate:
    // NPDG/NPDA) and optimal write size (NOWS), 0's based in LBAs, valid per NSFEAT bit 4
    // (NVM Command Set 1.0 §4.1.5.1): the backend's physical block and optimal I/O size where
    // it knows them (block devices: sysfs queue limits), else 4 KiB. The Linux host derives
    // the physical block size from NPWG and the optimal I/O size from NOWS.
    let lbas = |bytes: u32| ((bytes >> ns.lba_shift).clamp(1, 1 << 16) - 1) as u16;
    let granularity = match caps.physical_block_bytes {
        0 => lbas(4096),
        bytes => lbas(bytes),
    };
    let optimal = match caps.optimal_io_bytes {
        0 => granularity,
        bytes => lbas(bytes),
    };
    let copy_blocks = crate::copy::MAX_COPY_BYTES >> ns.lba_shift;
    IdentifyNamespace {
        nsze: ns.blocks,
        ncap: ns.blocks,
        nuse: ns.blocks,
        nsfeat: ns_bits::NSFEAT_OPTPERF,
        nlbaf: 0,
        flbas: 0,
        nmic: ns_bits::NMIC_SHARED,
        // Every reservation type; Persist Through Power Loss with a state directory.
        rescap: if reservations {
            let ptpl = if ns.reservations.ptpl_capable() {
                resv::RESCAP_PTPL
            } else {
                0
            };
            resv::RESCAP_TYPES | resv::RESCAP_IEKEY | ptpl
        } else {
            0
        },
        // Only what the backend guarantees: deallocated blocks read as zeroes (001b, else
        // 000b = not reported); Write Zeroes with DEAC deallocates.
        dlfeat: if caps.zeroes_after_deallocate {
            ns_bits::DLFEAT_READ_ZEROES
        } else {
            0
        } | if caps.write_zeroes_deallocates {
            ns_bits::DLFEAT_WRITE_ZEROES_DEALLOCATES
        } else {
            0
        },
        npwg: granularity,
        npwa: granularity,
        npdg: granularity,
        npda: granularity,
        nows: optimal,
        // Copy (`copy`): one bounce buffer of at most MAX_COPY_BYTES per command.
        mssrl: copy_blocks.min(u64::from(u16::MAX)) as u16,
        mcl: copy_blocks.min(u64::from(u32::MAX)) as u32,
        msrc: (crate::copy::MAX_SOURCE_RANGES - 1) as u8,
        anagrpid: ns.anagrpid,
        nsattr: if ns.read_only {
            identify::ns_bits::NSATTR_WRITE_PROTECTED
        } else {
            0
        },
        nguid: ns.nguid,
        eui64: [0; 8],
        lbaf0_lbads: ns.lba_shift as u8,
    }
}

/// Identify Controller, NVM command set (CNS 06h): the tightest Write Zeroes and Dataset
/// Management limits any active namespace's backend reports, so that hosts split large
/// requests; 0 (no limit reported) where no backend knows one. Limits that cannot be
/// expressed (a write-zeroes limit under 8 KiB, the smallest WZSL) are not reported either:
/// the backends accept any length, the limits only keep single commands short.
fn identify_controller_nvm(table: &crate::namespace::NamespaceTable) -> IdentifyControllerNvm {
    let mut id = IdentifyControllerNvm::default();
    for ns in table.iter() {
        let caps = ns.backend.capabilities();
        if caps.max_deallocate_bytes > 0 {
            let blocks = (caps.max_deallocate_bytes >> ns.lba_shift).clamp(1, u32::MAX as u64);
            if id.dmrsl == 0 || (blocks as u32) < id.dmrsl {
                id.dmrsl = blocks as u32;
            }
        }
        // WZSL n means 2^n × CAP.MPSMIN (4 KiB); n = 0 means no limit.
        let pages = caps.max_write_zeroes_bytes / 4096;
        if pages >= 2 {
            let n = pages.ilog2().min(u8::MAX as u32) as u8;
            if id.wzsl == 0 || n < id.wzsl {
                id.wzsl = n;
            }
        }
    }
    id
}

/// Commands Supported and Effects (log 05h) for what `queue.rs` admits.
fn command_effects(reservations: bool) -> CommandEffectsLog {
    let mut log = CommandEffectsLog::default();
    for c in &COMMANDS {
        log.admin[c.opcode as usize] = effects::CSUPP;
    }
    for (op, cmd) in nvm::commands() {
        if cmd.op == nvm::Op::Reservation && !reservations {
            continue;
        }
        // The commands that change the media change logical block content.
        log.io[op as usize] = if cmd.writes {
            effects::CSUPP | effects::LBCC
        } else {
            effects::CSUPP
        };
    }
    log
}
