//! The per-connection PDU receive state machine, sans-IO (the quinn-proto habit): it is fed
//! bytes in pieces of any size and yields events; it never touches a socket.
//!
//! Order within a PDU (NVMe/TCP 1.0 §3.6.1): common header → rest of header [+ HDGST] →
//! [pad up to PDO] → [data] → [DDGST]. The common header is validated (type, flags, HLEN, PDO,
//! PLEN, data length against the limits) as soon as its 8 bytes are in, so nothing beyond one
//! fixed-size header is ever buffered and no buffer is sized from an unchecked length.
//!
//! Data is never buffered here: after a header event that announces data, the caller says
//! where that data lands (a command slot's buffer) — either by passing a [`DataSink`] to
//! [`Receiver::feed`], or by reading from the socket straight into the destination and
//! reporting the bytes with [`Receiver::data_placed`] (no intermediate copy).

use super::pdu::{
    digest, digest_append, CommonHeader, Digests, PduError, PduHeader, PduLayout, PduType,
    RecvLimits, Role, COMMON_HEADER_LEN, DIGEST_LEN, MAX_HEADER_BUF,
};

/// `digest(&[])`: CRC32C of no bytes is 0 (checked in the tests).
const EMPTY_DIGEST: u32 = 0;

/// What the receiver has to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A complete, digest-checked PDU header. When `data_len > 0`, that many bytes of data
    /// follow; they go to the caller's destination for this PDU, then [`Event::DataComplete`].
    Pdu { header: PduHeader, data_len: u32 },
    /// All data of the current PDU was placed. `digest_ok` is false when the data digest
    /// did not match (the caller fails the command, the connection survives).
    DataComplete { digest_ok: bool },
}

/// The window of the current PDU's data still to be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataWindow {
    /// Offset within this PDU's data of the next byte.
    pub offset: u32,
    pub remaining: u32,
}

/// Receives the data bytes of the current PDU: `offset` is relative to the PDU's data.
pub trait DataSink {
    fn write(&mut self, offset: u32, bytes: &[u8]);
}

/// A sink that drops everything (data of a PDU the caller does not want).
pub struct Discard;

impl DataSink for Discard {
    fn write(&mut self, _offset: u32, _bytes: &[u8]) {}
}

/// A sink writing into one slice (its start is offset 0 of the PDU data).
impl DataSink for &mut [u8] {
    fn write(&mut self, offset: u32, bytes: &[u8]) {
        let start = offset as usize;
        if let Some(dst) = self.get_mut(start..start + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Collecting the 8-byte common header.
    Common,
    /// Collecting the rest of the header (+ HDGST).
    Header(PduLayout),
    /// Skipping pad bytes before the data.
    Pad { layout: PduLayout, remaining: usize },
    /// Data bytes are being placed by the caller.
    Data {
        layout: PduLayout,
        offset: u32,
        crc: u32,
    },
    /// Collecting the 4-byte DDGST; `crc` is the digest computed over the data.
    DataDigest { crc: u32, have: usize },
    /// An error was reported; the connection is to be closed.
    Failed,
}

/// The receive state machine of one connection.
#[derive(Debug)]
pub struct Receiver {
    /// The side this receiver is on.
    role: Role,
    digests: Digests,
    /// Data alignment (bytes) this side asked for.
    pda: usize,
    limits: RecvLimits,
    /// ICReq/ICResp exchanged.
    established: bool,
    buf: [u8; MAX_HEADER_BUF],
    have: usize,
    /// Length of the last complete header, still in `buf` until the next one arrives.
    last: usize,
    ddgst: [u8; DIGEST_LEN],
    state: State,
}

impl Receiver {
    /// A receiver for a new connection: only the IC PDU (and termination) is accepted until
    /// [`Receiver::establish`].
    pub fn new(role: Role, limits: RecvLimits) -> Self {
        Self {
            role,
            digests: Digests::default(),
            pda: 4,
            limits,
            established: false,
            buf: [0; MAX_HEADER_BUF],
            have: 0,
            last: 0,
            ddgst: [0; DIGEST_LEN],
            state: State::Common,
        }
    }

    /// The ICReq/ICResp exchange is done: from now on `digests` apply and `pda` (bytes) is
    /// the data alignment this side asked for.
    pub fn establish(&mut self, digests: Digests, pda: usize) {
        self.digests = digests;
        self.pda = pda.max(4);
        self.established = true;
    }

    pub fn set_limits(&mut self, limits: RecvLimits) {
        self.limits = limits;
    }

    pub fn limits(&self) -> RecvLimits {
        self.limits
    }

    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// At a PDU boundary (nothing of the next PDU received yet).
    pub fn at_boundary(&self) -> bool {
        self.state == State::Common && self.have == 0
    }

    /// The bytes of the header being (or last) assembled: the offending header to quote in
    /// a termination request after an error.
    pub fn header_bytes(&self) -> &[u8] {
        &self.buf[..if self.have > 0 { self.have } else { self.last }]
    }

    /// The data still expected for the current PDU, when in the data phase.
    pub fn data_window(&self) -> Option<DataWindow> {
        match self.state {
            State::Data { layout, offset, .. } => Some(DataWindow {
                offset,
                remaining: layout.data_len - offset,
            }),
            _ => None,
        }
    }

    /// Consumes bytes from `input`. Returns how many were used and at most one event; stops
    /// after an event so the caller can act on it (e.g. choose the data destination) before
    /// feeding the rest. Data bytes are handed to `sink`. An error is final: report it (FES)
    /// and close.
    pub fn feed(
        &mut self,
        input: &[u8],
        sink: &mut dyn DataSink,
    ) -> Result<(usize, Option<Event>), PduError> {
        let mut used = 0;
        while used < input.len() {
            let rest = &input[used..];
            match self.state {
                State::Failed => return Ok((used, None)),
                // At a PDU boundary with the whole header in the input (the usual case with
                // large socket reads): parse it in place instead of assembling it in `buf`.
                State::Common if self.have == 0 && rest.len() >= COMMON_HEADER_LEN => {
                    let (n, ev) = self.header_in_place(rest)?;
                    used += n;
                    if ev.is_some() {
                        return Ok((used, ev));
                    }
                }
                State::Common | State::Header(_) => {
                    let want = match self.state {
                        State::Header(layout) => layout.header_bytes,
                        _ => COMMON_HEADER_LEN,
                    };
                    let n = (want - self.have).min(rest.len());
                    self.buf[self.have..self.have + n].copy_from_slice(&rest[..n]);
                    self.have += n;
                    used += n;
                    if self.have == want {
                        if let Some(ev) = self.header_progress()? {
                            return Ok((used, Some(ev)));
                        }
                    }
                }
                State::Pad { layout, remaining } => {
                    let n = remaining.min(rest.len());
                    used += n;
                    self.state = if n == remaining {
                        self.data_state(layout)
                    } else {
                        State::Pad {
                            layout,
                            remaining: remaining - n,
                        }
                    };
                }
                State::Data { layout, offset, .. } => {
                    let n = ((layout.data_len - offset) as usize).min(rest.len());
                    sink.write(offset, &rest[..n]);
                    used += n;
                    if let Some(ev) = self.data_placed(&rest[..n]) {
                        return Ok((used, Some(ev)));
                    }
                }
                State::DataDigest { crc, have } => {
                    let n = (DIGEST_LEN - have).min(rest.len());
                    self.ddgst[have..have + n].copy_from_slice(&rest[..n]);
                    used += n;
                    if have + n == DIGEST_LEN {
                        let received = u32::from_le_bytes(self.ddgst);
                        self.reset();
                        return Ok((
                            used,
                            Some(Event::DataComplete {
                                digest_ok: received == crc,
                            }),
                        ));
                    }
                    self.state = State::DataDigest {
                        crc,
                        have: have + n,
                    };
                }
            }
        }
        Ok((used, None))
    }

    /// Accounts for data bytes the caller placed itself (read from the socket straight into
    /// the destination); `placed` are those bytes, for the data digest. Returns the
    /// completion event when the PDU's data (and no digest) is done. Bytes beyond the
    /// window are ignored: callers size their reads with [`Receiver::data_window`].
    pub fn data_placed(&mut self, placed: &[u8]) -> Option<Event> {
        let State::Data {
            layout,
            offset,
            crc,
        } = self.state
        else {
            return None;
        };
        let n = placed.len().min((layout.data_len - offset) as usize);
        let crc = if layout.data_digest {
            digest_append(crc, &placed[..n])
        } else {
            crc
        };
        let offset = offset + n as u32;
        if offset < layout.data_len {
            self.state = State::Data {
                layout,
                offset,
                crc,
            };
            return None;
        }
        if layout.data_digest {
            self.state = State::DataDigest { crc, have: 0 };
            None
        } else {
            self.reset();
            Some(Event::DataComplete { digest_ok: true })
        }
    }

    fn reset(&mut self) {
        self.state = State::Common;
        if self.have > 0 {
            self.last = self.have;
        }
        self.have = 0;
    }

    fn data_state(&self, layout: PduLayout) -> State {
        State::Data {
            layout,
            offset: 0,
            // The CRC32C of no bytes (what `digest_append` continues from); a constant, so
            // connections without data digests compute nothing per PDU.
            crc: EMPTY_DIGEST,
        }
    }

    fn fail(&mut self, e: PduError) -> Result<Option<Event>, PduError> {
        self.state = State::Failed;
        Err(e)
    }

    /// The common header `ch` arrived: validate it and the PDU sequence.
    fn common(&mut self, ch: &[u8; COMMON_HEADER_LEN]) -> Result<PduLayout, PduError> {
        let ch = CommonHeader::from_bytes(ch);
        let layout = ch.validate(self.role, self.digests, self.pda, self.limits)?;
        self.check_sequence(layout.pdu_type)?;
        Ok(layout)
    }

    /// `header` (all `layout.header_bytes` of it) arrived: check HDGST and decode.
    fn parse(layout: &PduLayout, header: &[u8]) -> Result<PduHeader, PduError> {
        let hlen = layout.pdu_type.header_len().min(layout.header_bytes);
        let is_term = matches!(layout.pdu_type, PduType::H2CTermReq | PduType::C2HTermReq);
        if !is_term && layout.header_bytes > hlen {
            // §3.6.1.2: HDGST covers the HLEN header bytes.
            let computed = digest(&header[..hlen]);
            let mut got = [0u8; DIGEST_LEN];
            got.copy_from_slice(&header[hlen..hlen + DIGEST_LEN]);
            let received = u32::from_le_bytes(got);
            if received != computed {
                return Err(PduError::HeaderDigest { received, computed });
            }
        }
        let header = if is_term { header } else { &header[..hlen] };
        PduHeader::decode(layout, header)
    }

    /// The header is done: on to its pad / data, or to the next PDU.
    fn header_done(&mut self, layout: PduLayout, header: PduHeader) -> Event {
        let data_len = layout.data_len;
        if data_len == 0 {
            self.reset();
        } else if layout.pad > 0 {
            self.state = State::Pad {
                layout,
                remaining: layout.pad,
            };
        } else {
            self.state = self.data_state(layout);
        }
        Event::Pdu { header, data_len }
    }

    /// `rest` starts at a PDU boundary and holds at least the common header. When it holds
    /// the whole header too, that is parsed where it lies; otherwise the slow path continues
    /// from the common header. Either way `buf` holds what was consumed, to be quoted in a
    /// termination request ([`Receiver::header_bytes`]) exactly as when assembled.
    fn header_in_place(&mut self, rest: &[u8]) -> Result<(usize, Option<Event>), PduError> {
        let mut ch = [0u8; COMMON_HEADER_LEN];
        ch.copy_from_slice(&rest[..COMMON_HEADER_LEN]);
        self.buf[..COMMON_HEADER_LEN].copy_from_slice(&ch);
        self.have = COMMON_HEADER_LEN;
        let layout = match self.common(&ch) {
            Ok(l) => l,
            Err(e) => {
                self.fail(e)?;
                return Ok((COMMON_HEADER_LEN, None));
            }
        };
        let n = layout.header_bytes;
        let Some(header) = rest.get(..n) else {
            self.state = State::Header(layout);
            return Ok((COMMON_HEADER_LEN, None));
        };
        self.buf[COMMON_HEADER_LEN..n].copy_from_slice(&header[COMMON_HEADER_LEN..]);
        self.have = n;
        match Self::parse(&layout, header) {
            Ok(h) => Ok((n, Some(self.header_done(layout, h)))),
            Err(e) => {
                self.fail(e)?;
                Ok((n, None))
            }
        }
    }

    /// A header stage is complete: validate and move on.
    fn header_progress(&mut self) -> Result<Option<Event>, PduError> {
        match self.state {
            State::Common => {
                let mut ch = [0u8; COMMON_HEADER_LEN];
                ch.copy_from_slice(&self.buf[..COMMON_HEADER_LEN]);
                let layout = match self.common(&ch) {
                    Ok(l) => l,
                    Err(e) => return self.fail(e),
                };
                self.state = State::Header(layout);
                if layout.header_bytes == COMMON_HEADER_LEN {
                    return self.header_progress();
                }
                Ok(None)
            }
            State::Header(layout) => match Self::parse(&layout, &self.buf[..layout.header_bytes]) {
                Ok(h) => Ok(Some(self.header_done(layout, h))),
                Err(e) => self.fail(e),
            },
            _ => Ok(None),
        }
    }

    /// The IC exchange comes first and only once (§3.3); termination is always allowed.
    fn check_sequence(&self, pdu_type: PduType) -> Result<(), PduError> {
        let ic = matches!(pdu_type, PduType::IcReq | PduType::IcResp);
        let term = matches!(pdu_type, PduType::H2CTermReq | PduType::C2HTermReq);
        if term || ic != self.established {
            return Ok(());
        }
        Err(PduError::UnexpectedType {
            pdu_type,
            why: if ic {
                "connection already initialized"
            } else {
                "connection not initialized"
            },
        })
    }
}

#[cfg(test)]
mod tests;
