//! A small blocking NVMe/TCP initiator (host side), for tests and the load generator.
//!
//! It speaks the same PDU codec and receive state machine as the target, with the roles
//! swapped, and keeps several commands outstanding: [`Client::submit`] sends a command and
//! returns its CID, [`Client::reap`] waits for the next completion while answering R2Ts and
//! collecting C2HData on the way. [`Client::send_raw`] / [`Client::recv_pdu`] bypass all of
//! that to send malformed PDUs and watch the exact reaction. [`Client::connect_tls`] runs
//! the same over TLS 1.3 with a PSK ([`TlsParams`]), record layer in user space.

mod commands;

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use nvme::wire::{Cqe, SglDescriptor, Sqe, Status};
use nvmfd_auth::psk::{ConfiguredPsk, Derivation, Identity};
use openssl::ssl::SslStream;
use thiserror::Error;
use zeroize::Zeroizing;

use crate::tcp::pdu::{
    encode_header, encode_pdu, DataHeader, Digests, Fes, IcReq, PduError, PduHeader, PduType,
    RecvLimits, Role, TermReq, MIN_MAXH2CDATA,
};
use crate::tcp::record::{self, LinkIo, RecordLayer};
use crate::tcp::recv::{DataSink, Event, Receiver};
pub use crate::tcp::tls::HostBinding;
use crate::tcp::tls::{client_handshake, TlsError};

/// In-capsule data limit of the admin queue (NVMe/TCP 1.0 §2.2: 8 KiB; Linux
/// `NVME_TCP_ADMIN_CCSZ`).
pub const ADMIN_IN_CAPSULE: u32 = 8192;

/// Largest C2HData PDU the client accepts (bounds its receive buffer per PDU).
const MAX_C2H_DATA: u32 = 64 << 20;

/// Connection options.
#[derive(Debug, Clone, Copy)]
pub struct ClientOptions {
    pub header_digest: bool,
    pub data_digest: bool,
    /// Host PDU data alignment to ask for (0's based dwords).
    pub hpda: u8,
    /// How long a blocking receive may wait.
    pub timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            header_digest: false,
            data_digest: false,
            hpda: 0,
            timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("malformed PDU from the controller: {0}")]
    Pdu(#[from] PduError),
    #[error("controller terminated the connection: FES {fes:#x}, FEI {fei:#x}")]
    Terminated { fes: u16, fei: u32 },
    #[error("connection closed by the controller")]
    Closed,
    #[error("timed out waiting for the controller")]
    Timeout,
    #[error("unexpected {0:?} PDU")]
    UnexpectedPdu(PduType),
    #[error("ICResp refused: {0}")]
    BadIcResp(&'static str),
    #[error("PDU for unknown command id {0:#x}")]
    UnknownCid(u16),
    #[error(
        "controller data outside the command buffer (cid {cid:#x}, offset {offset}, len {len})"
    )]
    DataOutOfRange { cid: u16, offset: u32, len: u32 },
    #[error("no free command id")]
    NoCid,
    #[error("command failed with {0}")]
    Status(Status),
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
}

/// What the host offers in the TLS handshake: the PSK identity and the TLS PSK derived for
/// it (NVMe/TCP 1.1 §3.6.1.3), bound as `binding` says (to the identity's hash, or as the
/// Linux host's tlshd 1.0 binds a SHA-384 PSK).
#[derive(Clone)]
pub struct TlsParams {
    pub identity: Identity,
    pub psk: Zeroizing<Vec<u8>>,
    pub binding: HostBinding,
}

impl std::fmt::Debug for TlsParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsParams")
            .field("identity", &self.identity.to_string())
            .field("binding", &self.binding)
            .finish_non_exhaustive()
    }
}

impl TlsParams {
    /// The identity the Linux host offers for a configured PSK (`nvme gen-tls-key
    /// --identity=1`, the version with the PSK digest; `version_1 = false`: the version 0
    /// identity) and its TLS PSK under `derivation`.
    pub fn new(
        key: &ConfiguredPsk,
        hostnqn: &str,
        subnqn: &str,
        version_1: bool,
        derivation: Derivation,
    ) -> Option<Self> {
        let identity = if version_1 {
            Identity::v1(key, hostnqn, subnqn, derivation)
        } else {
            Identity::v0(key.hash(), hostnqn, subnqn)
        };
        let psk = key.tls_psk(&identity, derivation)?;
        Some(TlsParams {
            identity,
            psk,
            binding: HostBinding::Identity,
        })
    }
}

/// A host's blocking byte stream to a controller: the socket, or a TLS session on it (record
/// layer in user space). nvmfd-perf takes it over non-blocking after the handshakes
/// ([`HostStream::into_nonblocking`]).
pub enum HostStream {
    Plain(TcpStream),
    Tls(Box<SslStream<LinkIo>>),
}

impl HostStream {
    /// TCP connect (TCP_NODELAY, blocking receives bounded by `timeout`), then the TLS
    /// handshake offering `tls` when given.
    pub fn connect(
        addr: SocketAddr,
        timeout: Duration,
        tls: Option<&TlsParams>,
    ) -> Result<Self, ClientError> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        let Some(tls) = tls else {
            stream.set_read_timeout(Some(timeout))?;
            return Ok(HostStream::Plain(stream));
        };
        let session = client_handshake(stream, &tls.identity, &tls.psk, tls.binding, timeout)?
            .into_blocking();
        let link = HostStream::Tls(Box::new(session));
        link.socket().set_read_timeout(Some(timeout))?;
        link.socket().set_write_timeout(None)?;
        Ok(link)
    }

    pub fn socket(&self) -> &TcpStream {
        match self {
            HostStream::Plain(s) => s,
            HostStream::Tls(tls) => tls
                .get_ref()
                .stream()
                .expect("a blocking session keeps its socket"),
        }
    }

    /// The socket, non-blocking and without timeouts, and the session's record layer (None
    /// in plaintext).
    pub fn into_nonblocking(self) -> io::Result<(TcpStream, Option<Box<RecordLayer>>)> {
        match self {
            HostStream::Plain(s) => {
                s.set_read_timeout(None)?;
                s.set_nonblocking(true)?;
                Ok((s, None))
            }
            HostStream::Tls(tls) => {
                let (s, layer) = RecordLayer::new(*tls)?;
                Ok((s, Some(Box::new(layer))))
            }
        }
    }
}

impl Read for HostStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            HostStream::Plain(s) => s.read(buf),
            HostStream::Tls(tls) => tls.read(buf),
        }
    }
}

impl Write for HostStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            HostStream::Plain(s) => s.write(buf),
            HostStream::Tls(tls) => tls.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            HostStream::Plain(s) => s.flush(),
            HostStream::Tls(tls) => tls.flush(),
        }
    }
}

impl ClientError {
    /// The FES of a termination request from the controller, if that is what ended things.
    pub fn fes(&self) -> Option<Fes> {
        match self {
            Self::Terminated { fes, .. } => Fes::from_u16(*fes),
            _ => None,
        }
    }
}

/// Data a command moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataOut {
    None,
    /// Host to controller; in-capsule when it fits the queue's in-capsule limit, else R2T.
    Write(Vec<u8>),
    /// Host to controller by R2T regardless of size.
    WriteR2t(Vec<u8>),
    /// Controller to host, this many bytes.
    Read(u32),
}

/// A finished command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub cid: u16,
    pub cqe: Cqe,
    /// Data returned by a read (C2HData), as many bytes as the command asked for.
    pub data: Vec<u8>,
    /// Completed by a C2HData SUCCESS flag (no response capsule; NVMe/TCP 1.0 §3.6.2.9).
    pub by_success_flag: bool,
    /// A C2HData data digest did not match.
    pub data_digest_error: bool,
}

/// A received PDU, raw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPdu {
    pub header: PduHeader,
    pub data: Vec<u8>,
    /// False when the data digest mismatched.
    pub digest_ok: bool,
}

#[derive(Debug)]
struct Pending {
    write: Vec<u8>,
    read: Vec<u8>,
    read_done: u32,
    digest_error: bool,
}

struct VecSink<'a>(&'a mut Vec<u8>);

impl DataSink for VecSink<'_> {
    fn write(&mut self, _offset: u32, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

/// A blocking NVMe/TCP connection to one controller queue.
pub struct Client {
    stream: HostStream,
    rx: Receiver,
    digests: Digests,
    /// Controller PDU data alignment in bytes.
    cpda: usize,
    maxh2cdata: u32,
    /// Largest write sent in-capsule on this queue (IOCCSZ-derived for I/O queues).
    pub in_capsule_limit: u32,
    rbuf: Vec<u8>,
    rpos: usize,
    rend: usize,
    next_cid: u16,
    pending: HashMap<u16, Pending>,
    done: VecDeque<Completion>,
}

impl Client {
    /// Opens the TCP connection and runs the ICReq/ICResp exchange (NVMe/TCP 1.0 §3.3).
    pub fn connect(addr: SocketAddr, opts: ClientOptions) -> Result<Self, ClientError> {
        let c = Self::connect_raw(addr, opts.timeout)?;
        c.initialize(opts)
    }

    /// [`Client::connect`] over TLS: the handshake offering `tls`, then ICReq inside it.
    pub fn connect_tls(
        addr: SocketAddr,
        opts: ClientOptions,
        tls: &TlsParams,
    ) -> Result<Self, ClientError> {
        let c = Self::connect_raw_tls(addr, opts.timeout, tls)?;
        c.initialize(opts)
    }

    /// A TLS connection before ICReq.
    pub fn connect_raw_tls(
        addr: SocketAddr,
        timeout: Duration,
        tls: &TlsParams,
    ) -> Result<Self, ClientError> {
        let stream = HostStream::connect(addr, timeout, Some(tls))?;
        Ok(Self::unestablished(stream))
    }

    /// Sends a TLS KeyUpdate (asking for the controller's too when `request_peer`); an error
    /// on a plaintext connection.
    pub fn key_update(&mut self, request_peer: bool) -> Result<(), ClientError> {
        match &mut self.stream {
            HostStream::Tls(tls) => Ok(record::key_update(tls, request_peer)?),
            HostStream::Plain(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "KeyUpdate on a plaintext connection",
            )
            .into()),
        }
    }

    fn initialize(mut self, opts: ClientOptions) -> Result<Self, ClientError> {
        let want = Digests {
            header: opts.header_digest,
            data: opts.data_digest,
        };
        self.send_raw(
            &IcReq {
                pfv: 0,
                hpda: opts.hpda,
                dgst: want.to_dgst(),
                maxr2t: 0,
            }
            .encode(),
        )?;
        let resp = match self.recv_pdu()?.header {
            PduHeader::IcResp(r) => r,
            other => return Err(ClientError::UnexpectedPdu(other.pdu_type())),
        };
        if resp.pfv != 0 {
            return Err(ClientError::BadIcResp("PFV is not 0"));
        }
        if resp.maxh2cdata < MIN_MAXH2CDATA || resp.maxh2cdata % 4 != 0 {
            return Err(ClientError::BadIcResp("MAXH2CDATA below 4096 or unaligned"));
        }
        if resp.cpda > 31 {
            return Err(ClientError::BadIcResp("CPDA out of range"));
        }
        if Digests::from_dgst(resp.dgst) != want {
            return Err(ClientError::BadIcResp(
                "digests differ from the ones asked for",
            ));
        }
        self.digests = want;
        self.cpda = (resp.cpda as usize + 1) * 4;
        self.maxh2cdata = resp.maxh2cdata;
        self.rx.establish(want, (opts.hpda as usize + 1) * 4);
        Ok(self)
    }

    /// A connection before ICReq, for tests that want to send their own first PDU.
    pub fn connect_raw(addr: SocketAddr, timeout: Duration) -> Result<Self, ClientError> {
        Ok(Self::unestablished(HostStream::connect(
            addr, timeout, None,
        )?))
    }

    fn unestablished(stream: HostStream) -> Self {
        Self {
            stream,
            rx: Receiver::new(
                Role::Host,
                RecvLimits {
                    max_capsule_data: 0,
                    max_data_pdu: MAX_C2H_DATA,
                },
            ),
            digests: Digests::default(),
            cpda: 4,
            maxh2cdata: MIN_MAXH2CDATA,
            in_capsule_limit: ADMIN_IN_CAPSULE,
            rbuf: vec![0; 64 * 1024],
            rpos: 0,
            rend: 0,
            next_cid: 0,
            pending: HashMap::new(),
            done: VecDeque::new(),
        }
    }

    pub fn digests(&self) -> Digests {
        self.digests
    }

    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.socket().local_addr()
    }

    /// A second handle on the socket, to send from another thread while this one receives
    /// (e.g. flooding the controller with commands without reading responses meanwhile).
    /// On a TLS connection it is the socket under the session: what is written there bypasses
    /// the record layer (garbage or truncated records for hostile tests).
    pub fn writer(&self) -> io::Result<TcpStream> {
        self.stream.socket().try_clone()
    }

    /// Sends bytes as they are (malformed PDUs welcome).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Encodes a PDU with this connection's digests and the controller's alignment.
    pub fn encode(&self, header: &PduHeader, data: &[u8]) -> Vec<u8> {
        encode_pdu(header, data, self.digests, self.cpda)
    }

    /// Receives the next PDU as it is. A C2HTermReq comes back as a PDU here (not an error);
    /// end of stream at a PDU boundary is `ClientError::Closed`.
    pub fn recv_pdu(&mut self) -> Result<RawPdu, ClientError> {
        let mut data = Vec::new();
        let mut header: Option<PduHeader> = None;
        loop {
            if self.rpos == self.rend {
                self.fill()?;
            }
            let (used, ev) = self
                .rx
                .feed(&self.rbuf[self.rpos..self.rend], &mut VecSink(&mut data))?;
            self.rpos += used;
            match ev {
                Some(Event::Pdu {
                    header: h,
                    data_len,
                }) => {
                    if data_len == 0 {
                        return Ok(RawPdu {
                            header: h,
                            data,
                            digest_ok: true,
                        });
                    }
                    data.reserve(data_len as usize);
                    header = Some(h);
                }
                Some(Event::DataComplete { digest_ok }) => {
                    // The receiver announces data only after a header event.
                    let Some(header) = header.take() else {
                        return Err(ClientError::UnexpectedPdu(PduType::C2HData));
                    };
                    return Ok(RawPdu {
                        header,
                        data,
                        digest_ok,
                    });
                }
                None => {}
            }
        }
    }

    /// Waits for the connection to be closed by the controller, discarding anything that
    /// arrives first; returns the termination request if one came.
    pub fn expect_close(&mut self) -> Result<Option<TermReq>, ClientError> {
        let mut term = None;
        loop {
            match self.recv_pdu() {
                Ok(RawPdu {
                    header: PduHeader::C2HTermReq(t),
                    ..
                }) => term = Some(t),
                Ok(_) => {}
                Err(ClientError::Closed) => return Ok(term),
                Err(ClientError::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Ok(term)
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn fill(&mut self) -> Result<(), ClientError> {
        self.rpos = 0;
        self.rend = 0;
        let n = match self.stream.read(&mut self.rbuf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ClientError::Timeout)
            }
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(ClientError::Closed);
        }
        self.rend = n;
        Ok(())
    }

    fn alloc_cid(&mut self) -> Result<u16, ClientError> {
        for _ in 0..=u16::MAX as u32 {
            let cid = self.next_cid;
            self.next_cid = self.next_cid.wrapping_add(1);
            if !self.pending.contains_key(&cid) {
                return Ok(cid);
            }
        }
        Err(ClientError::NoCid)
    }

    /// Sends `sqe` (its CID and data pointer are filled in here) and returns the CID.
    pub fn submit(&mut self, mut sqe: Sqe, data: DataOut) -> Result<u16, ClientError> {
        let cid = self.alloc_cid()?;
        sqe.cid = cid;
        sqe.flags = (sqe.flags & 0x3f) | 0x40; // PSDT 01b: SGL (NVMe-oF 1.1 §2.2)
        let mut pending = Pending {
            write: Vec::new(),
            read: Vec::new(),
            read_done: 0,
            digest_error: false,
        };
        let capsule_data = match data {
            DataOut::None => {
                sqe.dptr = SglDescriptor::transport_data_block(0);
                Vec::new()
            }
            DataOut::Write(d) if d.len() as u64 <= self.in_capsule_limit as u64 => {
                sqe.dptr = SglDescriptor::in_capsule(0, d.len() as u32);
                d
            }
            DataOut::Write(d) | DataOut::WriteR2t(d) => {
                sqe.dptr = SglDescriptor::transport_data_block(d.len() as u32);
                pending.write = d;
                Vec::new()
            }
            DataOut::Read(n) => {
                sqe.dptr = SglDescriptor::transport_data_block(n);
                pending.read = vec![0; n as usize];
                Vec::new()
            }
        };
        let pdu = self.encode(&PduHeader::CapsuleCmd(sqe), &capsule_data);
        self.pending.insert(cid, pending);
        self.send_raw(&pdu)?;
        Ok(cid)
    }

    /// Sends a command whose SQE is used exactly as given (CID, SGL and all) with
    /// `capsule_data` in-capsule; its completion is tracked under the SQE's CID.
    pub fn submit_exact(
        &mut self,
        sqe: Sqe,
        capsule_data: &[u8],
        read_len: u32,
    ) -> Result<(), ClientError> {
        self.pending.insert(
            sqe.cid,
            Pending {
                write: Vec::new(),
                read: vec![0; read_len as usize],
                read_done: 0,
                digest_error: false,
            },
        );
        let pdu = self.encode(&PduHeader::CapsuleCmd(sqe), capsule_data);
        self.send_raw(&pdu)
    }

    /// Commands submitted and not yet reaped.
    pub fn outstanding(&self) -> usize {
        self.pending.len() + self.done.len()
    }

    /// Waits for the next completion, servicing R2Ts and C2HData meanwhile.
    pub fn reap(&mut self) -> Result<Completion, ClientError> {
        loop {
            if let Some(c) = self.done.pop_front() {
                return Ok(c);
            }
            self.process_one()?;
        }
    }

    /// Waits for the completion of `cid` (others are kept for later `reap`s).
    pub fn wait(&mut self, cid: u16) -> Result<Completion, ClientError> {
        loop {
            if let Some(i) = self.done.iter().position(|c| c.cid == cid) {
                return Ok(self.done.remove(i).expect("index from position"));
            }
            self.process_one()?;
        }
    }

    /// Submits and waits.
    pub fn execute(&mut self, sqe: Sqe, data: DataOut) -> Result<Completion, ClientError> {
        let cid = self.submit(sqe, data)?;
        self.wait(cid)
    }

    fn process_one(&mut self) -> Result<(), ClientError> {
        let pdu = self.recv_pdu()?;
        match pdu.header {
            PduHeader::CapsuleResp(cqe) => {
                let p = self
                    .pending
                    .remove(&cqe.cid)
                    .ok_or(ClientError::UnknownCid(cqe.cid))?;
                self.done.push_back(Completion {
                    cid: cqe.cid,
                    cqe,
                    data: p.read,
                    by_success_flag: false,
                    data_digest_error: p.digest_error,
                });
            }
            PduHeader::C2HData { hdr, last, success } => {
                let p = self
                    .pending
                    .get_mut(&hdr.cccid)
                    .ok_or(ClientError::UnknownCid(hdr.cccid))?;
                let range = hdr.datao as usize..hdr.datao as usize + pdu.data.len();
                let out_of_range = ClientError::DataOutOfRange {
                    cid: hdr.cccid,
                    offset: hdr.datao,
                    len: hdr.datal,
                };
                p.read
                    .get_mut(range)
                    .ok_or(out_of_range)?
                    .copy_from_slice(&pdu.data);
                p.read_done += hdr.datal;
                p.digest_error |= !pdu.digest_ok;
                if last && success {
                    let p = self.pending.remove(&hdr.cccid).expect("present above");
                    self.done.push_back(Completion {
                        cid: hdr.cccid,
                        cqe: Cqe {
                            cid: hdr.cccid,
                            ..Cqe::default()
                        },
                        data: p.read,
                        by_success_flag: true,
                        data_digest_error: p.digest_error,
                    });
                }
            }
            PduHeader::R2T(r2t) => self.answer_r2t(r2t)?,
            PduHeader::C2HTermReq(t) => {
                return Err(ClientError::Terminated {
                    fes: t.fes,
                    fei: t.fei,
                })
            }
            other => return Err(ClientError::UnexpectedPdu(other.pdu_type())),
        }
        Ok(())
    }

    /// Sends the H2CData PDUs an R2T asks for, each at most MAXH2CDATA (§3.6.2.8).
    fn answer_r2t(&mut self, r2t: crate::tcp::pdu::R2t) -> Result<(), ClientError> {
        let p = self
            .pending
            .get(&r2t.cccid)
            .ok_or(ClientError::UnknownCid(r2t.cccid))?;
        let end = r2t.r2to as usize + r2t.r2tl as usize;
        if end > p.write.len() || r2t.r2tl == 0 {
            return Err(ClientError::DataOutOfRange {
                cid: r2t.cccid,
                offset: r2t.r2to,
                len: r2t.r2tl,
            });
        }
        let mut off = r2t.r2to as usize;
        let mut out = Vec::new();
        while off < end {
            let n = (end - off).min(self.maxh2cdata as usize);
            let chunk = &p.write[off..off + n];
            let h = PduHeader::H2CData {
                hdr: DataHeader {
                    cccid: r2t.cccid,
                    ttag: r2t.ttag,
                    datao: off as u32,
                    datal: n as u32,
                },
                last: off + n == end,
            };
            out.extend_from_slice(encode_header(&h, self.digests, n as u32, self.cpda).as_slice());
            out.extend_from_slice(chunk);
            if self.digests.data {
                out.extend_from_slice(&crate::tcp::pdu::digest(chunk).to_le_bytes());
            }
            off += n;
        }
        self.send_raw(&out)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("peer", &self.stream.socket().peer_addr().ok())
            .field("digests", &self.digests)
            .field("outstanding", &self.pending.len())
            .finish()
    }
}
