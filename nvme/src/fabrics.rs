//! Fabrics commands (NVMe-oF 1.1 §3.3): Connect, Property Get / Property Set, Disconnect.

use std::sync::Arc;

use crate::controller::{
    reg, Controller, ControllerParams, IoQueueRefusal, ADMIN_QUEUE_ENTRIES, NVME_VERSION,
};
use crate::queue::{Completion, IoState, Queue, Role};
use crate::subsystem::AllocError;
use crate::wire::fabrics::{
    fctype, ConnectCommand, ConnectData, PropertyCommand, PropertySize, CNTLID_DYNAMIC,
};
use crate::wire::{DecodeError, Sqe, Status};

/// IPO/IATTR for a Connect "Invalid Parameters" response (NVMe-oF 1.1 Figure 21): IATTR bit 0
/// (DW0 bit 16) says whether the offset is into the Connect data (1) or the SQE (0).
fn invalid_in_data(offset: u16) -> Completion {
    Completion::fail(Status::CONNECT_INVALID_PARAMETERS).with_dw0(1 << 16 | offset as u32)
}
fn invalid_in_sqe(offset: u16) -> Completion {
    Completion::fail(Status::CONNECT_INVALID_PARAMETERS)
        .with_dw0(offset as u32)
        .at(offset)
}

impl Queue {
    /// Connect (NVMe-oF 1.1 §3.3.1): creates a controller (admin queue, dynamic cntlid) or
    /// attaches an I/O queue to an existing one.
    pub(crate) fn connect(&mut self, sqe: &Sqe, data: &[u8]) -> Completion {
        let cmd = ConnectCommand::from_sqe(sqe);
        let remote = self.peer.remote;
        if cmd.recfmt != 0 {
            tracing::warn!(%remote, recfmt = cmd.recfmt, "Connect rejected: unsupported record format");
            return Completion::fail(Status::CONNECT_INCOMPATIBLE_FORMAT)
                .with_dw0(ConnectCommand::OFFSET_RECFMT as u32);
        }
        let d = match ConnectData::decode(data) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(%remote, error = %e, "Connect rejected: malformed Connect data");
                let offset = match e {
                    DecodeError::InvalidValue {
                        field: "subnqn", ..
                    } => ConnectData::OFFSET_SUBNQN,
                    DecodeError::InvalidValue {
                        field: "hostnqn", ..
                    } => ConnectData::OFFSET_HOSTNQN,
                    _ => return Completion::fail(Status::DATA_SGL_LENGTH_INVALID),
                };
                return invalid_in_data(offset);
            }
        };
        let reject = |why: &str| {
            tracing::warn!(
                %remote,
                port = self.peer.port_id,
                hostnqn = %d.hostnqn,
                subnqn = %d.subnqn,
                qid = cmd.qid,
                "Connect rejected: {why}"
            );
        };
        let Some(subsys) = self.target.subsystem(&d.subnqn) else {
            reject("unknown subsystem");
            return invalid_in_data(ConnectData::OFFSET_SUBNQN);
        };
        if subsys.is_removed() || !subsys.is_discovery() && !subsys.exported_on(self.peer.port_id) {
            reject("subsystem not exported on this port");
            return invalid_in_data(ConnectData::OFFSET_SUBNQN);
        }
        if let Some((host, sub)) = &self.tls_identity {
            if *host != d.hostnqn {
                reject("host NQN differs from the TLS PSK identity's");
                return Completion::fail(Status::CONNECT_INVALID_HOST)
                    .with_dw0(1 << 16 | ConnectData::OFFSET_HOSTNQN as u32);
            }
            if *sub != d.subnqn {
                reject("subsystem NQN differs from the TLS PSK identity's");
                return invalid_in_data(ConnectData::OFFSET_SUBNQN);
            }
        }
        if !subsys.host_allowed(&d.hostnqn) {
            reject("host not allowed");
            return Completion::fail(Status::CONNECT_INVALID_HOST)
                .with_dw0(1 << 16 | ConnectData::OFFSET_HOSTNQN as u32);
        }
        // SQSIZE is 0's based and a queue needs at least two entries (NVMe-oF 1.1 §3.3.1).
        let entries = cmd.sqsize as u32 + 1;
        if cmd.qid == 0 {
            if cmd.sqsize == 0 || entries > ADMIN_QUEUE_ENTRIES as u32 {
                reject("admin queue size out of range");
                return invalid_in_sqe(ConnectCommand::OFFSET_SQSIZE);
            }
            if d.cntlid != CNTLID_DYNAMIC {
                reject("admin Connect must ask for a dynamic controller (cntlid 0xffff)");
                return invalid_in_data(ConnectData::OFFSET_CNTLID);
            }
            // Discovery controllers with KATO 0 still time out eventually (stale sessions).
            let kato_ms = if cmd.kato == 0 && subsys.is_discovery() {
                self.limits.kato_default_ms
            } else {
                cmd.kato
            };
            let params = ControllerParams {
                hostnqn: d.hostnqn.clone(),
                hostid: d.hostid,
                peer: self.peer,
                limits: self.limits,
                kato_ms,
            };
            let sub = Arc::clone(&subsys);
            let ctrl = match subsys.add_controller(|id| Controller::new(id, sub, params)) {
                Ok(c) => c,
                Err(AllocError::Exhausted) => {
                    reject("no controller ID left");
                    return Completion::fail(Status::CONNECT_CONTROLLER_BUSY);
                }
                Err(AllocError::Removed) => {
                    reject("subsystem is being removed");
                    return invalid_in_data(ConnectData::OFFSET_SUBNQN);
                }
            };
            tracing::info!(
                %remote,
                port = self.peer.port_id,
                hostnqn = %d.hostnqn,
                subnqn = %d.subnqn,
                cntlid = ctrl.cntlid,
                kato_ms,
                "controller created"
            );
            let cntlid = ctrl.cntlid;
            self.role = Role::Admin(ctrl);
            self.accept(cmd);
            return Completion::value(cntlid as u32);
        }
        if subsys.is_discovery() {
            reject("discovery controllers have no I/O queues");
            return invalid_in_sqe(ConnectCommand::OFFSET_QID);
        }
        let ctrl = match subsys.controller(d.cntlid) {
            Some(c) if c.hostnqn == d.hostnqn && c.terminated().is_none() => c,
            _ => {
                reject("no such live controller for this host");
                return invalid_in_data(ConnectData::OFFSET_CNTLID);
            }
        };
        if !ctrl.is_ready() {
            reject("controller not enabled");
            return Completion::fail(Status::COMMAND_SEQUENCE_ERROR);
        }
        if cmd.sqsize == 0 || entries > self.limits.max_queue_size as u32 {
            reject("I/O queue size out of range");
            return invalid_in_sqe(ConnectCommand::OFFSET_SQSIZE);
        }
        let counters = match ctrl.register_io_queue(cmd.qid) {
            Ok(c) => c,
            Err(IoQueueRefusal::QidOutOfRange { granted }) => {
                reject(&format!("qid beyond the {granted} granted I/O queues"));
                return invalid_in_sqe(ConnectCommand::OFFSET_QID);
            }
            Err(IoQueueRefusal::AlreadyConnected) => {
                reject("qid already connected");
                return Completion::fail(Status::COMMAND_SEQUENCE_ERROR)
                    .at(ConnectCommand::OFFSET_QID);
            }
        };
        let (table, ana, generation) = subsys.published();
        self.io = Some(IoState {
            table,
            ana: ana.port_view(ctrl.peer.port_id),
            generation,
            counters,
            scratch: None,
        });
        let cntlid = ctrl.cntlid;
        tracing::debug!(%remote, cntlid, qid = cmd.qid, entries, "I/O queue connected");
        self.role = Role::Io {
            epoch: ctrl.enable_epoch(),
            ctrl,
            qid: cmd.qid,
        };
        self.accept(cmd);
        Completion::value(cntlid as u32)
    }

    fn accept(&mut self, cmd: ConnectCommand) {
        self.sq_entries = cmd.sqsize + 1;
        self.flow_control_disabled = cmd.flow_control_disabled();
    }

    /// Fabrics commands on a connected queue.
    pub(crate) fn fabrics(&mut self, sqe: &Sqe, admin: bool) -> Completion {
        match sqe.fctype() {
            fctype::PROPERTY_GET if admin => self.property_get(sqe),
            fctype::PROPERTY_SET if admin => self.property_set(sqe),
            fctype::DISCONNECT => {
                // NVMe-oF 1.1 §3.3.4: the queue (and for the admin queue, the controller) is
                // deleted once this completes; `poll` then tells the transport to close.
                self.disconnect_requested = true;
                Completion::ok()
            }
            fctype::CONNECT => Completion::fail(Status::COMMAND_SEQUENCE_ERROR),
            _ => Completion::fail(Status::INVALID_OPCODE),
        }
    }

    /// Property Get (NVMe-oF 1.1 §3.3.2): CAP (8 bytes, or 4-byte halves), VS, CC, CSTS.
    fn property_get(&self, sqe: &Sqe) -> Completion {
        let Some(ctrl) = self.controller() else {
            return Completion::fail(Status::COMMAND_SEQUENCE_ERROR);
        };
        let Ok(p) = PropertyCommand::from_sqe(sqe) else {
            return Completion::fail(Status::INVALID_FIELD).at(40);
        };
        let value: u64 = match (p.offset, p.size) {
            (reg::CAP, PropertySize::Eight) => ctrl.cap(),
            (reg::CAP, PropertySize::Four) => ctrl.cap() & 0xffff_ffff,
            // Hosts that only do 4-byte accesses read CAP as two halves.
            (reg::CAP_HIGH, PropertySize::Four) => ctrl.cap() >> 32,
            (reg::VS, PropertySize::Four) => NVME_VERSION as u64,
            (reg::CC, PropertySize::Four) => ctrl.lock().cc as u64,
            (reg::CSTS, PropertySize::Four) => ctrl.csts() as u64,
            _ => return Completion::fail(Status::INVALID_FIELD).at(44),
        };
        Completion {
            dw1: (value >> 32) as u32,
            ..Completion::value(value as u32)
        }
    }

    /// Property Set: only CC is writable; CAP, VS and CSTS are read-only, NSSR (subsystem
    /// reset) is not supported.
    fn property_set(&self, sqe: &Sqe) -> Completion {
        let Some(ctrl) = self.controller() else {
            return Completion::fail(Status::COMMAND_SEQUENCE_ERROR);
        };
        let Ok(p) = PropertyCommand::from_sqe(sqe) else {
            return Completion::fail(Status::INVALID_FIELD).at(40);
        };
        match (p.offset, p.size) {
            (reg::CC, PropertySize::Four) => {
                ctrl.write_cc(p.value as u32);
                Completion::ok()
            }
            _ => Completion::fail(Status::INVALID_FIELD).at(44),
        }
    }
}
