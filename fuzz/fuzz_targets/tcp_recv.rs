//! The NVMe/TCP PDU decoder and sans-IO receive state machine (`transport::tcp::recv`) fed an
//! arbitrary byte stream, on either side of a connection.
//!
//! Input: `[cfg][limits][seed: u32][stream…]`. The stream is fed twice: whole, and split at
//! points drawn from `seed`, with the data phase alternating between the `DataSink` path and
//! the caller-placed `data_placed` path (how `TcpConnection` reads straight into a slot).
//! Oracles: both runs yield the same events, data and error (splitting must not matter);
//! every event respects the limits; and every decoded header re-encodes (`encode_pdu`) into
//! a PDU that decodes back to the same header and data.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmfd_fuzz::{Input, Splits};
use transport::tcp::pdu::{
    encode_pdu, Digests, PduError, PduHeader, PduType, RecvLimits, Role, MAX_HEADER_BUF,
};
use transport::tcp::recv::{DataSink, Event, Receiver};

#[derive(Debug, Clone, Copy)]
struct Config {
    role: Role,
    digests: Digests,
    /// Data alignment the receiver asked for (bytes).
    pda: usize,
    /// Start as if ICReq/ICResp were already exchanged.
    established: bool,
    limits: RecvLimits,
}

impl Config {
    fn from(cfg: u8, lim: u8) -> Self {
        let limit = |sel: u8| match sel & 3 {
            0 => 4096,
            1 => 8192,
            2 => 64 * 1024,
            _ => 1 << 20,
        };
        Self {
            role: if cfg & 1 == 0 {
                Role::Controller
            } else {
                Role::Host
            },
            digests: Digests {
                header: cfg & 2 != 0,
                data: cfg & 4 != 0,
            },
            established: cfg & 8 != 0,
            pda: [4, 8, 64, 128][(cfg >> 4 & 3) as usize],
            limits: RecvLimits {
                max_capsule_data: limit(lim),
                max_data_pdu: limit(lim >> 2),
            },
        }
    }

    fn receiver(&self) -> Receiver {
        let mut rx = Receiver::new(self.role, self.limits);
        if self.established {
            rx.establish(self.digests, self.pda);
        }
        rx
    }
}

/// Everything observable from one run.
#[derive(Debug, Default, PartialEq, Eq)]
struct Trace {
    events: Vec<Event>,
    /// Data of each data-carrying PDU, in order.
    data: Vec<Vec<u8>>,
    error: Option<PduError>,
}

/// Collects the data of the current PDU, checking that every write lands in its window.
struct Collect<'a> {
    buf: &'a mut Vec<u8>,
}

impl DataSink for Collect<'_> {
    fn write(&mut self, offset: u32, bytes: &[u8]) {
        assert_eq!(offset as usize, self.buf.len(), "data written out of order");
        self.buf.extend_from_slice(bytes);
    }
}

/// What a connection does on an event: the IC PDU switches digests on (`establish`), and
/// every event is checked against the limits.
fn on_event(cfg: &Config, rx: &mut Receiver, ev: &Event, trace: &mut Trace) {
    if let Event::Pdu { header, data_len } = ev {
        let limit = match header.pdu_type() {
            PduType::CapsuleCmd => cfg.limits.max_capsule_data,
            _ => cfg.limits.max_data_pdu,
        };
        assert!(
            *data_len <= limit,
            "{data_len} data bytes beyond limit {limit}"
        );
        assert!(rx.header_bytes().len() <= MAX_HEADER_BUF);
        if matches!(header, PduHeader::IcReq(_) | PduHeader::IcResp(_)) {
            rx.establish(cfg.digests, cfg.pda);
        }
        if *data_len > 0 {
            trace.data.push(Vec::new());
        }
    }
    trace.events.push(ev.clone());
}

/// Feeds `stream` in one piece (the reference run).
fn run_whole(cfg: &Config, stream: &[u8]) -> Trace {
    let mut rx = cfg.receiver();
    let mut trace = Trace::default();
    let mut pos = 0;
    let mut scratch = Vec::new();
    while pos < stream.len() {
        let buf = trace.data.last_mut().unwrap_or(&mut scratch);
        match rx.feed(&stream[pos..], &mut Collect { buf }) {
            Ok((used, ev)) => {
                pos += used;
                match ev {
                    Some(ev) => on_event(cfg, &mut rx, &ev, &mut trace),
                    None => {
                        // No event means all input was consumed (or the machine failed).
                        assert!(pos == stream.len(), "feed stopped without an event");
                    }
                }
            }
            Err(e) => {
                trace.error = Some(e);
                break;
            }
        }
    }
    trace
}

/// Feeds `stream` in pieces; data bytes go through `data_placed` when `splits` says so.
fn run_split(cfg: &Config, stream: &[u8], splits: &mut Splits) -> Trace {
    let mut rx = cfg.receiver();
    let mut trace = Trace::default();
    let mut pos = 0;
    let mut scratch = Vec::new();
    'outer: while pos < stream.len() {
        let end = (pos + splits.chunk(stream.len())).min(stream.len());
        let mut piece = &stream[pos..end];
        pos = end;
        while !piece.is_empty() {
            if let Some(w) = rx.data_window() {
                if splits.next_u32() & 1 == 0 {
                    // The caller reads data itself: at most the window, then reports it.
                    let n = piece.len().min(w.remaining as usize);
                    let buf = trace.data.last_mut().expect("a data window has a PDU");
                    assert_eq!(w.offset as usize, buf.len(), "window offset drifted");
                    buf.extend_from_slice(&piece[..n]);
                    let ev = rx.data_placed(&piece[..n]);
                    piece = &piece[n..];
                    if let Some(ev) = ev {
                        on_event(cfg, &mut rx, &ev, &mut trace);
                    }
                    continue;
                }
            }
            let buf = trace.data.last_mut().unwrap_or(&mut scratch);
            match rx.feed(piece, &mut Collect { buf }) {
                Ok((used, ev)) => {
                    assert!(used <= piece.len());
                    piece = &piece[used..];
                    if let Some(ev) = ev {
                        on_event(cfg, &mut rx, &ev, &mut trace);
                    } else {
                        assert!(piece.is_empty(), "feed stopped without an event");
                    }
                }
                Err(e) => {
                    trace.error = Some(e);
                    break 'outer;
                }
            }
        }
    }
    trace
}

/// The sender's side of every decoded header: encoding it again (with the digests and
/// alignment in effect) must give a PDU this receiver decodes to the same header and data.
fn check_round_trip(cfg: &Config, trace: &Trace) {
    let mut data = trace.data.iter();
    let mut established = cfg.established;
    for ev in &trace.events {
        let Event::Pdu { header, data_len } = ev else {
            continue;
        };
        let payload: &[u8] = if *data_len > 0 {
            match data.next() {
                Some(d) if d.len() == *data_len as usize => d,
                // The stream ended inside this PDU's data.
                _ => return,
            }
        } else {
            &[]
        };
        let is_ic = matches!(header, PduHeader::IcReq(_) | PduHeader::IcResp(_));
        let digests = if established && !is_ic {
            cfg.digests
        } else {
            Digests::default()
        };
        let bytes = encode_pdu(header, payload, digests, cfg.pda);
        let again = run_whole(
            &Config {
                established: established && !is_ic,
                ..*cfg
            },
            &bytes,
        );
        assert_eq!(again.error, None, "re-encoded {header:?} refused");
        match again.events.first() {
            Some(Event::Pdu {
                header: h,
                data_len: n,
            }) => {
                assert_eq!(h, header, "header changed in a round trip");
                assert_eq!(n, data_len);
            }
            other => panic!("re-encoded {header:?} gave {other:?}"),
        }
        if *data_len > 0 {
            assert_eq!(again.data.first().map(Vec::as_slice), Some(payload));
            assert_eq!(
                again.events.get(1),
                Some(&Event::DataComplete { digest_ok: true })
            );
        }
        established |= is_ic;
    }
}

fuzz_target!(|bytes: &[u8]| {
    let mut input = Input::new(bytes);
    let cfg = Config::from(input.u8(), input.u8());
    let mut splits = Splits::new(input.u32());
    let stream = input.rest();

    let whole = run_whole(&cfg, stream);
    let split = run_split(&cfg, stream, &mut splits);
    assert_eq!(whole, split, "splitting the stream changed the outcome");
    check_round_trip(&cfg, &whole);
});
