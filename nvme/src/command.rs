//! What a command handler hands back and what the dispatch core hands the transport: data
//! direction and the length limit of a command table entry (`DataLimit`), handler completions
//! (`Completion`, `Exec`), CQE-ready `Response`s, `Outcome`, `PollResult` and why a
//! controller goes away (`TerminateReason`). A leaf: every handler and
//! `queue` use it, it uses only `spec` and `wire`.

use crate::spec::Status;
use crate::wire::{Cqe, Sqe};

/// Which way a command's data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    None,
    HostToController,
    ControllerToHost,
}

/// The data length rule of a command at admission (a field of every command table entry): the
/// most bytes its transfer may hold, below MDTS, which bounds every command.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DataLimit {
    /// A fixed bound (0 for commands without data).
    Bytes(u32),
    /// A bound the command's own fields set (a Reservation Report's NUMD).
    Fields(fn(&Sqe) -> u32),
}

impl DataLimit {
    #[inline(always)]
    pub fn of(self, sqe: &Sqe) -> u32 {
        match self {
            DataLimit::Bytes(n) => n,
            DataLimit::Fields(f) => f(sqe),
        }
    }
}

/// A completion for the transport: send `data_len` bytes of the command's data buffer to the
/// host (controller-to-host commands), then the CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub cqe: Cqe,
    pub data_len: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done now.
    Complete(Response),
    /// One `BlockOp` went to `IoSubmit`; `finish` completes the command.
    Submitted,
    /// Held (Asynchronous Event Request, first half of a fused pair); completed later by
    /// `poll`.
    Held,
    /// Cannot start yet (a write overlapping a fused Compare and Write, or the second half of
    /// a pair whose first half has no data yet): the transport keeps the command and its data
    /// and calls `execute` again after a later `poll`. Nothing was started.
    Blocked,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct PollResult {
    pub completions: Vec<Response>,
    /// Set when the queue must be closed (keep-alive expiry, controller deleted or reset).
    pub terminate: Option<TerminateReason>,
}

/// What a handler decided; `Queue::respond` turns it into a CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completion {
    pub status: Status,
    pub dw0: u32,
    pub dw1: u32,
    /// Bytes of data to return (controller-to-host), only on success.
    pub data_len: u32,
    /// Error log: parameter error location (byte offset in the SQE) and LBA.
    pub pel: u16,
    pub lba: u64,
    /// The backend failed the command's block operation (counted per namespace in the
    /// metrics, where `nvm` maps the error to a status).
    pub backend_failed: bool,
}

impl Completion {
    pub fn ok() -> Self {
        Self {
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
            data_len: 0,
            pel: 0xffff,
            lba: 0,
            backend_failed: false,
        }
    }
    pub fn data(len: usize) -> Self {
        Self {
            data_len: len as u32,
            ..Self::ok()
        }
    }
    pub fn value(dw0: u32) -> Self {
        Self { dw0, ..Self::ok() }
    }
    pub fn err(status: Status) -> Self {
        Self {
            status,
            ..Self::ok()
        }
    }
    /// Status with Do Not Retry: the command will fail the same way again.
    pub fn fail(status: Status) -> Self {
        Self::err(status.with_dnr())
    }
    pub fn at(self, pel: u16) -> Self {
        Self { pel, ..self }
    }
    pub fn with_lba(self, lba: u64) -> Self {
        Self { lba, ..self }
    }
    pub fn with_dw0(self, dw0: u32) -> Self {
        Self { dw0, ..self }
    }
}

impl From<Status> for Completion {
    fn from(s: Status) -> Self {
        Self::err(s)
    }
}

pub(crate) enum Exec {
    Done(Completion),
    Submitted,
    Held,
    /// See `Outcome::Blocked`.
    Blocked,
}

impl From<Completion> for Exec {
    fn from(c: Completion) -> Self {
        Exec::Done(c)
    }
}

codec::coded_enum! {
    /// Why a controller (and every queue of it) is going away. Transports close the connection.
    /// The code is what the controller's atomic `terminated` holds (0 = running).
    pub enum TerminateReason: u8, from_code {
        /// No command within KATO (NVMe Base 2.0 §3.9).
        KeepAliveTimeout = 1,
        /// The admin queue's connection ended, which deletes the controller.
        AdminQueueGone = 2,
        /// CC.EN went 1 → 0: the controller reset deletes its I/O queues.
        ControllerReset = 3,
        /// The host sent a Fabrics Disconnect for this queue.
        HostDisconnect = 4,
        /// A reload removed the subsystem.
        SubsystemRemoved = 5,
        /// A reload or the control socket removed the host from the subsystem's allowed hosts.
        HostRemoved = 6,
    }
}
