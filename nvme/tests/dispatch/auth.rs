//! In-band authentication through the queue contract: Connect's AUTHREQ, the gate on every
//! queue, whole DH-HMAC-CHAP exchanges against the host role of nvmfd-auth, re-authentication,
//! key rotation and host removal by reload, and hostile Authentication Send/Receive commands.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use nvme::auth::{FailureLimiter, HostAuth, CONNECT_AUTHREQ_ATR};
use nvme::queue::{TerminateReason, TransportKind};
use nvme::spec::{cc, fctype, reg};
use nvme::target::{Target, TargetConfig};
use nvme::wire::{Sqe, Status};
use nvmfd_auth::host::{Host as AuthHost, HostError};
use nvmfd_auth::wire::{self, Failure};
use nvmfd_auth::{DhGroup, FailureReason, HashId, Secret};

use crate::harness::*;

const AL: u32 = 4096;
const AUTH_REQUIRED: Status = Status::AUTHENTICATION_REQUIRED.with_dnr();

fn keyed_config(host_key: &Secret, ctrl_key: Option<&Secret>) -> TargetConfig {
    let mut cfg = basic_config();
    let s = &mut cfg.subsystems[0];
    s.allow_any_host = false;
    s.allowed_hosts = vec![HOSTNQN.into()];
    s.host_auth = BTreeMap::from([(
        HOSTNQN.to_owned(),
        HostAuth {
            host_key: host_key.clone(),
            ctrl_key: ctrl_key.cloned(),
            hashes: HashId::ALL.to_vec(),
            dh_groups: vec![DhGroup::Ffdhe2048, DhGroup::Null],
        },
    )]);
    cfg
}

fn auth_sqe(fct: u8, secp: u8, length: u32) -> Sqe {
    Sqe {
        cdw10: u32::from_le_bytes([0, wire::SPSP0_AUTH, wire::SPSP1_AUTH, secp]),
        cdw11: length,
        ..fabrics_sqe(fct)
    }
}

fn send(h: &mut Host, payload: &[u8]) -> Status {
    let mut buf = payload.to_vec();
    let s = auth_sqe(
        fctype::AUTHENTICATION_SEND,
        wire::SECP_AUTH,
        buf.len() as u32,
    );
    h.status(s, &mut buf)
}

fn receive(h: &mut Host) -> Vec<u8> {
    let mut buf = vec![0u8; AL as usize];
    let r = h.run(
        auth_sqe(fctype::AUTHENTICATION_RECEIVE, wire::SECP_AUTH, AL),
        &mut buf,
    );
    assert_eq!(r.cqe.status, Status::SUCCESS, "Authentication Receive");
    assert_eq!(r.data_len, AL);
    buf
}

/// One whole transaction through Authentication Send/Receive commands.
fn authenticate(h: &mut Host, host: &mut AuthHost, tid: u16) -> Result<(), HostError> {
    assert_eq!(send(h, &host.negotiate(tid)), Status::SUCCESS);
    let reply = host.reply(&receive(h))?;
    assert_eq!(send(h, &reply), Status::SUCCESS);
    let success1 = receive(h);
    match host.success1(&success1) {
        Ok(Some(s2)) => assert_eq!(send(h, &s2), Status::SUCCESS),
        Ok(None) => {}
        // The host answers a bad R2 with AUTH_Failure2; a Failure1 ends the transaction.
        Err(e @ HostError::ControllerResponse) => {
            send(h, &host.failure2(FailureReason::Failed as u8));
            return Err(e);
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

fn failure1(msg: &[u8]) -> Failure {
    let f = Failure::decode(&msg[..wire::FAILURE_LEN]).expect("AUTH_Failure1");
    assert_eq!(f.auth_id, wire::MSG_FAILURE1);
    assert!(
        msg[wire::FAILURE_LEN..].iter().all(|b| *b == 0),
        "zero-filled"
    );
    f
}

/// Connects the admin queue without enabling it; returns it and its Connect DW0.
fn connect_admin(t: &Arc<Target>, remote: SocketAddr) -> (Host, u32) {
    let mut p = peer(TransportKind::Tcp, 1);
    p.remote = remote;
    let mut h = Host::new(t, p);
    let r = h.connect(0, 31, 0, 0, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::SUCCESS);
    (h, r.cqe.dw0)
}

fn remote(last: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)), 40000)
}

#[test]
fn every_queue_authenticates_before_anything_but_fabrics_commands() {
    let b = Backends::new();
    let hk = Secret::generate(Some(HashId::Sha256), 32).unwrap();
    let ck = Secret::generate(None, 48).unwrap();
    let t = target_with(keyed_config(&hk, Some(&ck)), &b);
    let (mut a, dw0) = connect_admin(&t, remote(2));
    assert_eq!(
        dw0 & CONNECT_AUTHREQ_ATR,
        CONNECT_AUTHREQ_ATR,
        "AUTHREQ.ATR"
    );
    let cntlid = dw0 as u16;
    // Fabrics commands go through; anything else gets Authentication Required with DNR.
    assert_eq!(a.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    let s = a.status(identify(1, 0, 0), &mut [0; 4096]);
    assert_eq!(s, AUTH_REQUIRED);
    assert_eq!(s.to_field() >> 1, 0x4191, "SCT 1h SC 91h DNR");
    let mut host = AuthHost::new(hk.clone(), Some(ck.clone()), HOSTNQN, SUBNQN);
    authenticate(&mut a, &mut host, 1).unwrap();
    assert_eq!(a.status(identify(1, 0, 0), &mut [0; 4096]), Status::SUCCESS);
    // Set Features Number of Queues, then an I/O queue: it authenticates on its own.
    let nq = Sqe {
        cdw10: 0x07,
        cdw11: 0x0001_0001,
        ..sqe(0x09, 0)
    };
    assert_eq!(a.status(nq, &mut []), Status::SUCCESS);
    let mut q = Host::new(&t, peer(TransportKind::Tcp, 1));
    let r = q.connect(1, 127, 0, 0, &connect_data(SUBNQN, HOSTNQN, cntlid));
    assert_eq!(r.cqe.status, Status::SUCCESS);
    assert_eq!(r.cqe.dw0, u32::from(cntlid) | CONNECT_AUTHREQ_ATR);
    let mut block = vec![0u8; 512];
    assert_eq!(q.status(rw(0x02, 1, 0, 1), &mut block), AUTH_REQUIRED);
    authenticate(&mut q, &mut host, 2).unwrap();
    assert_eq!(q.status(rw(0x02, 1, 0, 1), &mut block), Status::SUCCESS);
    assert_eq!(t.auth_failures().total(), 0);
}

#[test]
fn a_host_without_a_key_is_not_asked_to_authenticate() {
    let b = Backends::new();
    let t = target_with(basic_config(), &b);
    let (mut a, dw0) = connect_admin(&t, remote(2));
    assert_eq!(dw0 & CONNECT_AUTHREQ_ATR, 0);
    assert_eq!(a.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    assert_eq!(a.status(identify(1, 0, 0), &mut [0; 4096]), Status::SUCCESS);
    // Authentication commands on such a queue are refused, without effect.
    let mut buf = vec![0u8; 8];
    let s = a.status(
        auth_sqe(fctype::AUTHENTICATION_SEND, wire::SECP_AUTH, 8),
        &mut buf,
    );
    assert_eq!(s, Status::INVALID_FIELD.with_dnr());
    assert_eq!(a.status(identify(1, 0, 0), &mut [0; 4096]), Status::SUCCESS);
}

#[test]
fn reauthentication_key_rotation_and_a_failed_reauthentication() {
    let b = Backends::new();
    let old = Secret::generate(None, 32).unwrap();
    let new = Secret::generate(None, 64).unwrap();
    let t = target_with(keyed_config(&old, None), &b);
    let (mut a, _) = connect_admin(&t, remote(2));
    assert_eq!(a.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    let mut host = AuthHost::new(old.clone(), None, HOSTNQN, SUBNQN);
    authenticate(&mut a, &mut host, 1).unwrap();
    authenticate(&mut a, &mut host, 2).unwrap();
    // The key rotates on the target (reload): the queue stays authenticated and usable …
    let summary = t.apply_with_opener(keyed_config(&new, None), &b.opener());
    summary.expect("reload");
    assert!(a.poll(Instant::now()).terminate.is_none());
    assert_eq!(a.status(identify(1, 0, 0), &mut [0; 4096]), Status::SUCCESS);
    // … the next transaction needs the new key: the old one fails and ends authentication.
    match authenticate(&mut a, &mut host, 3) {
        Err(HostError::Failure1(e)) => assert_eq!(e, FailureReason::Failed as u8),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.status(identify(1, 0, 0), &mut [0; 4096]), AUTH_REQUIRED);
    assert_eq!(t.auth_failures().total(), 1);
    let mut rotated = AuthHost::new(new.clone(), None, HOSTNQN, SUBNQN);
    authenticate(&mut a, &mut rotated, 4).unwrap();
    assert_eq!(a.status(identify(1, 0, 0), &mut [0; 4096]), Status::SUCCESS);
}

#[test]
fn removing_the_host_disconnects_its_controllers() {
    let b = Backends::new();
    let hk = Secret::generate(None, 32).unwrap();
    let t = target_with(keyed_config(&hk, None), &b);
    let (mut a, _) = connect_admin(&t, remote(2));
    assert!(a.poll(Instant::now()).terminate.is_none());
    let mut cfg = keyed_config(&hk, None);
    cfg.subsystems[0].allowed_hosts = vec!["nqn.2014-08.org.nvmexpress:uuid:other".into()];
    cfg.subsystems[0].host_auth.clear();
    t.apply_with_opener(cfg, &b.opener()).expect("reload");
    assert_eq!(
        a.poll(Instant::now()).terminate,
        Some(TerminateReason::HostRemoved)
    );
}

#[test]
fn hostile_authentication_commands_get_their_status_and_failure1() {
    let b = Backends::new();
    let hk = Secret::generate(None, 32).unwrap();
    let t = target_with(keyed_config(&hk, None), &b);
    let (mut a, _) = connect_admin(&t, remote(3));
    // Command fields: SECP, SPSP0/1, TL 0 or beyond the largest message: Invalid Field, DNR,
    // at the field's byte (error log).
    let mut buf = vec![0u8; 16];
    let bad_secp = auth_sqe(fctype::AUTHENTICATION_SEND, 0xea, 16);
    let r = a.run(bad_secp, &mut buf);
    assert_eq!(r.cqe.status, Status::INVALID_FIELD.with_dnr());
    let mut spsp = auth_sqe(fctype::AUTHENTICATION_RECEIVE, wire::SECP_AUTH, 16);
    spsp.cdw10 ^= 0x0000_0300;
    assert_eq!(a.status(spsp, &mut buf), Status::INVALID_FIELD.with_dnr());
    let zero = auth_sqe(fctype::AUTHENTICATION_SEND, wire::SECP_AUTH, 0);
    assert_eq!(a.status(zero, &mut []), Status::INVALID_FIELD.with_dnr());
    // TL larger than the largest message: refused before any buffer is sized by it.
    let huge = auth_sqe(fctype::AUTHENTICATION_SEND, wire::SECP_AUTH, 1 << 20);
    assert_ne!(a.status(huge, &mut []), Status::SUCCESS);
    // TL lying about the data actually sent.
    let lying = auth_sqe(fctype::AUTHENTICATION_SEND, wire::SECP_AUTH, 64);
    assert_eq!(
        a.status(lying, &mut buf),
        Status::DATA_SGL_LENGTH_INVALID.with_dnr()
    );
    // AL smaller than AUTH_Failure1: Invalid Field, the message stays for a larger AL.
    let mut host = AuthHost::new(hk.clone(), None, HOSTNQN, SUBNQN);
    let truncated = host.negotiate(1)[..20].to_vec();
    assert_eq!(send(&mut a, &truncated), Status::SUCCESS);
    let small = auth_sqe(fctype::AUTHENTICATION_RECEIVE, wire::SECP_AUTH, 4);
    assert_eq!(
        a.status(small, &mut [0u8; 4]),
        Status::INVALID_FIELD.with_dnr()
    );
    // Malformed payload: the Send succeeds, the next Receive is AUTH_Failure1.
    let f = failure1(&receive(&mut a));
    assert_eq!(f.explanation, FailureReason::IncorrectPayload as u8);
    // Receive with no transaction: AUTH_Failure1 "failed".
    assert_eq!(
        failure1(&receive(&mut a)).explanation,
        FailureReason::Failed as u8
    );
    // An unknown message type: "incorrect message".
    assert_eq!(send(&mut a, &[0xff; 3]), Status::SUCCESS);
    assert_eq!(
        failure1(&receive(&mut a)).explanation,
        FailureReason::IncorrectMessage as u8
    );
    let mut other = AuthHost::new(hk.clone(), None, HOSTNQN, SUBNQN);
    assert_eq!(send(&mut a, &host.negotiate(5)), Status::SUCCESS);
    let challenge = receive(&mut a);
    other.negotiate(5);
    let reply = other.reply(&challenge).unwrap();
    // Wrong T_ID on the Reply: "incorrect payload".
    let mut wrong_tid = reply.clone();
    wrong_tid[4] ^= 0x40;
    assert_eq!(send(&mut a, &wrong_tid), Status::SUCCESS);
    assert_eq!(
        failure1(&receive(&mut a)).explanation,
        FailureReason::IncorrectPayload as u8
    );
    // The same Reply replayed after the transaction failed: "incorrect message".
    assert_eq!(send(&mut a, &reply), Status::SUCCESS);
    assert_eq!(
        failure1(&receive(&mut a)).explanation,
        FailureReason::IncorrectMessage as u8
    );
    // None of it authenticated the queue, and none of it broke it.
    assert_eq!(a.property_set(reg::CC, cc::ENABLE), Status::SUCCESS);
    assert_eq!(a.status(identify(1, 0, 0), &mut [0; 4096]), AUTH_REQUIRED);
    authenticate(&mut a, &mut host, 6).unwrap();
    assert_eq!(a.status(identify(1, 0, 0), &mut [0; 4096]), Status::SUCCESS);
}

#[test]
fn an_address_that_keeps_failing_is_refused_for_a_while() {
    let b = Backends::new();
    let hk = Secret::generate(None, 32).unwrap();
    let t = target_with(keyed_config(&hk, None), &b);
    let wrong = Secret::generate(None, 32).unwrap();
    let (mut a, _) = connect_admin(&t, remote(4));
    for tid in 0..FailureLimiter::MAX_FAILURES as u16 {
        let mut guesser = AuthHost::new(wrong.clone(), None, HOSTNQN, SUBNQN);
        assert!(authenticate(&mut a, &mut guesser, tid).is_err());
    }
    assert_eq!(
        t.auth_failures().total(),
        u64::from(FailureLimiter::MAX_FAILURES)
    );
    // Now even the right key is refused from that address, at once (no Challenge) …
    let mut host = AuthHost::new(hk.clone(), None, HOSTNQN, SUBNQN);
    assert_eq!(send(&mut a, &host.negotiate(9)), Status::SUCCESS);
    assert_eq!(
        failure1(&receive(&mut a)).explanation,
        FailureReason::Failed as u8
    );
    // … while another address authenticates.
    let (mut other, _) = connect_admin(&t, remote(5));
    authenticate(&mut other, &mut host, 10).unwrap();
}

/// Worker threads for the tests: one thread per job, named like the daemon's, after an
/// optional delay; counts the jobs it ran.
#[derive(Debug, Default)]
struct TestWorkers {
    delay: std::time::Duration,
    ran: std::sync::atomic::AtomicUsize,
}

impl nvme::auth::AuthWorkers for TestWorkers {
    fn spawn(&self, job: Box<dyn FnOnce() + Send>) -> Result<(), String> {
        let delay = self.delay;
        self.ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::thread::Builder::new()
            .name("nvmfd-auth-test".into())
            .spawn(move || {
                std::thread::sleep(delay);
                job();
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// A reactor's submitter with a channel for completions made on other threads.
struct ReactorIo {
    done: Arc<storage::ExternalCompletions>,
}

impl storage::IoSubmit for ReactorIo {
    fn submit(&mut self, _op: storage::BlockOp, tag: u64) {
        panic!("no backend op expected (tag {tag:#x})");
    }
    fn submit_group(&mut self, _ops: &[storage::BlockOp], tag: u64) {
        panic!("no backend op expected (tag {tag:#x})");
    }
    fn external(&mut self) -> Option<&Arc<storage::ExternalCompletions>> {
        Some(&self.done)
    }
}

impl ReactorIo {
    fn new() -> Self {
        let (_rx, tx) = nix::unistd::pipe().unwrap();
        Self {
            done: Arc::new(storage::ExternalCompletions::new(tx)),
        }
    }
}

/// Runs one auth command the way a reactor does: Submitted → wait for the worker's
/// completion (polling the queue meanwhile, as the reactor's ticks do) → finish.
fn run_auth(
    h: &mut Host,
    io: &mut ReactorIo,
    mut sqe: Sqe,
    data: &mut [u8],
    cid: u16,
    polls: &mut dyn FnMut(&mut Host),
) -> (nvme::queue::Outcome, nvme::queue::Response) {
    sqe.cid = cid;
    h.q.prepare(&sqe, data.len() as u32).expect("admitted");
    let tag = 0xa000 | u64::from(cid);
    let first = h.q.execute(&sqe, data, tag, io);
    if let nvme::queue::Outcome::Complete(r) = first {
        return (first, r);
    }
    assert_eq!(first, nvme::queue::Outcome::Submitted);
    // Another auth command of the queue meanwhile waits.
    let mut other = auth_sqe(fctype::AUTHENTICATION_RECEIVE, wire::SECP_AUTH, AL);
    other.cid = cid + 1000;
    let mut buf = vec![0u8; AL as usize];
    assert_eq!(
        h.q.execute(&other, &mut buf, 1, io),
        nvme::queue::Outcome::Blocked,
        "an auth command while the worker computes"
    );
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let mut got = None;
        io.done.drain(|t, r| got = Some((t, r)));
        if let Some((t, r)) = got {
            assert_eq!(t, tag);
            return (first, h.q.finish(&sqe, r).expect("completed"));
        }
        polls(h);
        assert!(Instant::now() < deadline, "no completion from the worker");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

type Offloaded = (Arc<Target>, Arc<TestWorkers>, Secret, Secret, Backends);

fn offloaded_auth_target(delay: std::time::Duration, limits: nvme::auth::AuthLimits) -> Offloaded {
    let hk = Secret::generate(Some(HashId::Sha512), 64).unwrap();
    let ck = Secret::generate(Some(HashId::Sha512), 64).unwrap();
    let mut cfg = keyed_config(&hk, Some(&ck));
    for a in cfg.subsystems[0].host_auth.values_mut() {
        a.dh_groups = vec![DhGroup::Ffdhe8192];
    }
    let b = Backends::new();
    let t = target_with(cfg, &b);
    let workers = Arc::new(TestWorkers {
        delay,
        ..Default::default()
    });
    assert!(t.set_auth_offload(nvme::auth::AuthOffload {
        workers: Arc::clone(&workers) as Arc<dyn nvme::auth::AuthWorkers>,
        transactions: nvme::auth::Transactions::new(limits),
    }));
    (t, workers, hk, ck, b)
}

/// With an offload, a queue's thread never runs an exponentiation: the "reactor" here is a
/// thread that forbids them (as the daemon's reactors do; one would fail the transaction),
/// and a bidirectional ffdhe8192 + SHA-512 transaction succeeds with its Negotiate and its
/// Reply each completed from a worker (two jobs); the admin queue's controller, with a 1 s
/// KATO and the worker taking 1.5 s per job, is not expired meanwhile although the polls see
/// 2 s without a command.
#[test]
fn exponentiations_run_on_the_workers_and_keep_alive_waits_for_them() {
    let limits = nvme::auth::AuthLimits {
        max_transactions: 8,
        max_per_address: 2,
    };
    let (t, workers, hk, ck, _b) =
        offloaded_auth_target(std::time::Duration::from_millis(1500), limits);
    std::thread::scope(|s| {
        s.spawn(|| {
            nvmfd_auth::dh::forbid_exponentiation_on_this_thread();
            let mut p = peer(TransportKind::Tcp, 1);
            p.remote = remote(7);
            let mut h = Host::new(&t, p);
            let r = h.connect(0, 31, 0, 1000, &connect_data(SUBNQN, HOSTNQN, 0xffff));
            assert_eq!(r.cqe.status, Status::SUCCESS);
            let mut io = ReactorIo::new();
            let mut host = AuthHost::new(hk.clone(), Some(ck.clone()), HOSTNQN, SUBNQN);
            let t0 = Instant::now();
            let mut polls = |h: &mut Host| {
                // The reactor's clock runs fast: KATO passes twice over each poll.
                let later = Instant::now() + (Instant::now() - t0) * 2;
                assert_eq!(
                    h.poll(later).terminate,
                    None,
                    "keep-alive expired during DH"
                );
            };
            let mut neg = host.negotiate(3);
            let sqe = auth_sqe(
                fctype::AUTHENTICATION_SEND,
                wire::SECP_AUTH,
                neg.len() as u32,
            );
            let (out, r) = run_auth(&mut h, &mut io, sqe, &mut neg, 10, &mut polls);
            assert_eq!(
                (out, r.cqe.status),
                (nvme::queue::Outcome::Submitted, Status::SUCCESS)
            );
            // The Receive that waited now runs: the Challenge.
            let challenge = receive(&mut h);
            // The host's own exponentiations, on a thread of its own.
            let mut reply = std::thread::scope(|s| s.spawn(|| host.reply(&challenge)).join())
                .unwrap()
                .expect("challenge");
            let sqe = auth_sqe(
                fctype::AUTHENTICATION_SEND,
                wire::SECP_AUTH,
                reply.len() as u32,
            );
            let (out, r) = run_auth(&mut h, &mut io, sqe, &mut reply, 20, &mut polls);
            assert_eq!(
                (out, r.cqe.status),
                (nvme::queue::Outcome::Submitted, Status::SUCCESS)
            );
            let s2 = host
                .success1(&receive(&mut h))
                .expect("R2 verifies")
                .expect("bidirectional");
            assert_eq!(send(&mut h, &s2), Status::SUCCESS);
            assert_eq!(
                h.property_set(reg::CC, cc::EN),
                Status::SUCCESS,
                "authenticated"
            );
        });
    });
    assert_eq!(workers.ran.load(std::sync::atomic::Ordering::Relaxed), 2);
}

/// Past the bound of transactions from one address, a new one is refused at once with
/// AUTH_Failure1 "failed", without any work; another address still gets in, and the place is
/// free again once the first transaction ended.
#[test]
fn transactions_past_the_bound_are_refused_with_failure1() {
    let limits = nvme::auth::AuthLimits {
        max_transactions: 8,
        max_per_address: 1,
    };
    let (t, workers, hk, _, _b) = offloaded_auth_target(std::time::Duration::ZERO, limits);
    let mut io = ReactorIo::new();
    let mut host = AuthHost::new(hk.clone(), None, HOSTNQN, SUBNQN);
    let (mut first, _) = connect_admin(&t, remote(8));
    let mut neg = host.negotiate(1);
    let sqe = auth_sqe(
        fctype::AUTHENTICATION_SEND,
        wire::SECP_AUTH,
        neg.len() as u32,
    );
    let (_, r) = run_auth(&mut first, &mut io, sqe, &mut neg, 10, &mut |_| {});
    assert_eq!(r.cqe.status, Status::SUCCESS);
    // The first transaction is under way (its Challenge not yet fetched).
    let (mut second, _) = connect_admin(&t, remote(8));
    assert_eq!(
        send(&mut second, &host.negotiate(2)),
        Status::SUCCESS,
        "Send itself succeeds"
    );
    let f = failure1(&receive(&mut second));
    assert_eq!(f.explanation, FailureReason::Failed as u8);
    assert_eq!(
        workers.ran.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "no work for it"
    );
    let (mut third, _) = connect_admin(&t, remote(9));
    let mut host3 = AuthHost::new(hk.clone(), None, HOSTNQN, SUBNQN);
    let mut neg = host3.negotiate(3);
    let sqe = auth_sqe(
        fctype::AUTHENTICATION_SEND,
        wire::SECP_AUTH,
        neg.len() as u32,
    );
    let (out, _) = run_auth(&mut third, &mut io, sqe, &mut neg, 30, &mut |_| {});
    assert_eq!(out, nvme::queue::Outcome::Submitted, "another address");
    // The first transaction ends (here: the host gives up); its place is free again.
    assert_eq!(
        send(&mut first, &host.failure2(FailureReason::Failed as u8)),
        Status::SUCCESS
    );
    let mut neg = host.negotiate(4);
    let sqe = auth_sqe(
        fctype::AUTHENTICATION_SEND,
        wire::SECP_AUTH,
        neg.len() as u32,
    );
    let (out, _) = run_auth(&mut second, &mut io, sqe, &mut neg, 40, &mut |_| {});
    assert_eq!(out, nvme::queue::Outcome::Submitted, "admitted again");
}

/// A transaction's timer (KATO) restarts at each step: a host that takes 0.6 s per step with
/// a 1 s KATO completes a transaction that lasts longer than KATO in all; one that leaves the
/// transaction waiting longer than KATO gets it dropped (its next Receive: AUTH_Failure1).
#[test]
fn the_transaction_timer_restarts_at_each_step() {
    let hk = Secret::generate(Some(HashId::Sha256), 32).unwrap();
    let b = Backends::new();
    let t = target_with(keyed_config(&hk, None), &b);
    let mut p = peer(TransportKind::Tcp, 1);
    p.remote = remote(11);
    let mut h = Host::new(&t, p);
    let r = h.connect(0, 31, 0, 1000, &connect_data(SUBNQN, HOSTNQN, 0xffff));
    assert_eq!(r.cqe.status, Status::SUCCESS);
    let mut host = AuthHost::new(hk.clone(), None, HOSTNQN, SUBNQN);
    let pause = || std::thread::sleep(std::time::Duration::from_millis(600));
    assert_eq!(send(&mut h, &host.negotiate(1)), Status::SUCCESS);
    pause();
    assert_eq!(h.poll(Instant::now()).terminate, None);
    let challenge = receive(&mut h);
    pause();
    assert_eq!(h.poll(Instant::now()).terminate, None);
    let reply = host.reply(&challenge).unwrap();
    assert_eq!(send(&mut h, &reply), Status::SUCCESS);
    host.success1(&receive(&mut h))
        .expect("authenticated after 1.2 s");

    assert_eq!(send(&mut h, &host.negotiate(2)), Status::SUCCESS);
    let later = Instant::now() + std::time::Duration::from_millis(1100);
    assert_eq!(h.poll(later).terminate, None);
    let f = failure1(&receive(&mut h));
    assert_eq!(
        f.explanation,
        FailureReason::Failed as u8,
        "dropped after KATO"
    );
}
