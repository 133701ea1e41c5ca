//! Where the reservation state of one namespace is kept: the seam between the rules (the
//! parent module, sans-I/O) and storage.
//!
//! A [`Store`] holds a [`State`] with a [`Version`] and replaces it only if the version is
//! still the one read (compare-and-set), so several gateways that each apply the rules to what
//! they read never lose one another's change: the loser of a race reads again and re-applies
//! the command. Two kinds exist:
//! - [`FileStore`], one process: the PTPL state file of `[global] state_dir` (written only while
//!   PTPL is set; the process is the only writer, so versions are counted in memory);
//! - the gateway group's RADOS object (in the daemon, on the `rados` crate): every change is
//!   stored, every gateway reads before deciding, and [`Store::publish`] tells the others.
//!
//! The stored form is plain key/values ([`to_omap`], [`from_omap`]: one key per registrant,
//! keyed by Host Identifier, plus the holder/type, generation and PTPL keys), so an operator
//! can read it with `rados listomapvals`; a change message ([`encode_change`]) carries the new
//! version and the notifications for hosts connected to other gateways.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use codec::{DecodeError, Reader, Writer};

use super::{
    decode, encode, invalid, save, HostId, Notice, NoticeKind, Registrant, Reservation, ResvType,
    State, MAX_REGISTRANTS,
};

/// A stored state's version: it grows with every replacement (RADOS: the object version).
pub type Version = u64;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another writer replaced the state since it was read: read it again.
    #[error("the reservation state changed since it was read")]
    Stale,
    #[error("reservation state I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("reservation state is malformed ({0})")]
    Malformed(&'static str),
    #[error("reservation state is malformed: {0}")]
    Decode(#[from] DecodeError),
}

/// Storage of one namespace's reservation state. Every method may block (a disk, a network
/// round trip): callers run them on the persistence thread or at namespace opening, never on
/// a reactor.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// The stored state and its version (an absent state is the empty one).
    fn load(&self) -> Result<(State, Version), StoreError>;
    /// Stores `next`, which replaces `before`, if the stored version is still `version`:
    /// the new version, or [`StoreError::Stale`].
    fn replace(
        &self,
        version: Version,
        before: &State,
        next: &State,
    ) -> Result<Version, StoreError>;
    /// Other writers (gateways) may change the state: every command reads it first.
    fn shared(&self) -> bool;
    /// No other gateway serves the namespace now: opening it is a power-on of the whole
    /// group (NVMe Base 2.0 §8.19.10: without PTPL the state does not survive it).
    fn alone(&self) -> Result<bool, StoreError>;
    /// After a replacement: tells the other gateways of `version` and of `notices` (for
    /// hosts connected there), and returns once they applied it or a bounded wait ran out.
    /// `abort` (Preempt and Abort): each lets the writes it has in flight on the namespace
    /// drain before it answers.
    fn publish(&self, version: Version, notices: &[Notice], abort: bool);
}

/// Opens the [`Store`] of each namespace (the gateway group's): given to the target in
/// `TargetConfig::reservation_stores`.
pub trait OpenStore: Send + Sync + std::fmt::Debug {
    /// The store of namespace `nsid` of `subsystem`, whose NGUID names it across gateways.
    fn open(
        &self,
        subsystem: &str,
        nsid: u32,
        nguid: &[u8; 16],
    ) -> Result<Arc<dyn Store>, StoreError>;
}

/// The configured [`OpenStore`]; equal only to itself (a reload that keeps it changes
/// nothing).
#[derive(Debug, Clone)]
pub struct SharedStores(pub Arc<dyn OpenStore>);

impl PartialEq for SharedStores {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

impl Eq for SharedStores {}

/// The PTPL state file of one process (`[global] state_dir`).
#[derive(Debug)]
pub struct FileStore {
    file: PathBuf,
}

impl FileStore {
    pub fn new(file: PathBuf) -> Self {
        Self { file }
    }
}

impl Store for FileStore {
    fn load(&self) -> Result<(State, Version), StoreError> {
        match std::fs::read(&self.file) {
            Ok(bytes) => Ok((decode(&bytes)?, 0)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((State::default(), 0)),
            Err(e) => Err(e.into()),
        }
    }

    /// Written durably while PTPL is (or was) set; otherwise the state lives in memory only.
    fn replace(
        &self,
        version: Version,
        before: &State,
        next: &State,
    ) -> Result<Version, StoreError> {
        if before.ptpl || next.ptpl {
            save(&self.file, &encode(next))?;
        }
        Ok(version + 1)
    }

    fn shared(&self) -> bool {
        false
    }

    fn alone(&self) -> Result<bool, StoreError> {
        Ok(true)
    }

    fn publish(&self, _version: Version, _notices: &[Notice], _abort: bool) {}
}

/// Marks a stored layout this code reads; another value is refused, not guessed at.
const FORMAT_KEY: &str = "format";
const FORMAT: &[u8] = b"nvmfd-reservations-1";
const GENERATION_KEY: &str = "generation";
const PTPL_KEY: &str = "ptpl";
/// Present while a reservation is held: its type (1 byte) and holder's Host Identifier.
const RESERVATION_KEY: &str = "reservation";
/// Followed by the registrant's Host Identifier in hex; the value is its key (8 bytes) and its
/// place in registration order (4 bytes), so every gateway reports registrants in one order.
const REGISTRANT_PREFIX: &str = "registrant.";
/// A registrant's value: its key (8) and its place in registration order (4).
const REGISTRANT_LEN: usize = 8 + 4;
/// The reservation's value: its type (1) and the holder's Host Identifier (16).
const RESERVATION_LEN: usize = 1 + 16;

/// Decodes all of one value with `read`: bytes left over are an error.
fn value<T>(
    v: &[u8],
    read: impl FnOnce(&mut Reader<'_>) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    let mut r = Reader::new(v);
    let out = read(&mut r)?;
    r.expect_empty()?;
    Ok(out)
}

/// The key/values of `s` (integers little-endian).
pub fn to_omap(s: &State) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    m.insert(FORMAT_KEY.to_owned(), FORMAT.to_vec());
    m.insert(
        GENERATION_KEY.to_owned(),
        Writer::to_vec(4, |w| w.u32(s.generation)),
    );
    m.insert(
        PTPL_KEY.to_owned(),
        Writer::to_vec(1, |w| w.u8(s.ptpl as u8)),
    );
    if let Some(r) = s.reservation {
        let v = Writer::to_vec(RESERVATION_LEN, |w| {
            w.u8(r.rtype as u8);
            w.bytes(&r.host);
        });
        m.insert(RESERVATION_KEY.to_owned(), v);
    }
    for (i, r) in s.registrants.iter().enumerate() {
        let v = Writer::to_vec(REGISTRANT_LEN, |w| {
            w.u64(r.key);
            w.u32(i as u32);
        });
        m.insert(format!("{REGISTRANT_PREFIX}{}", hex(&r.host)), v);
    }
    m
}

/// The state stored as `m`; no keys at all is the empty state (never written).
pub fn from_omap(m: &BTreeMap<String, Vec<u8>>) -> Result<State, StoreError> {
    let bad = StoreError::Malformed;
    if m.is_empty() {
        return Ok(State::default());
    }
    if m.get(FORMAT_KEY).map(Vec::as_slice) != Some(FORMAT) {
        return Err(bad("format"));
    }
    let generation = value(m.get(GENERATION_KEY).ok_or(bad("generation"))?, |r| r.u32())?;
    let ptpl = match value(m.get(PTPL_KEY).ok_or(bad("PTPL"))?, |r| r.u8())? {
        0 => false,
        1 => true,
        v => return Err(invalid("PTPL", v)),
    };
    let mut ordered = Vec::new();
    for (k, v) in m {
        let Some(h) = k.strip_prefix(REGISTRANT_PREFIX) else {
            if ![FORMAT_KEY, GENERATION_KEY, PTPL_KEY, RESERVATION_KEY].contains(&k.as_str()) {
                return Err(bad("unknown key"));
            }
            continue;
        };
        let host = unhex(h).ok_or(bad("registrant host"))?;
        if ordered.len() == MAX_REGISTRANTS {
            return Err(bad("registrant count"));
        }
        let (key, place) = value(v, |r| Ok((r.u64()?, r.u32()?)))?;
        ordered.push((place, Registrant { host, key }));
    }
    ordered.sort_by_key(|(place, _)| *place);
    if ordered
        .iter()
        .enumerate()
        .any(|(i, (p, _))| *p as usize != i)
    {
        return Err(bad("registrant order"));
    }
    let registrants: Vec<Registrant> = ordered.into_iter().map(|(_, r)| r).collect();
    let reservation = match m.get(RESERVATION_KEY) {
        None => None,
        Some(v) => {
            let (t, host) = value(v, |r| Ok((r.u8()?, r.take_array::<16>()?)))?;
            let rtype = ResvType::from_raw(t).ok_or(invalid("reservation type", t))?;
            // A holder is always a registrant.
            if !registrants.iter().any(|r| r.host == host) {
                return Err(bad("holder not registered"));
            }
            Some(Reservation { rtype, host })
        }
    };
    Ok(State {
        registrants,
        reservation,
        generation,
        ptpl,
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<HostId> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Change message: magic, the new version (8), flags (1: bit 0 Preempt and Abort), the
/// notice count (2), and per notice the host (16) and its notification type (1).
const CHANGE_MAGIC: &[u8; 8] = b"NVMFDRC1";
const CHANGE_FIXED: usize = 8 + 8 + 1 + 2;
const CHANGE_ABORT: u8 = 1;
const CHANGE_ENTRY: usize = 16 + 1;

/// What a gateway that changed the state tells the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub version: Version,
    /// Preempt and Abort: writes in flight drain before the change is acknowledged.
    pub abort: bool,
    pub notices: Vec<Notice>,
}

/// A [`Change`] as sent in a notify.
pub fn encode_change(version: Version, abort: bool, notices: &[Notice]) -> Vec<u8> {
    let notices = &notices[..notices.len().min(u16::MAX as usize)];
    Writer::to_vec(CHANGE_FIXED + CHANGE_ENTRY * notices.len(), |w| {
        w.bytes(CHANGE_MAGIC);
        w.u64(version);
        w.u8(if abort { CHANGE_ABORT } else { 0 });
        w.u16(notices.len() as u16);
        for notice in notices {
            w.bytes(&notice.host);
            w.u8(notice.kind.code());
        }
    })
}

/// The [`Change`] a notify carries.
pub fn decode_change(b: &[u8]) -> Result<Change, StoreError> {
    let mut r = Reader::new(b);
    let magic = r.take_array::<8>()?;
    if magic != *CHANGE_MAGIC {
        return Err(invalid("change magic", u64::from_le_bytes(magic)));
    }
    let version = r.u64()?;
    let flags = r.u8()?;
    if flags & !CHANGE_ABORT != 0 {
        return Err(invalid("change flags", flags));
    }
    let n = r.u16()?;
    // The notices, exactly: the count is checked against the bytes sent first.
    let mut entries = r.sub(usize::from(n) * CHANGE_ENTRY)?;
    r.expect_empty()?;
    let notices = (0..n)
        .map(|_| {
            let host = entries.take_array()?;
            let code = entries.u8()?;
            let kind = NoticeKind::from_code(code).ok_or(invalid("notice type", code))?;
            Ok(Notice { host, kind })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Change {
        version,
        abort: flags & CHANGE_ABORT != 0,
        notices,
    })
}

#[cfg(test)]
mod tests;
