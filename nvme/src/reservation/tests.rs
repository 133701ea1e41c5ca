//! The reservation rules, notifications and state file, in memory.

use super::*;
use ResvType::*;

const A: Requester = Requester { host: [0xa; 16] };
/// Host A's second controller (another transport): the same Host Identifier.
const A2: Requester = A;
const B: Requester = Requester { host: [0xb; 16] };
const C: Requester = Requester { host: [0xc; 16] };

fn keys(a: u64, b: u64) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&a.to_le_bytes());
    d[8..].copy_from_slice(&b.to_le_bytes());
    d
}

fn register(r: &Reservations, who: Requester, key: u64) {
    r.register(who, REGISTER_REGISTER, &keys(0, key)).unwrap();
}

fn acquire(r: &Reservations, who: Requester, key: u64, t: ResvType) -> Result<(), Status> {
    r.acquire(who, ACQUIRE_ACQUIRE | (t as u32) << 8, &keys(key, 0))
        .map(drop)
}

/// NVMe Base 2.0 Figure 333, row by row: (type, holder R/W, registrant R/W, other R/W).
#[test]
fn conflict_table_from_the_spec() {
    let table = [
        (WriteExclusive, [true, true], [true, false], [true, false]),
        (
            ExclusiveAccess,
            [true, true],
            [false, false],
            [false, false],
        ),
        (
            WriteExclusiveRegistrantsOnly,
            [true, true],
            [true, true],
            [true, false],
        ),
        (
            ExclusiveAccessRegistrantsOnly,
            [true, true],
            [true, true],
            [false, false],
        ),
        (
            WriteExclusiveAllRegistrants,
            [true, true],
            [true, true],
            [true, false],
        ),
        (
            ExclusiveAccessAllRegistrants,
            [true, true],
            [true, true],
            [false, false],
        ),
    ];
    for (t, holder, registrant, other) in table {
        for (role, want) in [
            (Role::Holder, holder),
            (Role::Registrant, registrant),
            (Role::NonRegistrant, other),
        ] {
            assert_eq!(
                allowed(t, role, Access::Read),
                want[0],
                "{t:?} {role:?} read"
            );
            assert_eq!(
                allowed(t, role, Access::Write),
                want[1],
                "{t:?} {role:?} write"
            );
        }
        // The same through the state: A holds, B is registered, C is not.
        let r = Reservations::default();
        register(&r, A, 1);
        register(&r, B, 2);
        acquire(&r, A, 1, t).unwrap();
        for (who, want) in [(A2, holder), (B, registrant), (C, other)] {
            for (op, ok) in [
                (nvm_opcode::READ, want[0]),
                (nvm_opcode::COMPARE, want[0]),
                (nvm_opcode::WRITE, want[1]),
                (nvm_opcode::WRITE_ZEROES, want[1]),
                (nvm_opcode::DATASET_MANAGEMENT, want[1]),
                (nvm_opcode::FLUSH, want[1]),
            ] {
                let got = r.check_io(&who.host, op);
                assert_eq!(got.is_ok(), ok, "{t:?} host {:x} opcode {op}", who.host[0]);
                if !ok {
                    assert_eq!(got, Err(Status::RESERVATION_CONFLICT.with_dnr()));
                }
            }
        }
    }
}

#[test]
fn no_reservation_allows_everyone() {
    let r = Reservations::default();
    register(&r, A, 1);
    assert_eq!(r.check_io(&C.host, nvm_opcode::WRITE), Ok(()));
}

#[test]
fn register_rules() {
    let r = Reservations::default();
    register(&r, A, 5);
    // The same host through another controller is already registered.
    register(&r, A2, 5);
    assert_eq!(
        r.register(A2, REGISTER_REGISTER, &keys(0, 6)),
        Err(CONFLICT)
    );
    // Replace and unregister need the current key, unless IEKEY.
    assert_eq!(r.register(A, REGISTER_REPLACE, &keys(4, 6)), Err(CONFLICT));
    r.register(A, REGISTER_REPLACE, &keys(5, 6)).unwrap();
    r.register(A, REGISTER_REPLACE | IEKEY, &keys(0, 7))
        .unwrap();
    assert_eq!(
        r.register(A, REGISTER_UNREGISTER, &keys(6, 0)),
        Err(CONFLICT)
    );
    r.register(A, REGISTER_UNREGISTER, &keys(7, 0)).unwrap();
    assert_eq!(
        r.register(A, REGISTER_UNREGISTER | IEKEY, &keys(0, 0)),
        Err(CONFLICT)
    );
    // Bad action, CPTPL 01b and 11b (PTPL unsupported), short data; 10b clears PTPL.
    assert_eq!(r.register(A, 3, &keys(0, 1)), Err(INVALID));
    assert_eq!(r.register(A, 1 << 30, &keys(0, 1)), Err(INVALID));
    assert_eq!(r.register(A, 3 << 30, &keys(0, 1)), Err(INVALID));
    r.register(A, 2 << 30, &keys(0, 1)).unwrap();
    assert!(r.register(B, REGISTER_REGISTER, &[0; 8]).is_err());
}

#[test]
fn acquire_rules() {
    let r = Reservations::default();
    // Not registered; then a wrong key; then a bad type.
    assert_eq!(acquire(&r, A, 1, WriteExclusive), Err(CONFLICT));
    register(&r, A, 1);
    register(&r, B, 2);
    assert_eq!(acquire(&r, A, 9, WriteExclusive), Err(CONFLICT));
    for bad in [0u32, 7, 0xff] {
        assert_eq!(r.acquire(A, bad << 8, &keys(1, 0)), Err(INVALID));
    }
    // IEKEY is obsolete in Acquire and Release.
    assert_eq!(r.acquire(A, IEKEY | 1 << 8, &keys(1, 0)), Err(INVALID));
    assert_eq!(r.release(A, IEKEY | 1 << 8, &keys(1, 0)), Err(INVALID));
    acquire(&r, A, 1, WriteExclusive).unwrap();
    // Again, same type: fine; another type or another host: conflict.
    acquire(&r, A2, 1, WriteExclusive).unwrap();
    assert_eq!(acquire(&r, A, 1, ExclusiveAccess), Err(CONFLICT));
    assert_eq!(acquire(&r, B, 2, WriteExclusive), Err(CONFLICT));
}

#[test]
fn release_and_clear() {
    let r = Reservations::default();
    register(&r, A, 1);
    register(&r, B, 2);
    acquire(&r, A, 1, ExclusiveAccess).unwrap();
    // A non-holder's release changes nothing; a wrong type is refused.
    r.release(B, RELEASE_RELEASE | 2 << 8, &keys(2, 0)).unwrap();
    assert!(r.check_io(&B.host, nvm_opcode::READ).is_err());
    assert_eq!(
        r.release(A, RELEASE_RELEASE | 1 << 8, &keys(1, 0)),
        Err(INVALID)
    );
    assert_eq!(
        r.release(A, RELEASE_RELEASE | 2 << 8, &keys(3, 0)),
        Err(CONFLICT)
    );
    r.release(A, RELEASE_RELEASE | 2 << 8, &keys(1, 0)).unwrap();
    assert_eq!(r.check_io(&B.host, nvm_opcode::READ), Ok(()));
    acquire(&r, B, 2, WriteExclusive).unwrap();
    r.release(A, RELEASE_CLEAR, &keys(1, 0)).unwrap();
    let report = r.report();
    assert_eq!(report.len(), EXT_HEADER_SIZE);
    assert_eq!(report[4], 0);
    assert_eq!(r.check_io(&C.host, nvm_opcode::WRITE), Ok(()));
}

#[test]
fn preempt_takes_the_reservation_and_removes_the_holder() {
    let r = Reservations::default();
    register(&r, A, 1);
    register(&r, B, 2);
    acquire(&r, A, 1, WriteExclusiveRegistrantsOnly).unwrap();
    for action in [ACQUIRE_PREEMPT, ACQUIRE_PREEMPT_ABORT] {
        let cdw10 = action | (ExclusiveAccess as u32) << 8;
        // B preempts A: A is unregistered, B holds Exclusive Access.
        r.acquire(B, cdw10, &keys(2, 1)).unwrap();
        assert_eq!(r.check_io(&A.host, nvm_opcode::READ), Err(CONFLICT));
        assert_eq!(r.check_io(&B.host, nvm_opcode::WRITE), Ok(()));
        assert_eq!(acquire(&r, A, 1, WriteExclusive), Err(CONFLICT));
        // PRKEY 0 on a single-holder reservation that is not the holder's key.
        assert_eq!(r.acquire(B, cdw10, &keys(2, 0)), Err(INVALID));
        register(&r, A, 1);
        r.release(B, RELEASE_RELEASE | 2 << 8, &keys(2, 0)).unwrap();
        acquire(&r, A, 1, WriteExclusiveRegistrantsOnly).unwrap();
    }
}

#[test]
fn preempt_without_reservation_and_all_registrants() {
    let r = Reservations::default();
    register(&r, A, 1);
    register(&r, B, 2);
    register(&r, C, 3);
    let preempt = |t: ResvType| ACQUIRE_PREEMPT | (t as u32) << 8;
    // No reservation: PRKEY 0 is invalid; otherwise matching registrants go.
    assert_eq!(
        r.acquire(A, preempt(WriteExclusive), &keys(1, 0)),
        Err(INVALID)
    );
    r.acquire(A, preempt(WriteExclusive), &keys(1, 3)).unwrap();
    assert_eq!(acquire(&r, C, 3, WriteExclusive), Err(CONFLICT));
    register(&r, C, 3);
    // All registrants: everyone registered holds; an unregistered host does not.
    acquire(&r, B, 2, ExclusiveAccessAllRegistrants).unwrap();
    r.register(B, REGISTER_UNREGISTER, &keys(2, 0)).unwrap();
    assert_eq!(r.check_io(&A.host, nvm_opcode::WRITE), Ok(()));
    assert_eq!(r.check_io(&B.host, nvm_opcode::READ), Err(CONFLICT));
    // PRKEY 0 removes every other registrant and gives A the new type.
    r.acquire(A, preempt(WriteExclusive), &keys(1, 0)).unwrap();
    assert_eq!(r.check_io(&C.host, nvm_opcode::WRITE), Err(CONFLICT));
    assert_eq!(r.check_io(&C.host, nvm_opcode::READ), Ok(()));
    let report = r.report();
    assert_eq!(report[4], WriteExclusive as u8);
    assert_eq!(u16::from_le_bytes([report[5], report[6]]), 1);
    // Unregistering the holder releases the reservation.
    r.register(A, REGISTER_UNREGISTER, &keys(1, 0)).unwrap();
    assert_eq!(r.check_io(&C.host, nvm_opcode::WRITE), Ok(()));
}

#[test]
fn ptpl_state_survives_a_new_instance() {
    let dir = std::env::temp_dir().join(format!("nvmfd-resv-{}", std::process::id()));
    let file = dir.join("ns.resv");
    let _ = std::fs::remove_file(&file);
    let r = Reservations::persistent(file.clone()).unwrap();
    assert!(r.ptpl_capable());
    // Without PTPL nothing is written.
    register(&r, B, 2);
    assert!(!file.exists());
    r.register(A, REGISTER_REGISTER | CPTPL_SET << 30, &keys(0, 1))
        .unwrap();
    acquire(&r, A, 1, ExclusiveAccessRegistrantsOnly).unwrap();
    assert!(r.ptpl());
    let again = Reservations::persistent(file.clone()).unwrap();
    assert_eq!(again.report(), r.report());
    assert_eq!(again.check_io(&C.host, nvm_opcode::READ), Err(CONFLICT));
    assert_eq!(again.report()[9], 1);
    // Clearing PTPL is written too: the next start begins empty.
    again.set_ptpl(false).unwrap();
    let third = Reservations::persistent(file.clone()).unwrap();
    assert!(!third.ptpl());
    assert_eq!(third.report().len(), EXT_HEADER_SIZE);
    assert_eq!(third.check_io(&C.host, nvm_opcode::WRITE), Ok(()));
    // Damaged files are refused, not taken as empty.
    for bad in [
        &b"NVMFDRV1"[..],
        b"garbage",
        &encode(&State::default())[..30],
    ] {
        std::fs::write(&file, bad).unwrap();
        assert!(Reservations::persistent(file.clone()).is_err());
    }
    let mut wrong_holder = encode(&State::default());
    wrong_holder[9] = 1;
    std::fs::write(&file, &wrong_holder).unwrap();
    assert!(Reservations::persistent(file.clone()).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two gateways on one shared store, each refreshing when the other publishes (the
/// watch/notify round): the conflict check, the report and the notices agree.
#[test]
fn two_gateways_share_one_store() {
    use crate::testing::MemStore;
    let store = MemStore::new();
    let g1 = Arc::new(Reservations::open(store.gateway(1)).unwrap());
    let g2 = Arc::new(Reservations::open(store.gateway(2)).unwrap());
    let heard = Arc::new(Mutex::new(Vec::new()));
    for (id, r) in [(1, &g1), (2, &g2)] {
        let (r, heard) = (Arc::clone(r), Arc::clone(&heard));
        store.subscribe(id, move |version, notices, _abort| {
            r.refresh().unwrap();
            assert!(r.version() >= version);
            heard
                .lock()
                .unwrap()
                .extend(notices.iter().map(|n| (id, *n)));
        });
    }
    assert!(g1.shared() && g1.ptpl_capable());
    register(&g1, A, 1);
    acquire(&g1, A, 1, WriteExclusive).unwrap();
    // Gateway 2 learnt of it from the publication, without a command of its own.
    assert_eq!(g2.check_io(&B.host, nvm_opcode::WRITE), Err(CONFLICT));
    assert_eq!(g2.check_io(&B.host, nvm_opcode::READ), Ok(()));
    assert_eq!(g1.report_current(), g2.report_current());
    // B registers through gateway 2: it reads A's registration before deciding.
    register(&g2, B, 2);
    let report = g1.report_current().unwrap();
    assert_eq!(
        (report[0], report[4], report[5]),
        (2, WriteExclusive as u8, 2)
    );
    assert_eq!(report, g2.report_current().unwrap());
    // B preempts A through gateway 2; gateway 1 hears the notice for A and refuses A.
    let preempt = ACQUIRE_PREEMPT | (WriteExclusive as u32) << 8;
    let notices = g2.acquire(B, preempt, &keys(2, 1)).unwrap();
    assert_eq!(
        notices,
        vec![Notice {
            host: A.host,
            kind: NoticeKind::RegistrationPreempted
        }]
    );
    assert_eq!(
        heard.lock().unwrap().as_slice(),
        &[(1, notices[0])],
        "only the other gateway is told"
    );
    assert_eq!(g1.check_io(&A.host, nvm_opcode::WRITE), Err(CONFLICT));
    assert_eq!(g1.check_io(&B.host, nvm_opcode::WRITE), Ok(()));
    // A gateway whose cache is stale (no publication reached it) still decides on the
    // stored state: A's key is gone, so A cannot acquire through gateway 1.
    let lonely = Reservations::open(store.gateway(3)).unwrap();
    assert_eq!(acquire(&lonely, A, 1, WriteExclusive), Err(CONFLICT));
    assert_eq!(lonely.report_current(), g2.report_current());
}

#[test]
fn a_change_lost_to_another_writer_is_applied_again() {
    use crate::testing::MemStore;
    let store = MemStore::new();
    let g1 = Reservations::open(store.gateway(1)).unwrap();
    register(&g1, A, 1);
    // Between gateway 1's read and its write another gateway registers C and takes the
    // reservation: gateway 1's acquire is refused as stale, read again, and now conflicts.
    store.before_next_replace(|s: &mut State| {
        s.registrants.push(Registrant {
            host: C.host,
            key: 3,
        });
        s.reservation = Some(Reservation {
            rtype: ExclusiveAccess,
            host: C.host,
        });
        s.generation += 1;
    });
    let (v0, replaced0, refused0) = store.counts();
    assert_eq!(acquire(&g1, A, 1, WriteExclusive), Err(CONFLICT));
    let (v1, replaced1, refused1) = store.counts();
    assert_eq!(
        (refused1 - refused0, replaced1 - replaced0, v1 - v0),
        (1, 0, 1)
    );
    assert_eq!(g1.check_io(&A.host, nvm_opcode::READ), Err(CONFLICT));
    // The same race on a register: retried and applied on top of the other change.
    store.before_next_replace(|s: &mut State| {
        s.registrants.push(Registrant {
            host: D.host,
            key: 4,
        });
        s.generation += 1;
    });
    register(&g1, B, 2);
    let report = g1.report_current().unwrap();
    assert_eq!(u16::from_le_bytes([report[5], report[6]]), 4);
    assert_eq!(u32::from_le_bytes(report[0..4].try_into().unwrap()), 4);
    assert_eq!(store.counts().2, refused1 + 1);
}

/// §8.19.10 for a group: a state without PTPL is dropped when the first gateway opens
/// the namespace (nobody else serves it), kept when another gateway is up, and a state
/// with PTPL is always kept.
#[test]
fn power_on_of_a_group_drops_a_state_without_ptpl() {
    use crate::testing::MemStore;
    let store = MemStore::new();
    let g1 = Reservations::open(store.gateway(1)).unwrap();
    register(&g1, A, 1);
    store.subscribe(1, |_, _, _| {});
    let g2 = Reservations::open(store.gateway(2)).unwrap();
    assert_eq!(g2.report_current(), g1.report_current(), "gateway 1 is up");
    // Every gateway gone (no subscriber but the new one): a power cycle of the group.
    let store2 = MemStore::new();
    let first = Reservations::open(store2.gateway(1)).unwrap();
    register(&first, A, 1);
    let again = Reservations::open(store2.gateway(1)).unwrap();
    assert_eq!(again.report_current().unwrap().len(), EXT_HEADER_SIZE);
    // With PTPL the registrations and the reservation survive.
    first
        .register(B, REGISTER_REGISTER | CPTPL_SET << 30, &keys(0, 2))
        .unwrap();
    acquire(&first, B, 2, WriteExclusive).unwrap();
    let third = Reservations::open(store2.gateway(1)).unwrap();
    assert!(third.ptpl());
    assert_eq!(third.report_current(), first.report_current());
    assert_eq!(third.check_io(&A.host, nvm_opcode::WRITE), Err(CONFLICT));
}

#[test]
fn report_layout() {
    let r = Reservations::default();
    register(&r, A, 0x1122);
    register(&r, B, 0x3344);
    acquire(&r, A, 0x1122, ExclusiveAccess).unwrap();
    let rep = r.report();
    assert_eq!(rep.len(), EXT_HEADER_SIZE + 2 * EXT_ENTRY_SIZE);
    assert_eq!(u32::from_le_bytes(rep[0..4].try_into().unwrap()), 2);
    assert_eq!(rep[4], ExclusiveAccess as u8);
    let a = &rep[EXT_HEADER_SIZE..EXT_HEADER_SIZE + EXT_ENTRY_SIZE];
    let b = &rep[EXT_HEADER_SIZE + EXT_ENTRY_SIZE..];
    assert_eq!(
        (a[0], a[1], a[2], &a[16..32]),
        (0xff, 0xff, RCSTS_HOLDS, &A.host[..])
    );
    assert_eq!(u64::from_le_bytes(a[8..16].try_into().unwrap()), 0x1122);
    assert_eq!((b[2], &b[16..32]), (0, &B.host[..]));
}

/// A host's registration past the last one REGCTL can count is refused (a hostile host
/// changing its Host Identifier on every connect cannot grow the list); a registered host is
/// still answered, the report counts 65,535, and the state file holding them decodes again.
#[test]
fn registrations_stop_at_what_regctl_can_count() {
    let host = |i: usize| {
        let mut h = [0xee; 16];
        h[..8].copy_from_slice(&(i as u64).to_le_bytes());
        Requester { host: h }
    };
    let mut s = State {
        registrants: (0..MAX_REGISTRANTS - 1)
            .map(|i| Registrant {
                host: host(i).host,
                key: 1,
            })
            .collect(),
        ..State::default()
    };
    let mut out = Vec::new();
    let mut reg =
        |s: &mut State, who| s.register(who, REGISTER_REGISTER, &keys(0, 1), true, &mut out);
    reg(&mut s, host(MAX_REGISTRANTS - 1)).unwrap();
    let generation = s.generation;
    assert_eq!(reg(&mut s, host(MAX_REGISTRANTS)), Err(FULL));
    assert_eq!(
        (s.registrants.len(), s.generation),
        (MAX_REGISTRANTS, generation)
    );
    reg(&mut s, host(0)).unwrap();
    let rep = s.report();
    assert_eq!(u16::from_le_bytes([rep[5], rep[6]]), u16::MAX);
    assert_eq!(decode(&encode(&s)).unwrap(), s);
}

fn notices(list: &[(Requester, NoticeKind)]) -> Vec<Notice> {
    list.iter()
        .map(|&(who, kind)| Notice {
            host: who.host,
            kind,
        })
        .collect()
}

/// A holds `t`, B is registered, C is registered too (to see that everyone but the
/// issuer is told), D is not registered.
fn held_by_a(t: ResvType) -> Reservations {
    let r = Reservations::default();
    register(&r, A, 1);
    register(&r, B, 2);
    register(&r, C, 3);
    acquire(&r, A, 1, t).unwrap();
    r
}

const D: Requester = Requester { host: [0xd; 16] };

/// Who is told what (NVMe Base 2.0 §8.19.5–8.19.7), per reservation type: releasing and
/// the holder unregistering tell the other registrants "reservation released" except for
/// Write Exclusive and Exclusive Access; clearing tells every other registrant
/// "reservation preempted"; preempting tells each removed registrant "registration
/// preempted". The issuer and non-registrants are never told.
#[test]
fn notifications_per_type_from_the_spec() {
    use NoticeKind::*;
    for t in ResvType::ALL {
        let rel = RELEASE_RELEASE | (t as u32) << 8;
        let released = if t.release_notifies() {
            notices(&[(B, ReservationReleased), (C, ReservationReleased)])
        } else {
            vec![]
        };
        // Release by the holder.
        let r = held_by_a(t);
        assert_eq!(
            r.release(A, rel, &keys(1, 0)),
            Ok(released.clone()),
            "{t:?}"
        );
        // Release by a registrant that does not hold (single-holder types): nothing.
        let r = held_by_a(t);
        if !t.all_registrants() {
            assert_eq!(r.release(B, rel, &keys(2, 0)), Ok(vec![]), "{t:?}");
        }
        // The holder unregistering: all-registrants reservations stay with the others.
        let r = held_by_a(t);
        let unreg = r.register(A, REGISTER_UNREGISTER, &keys(1, 0));
        let want = if t.all_registrants() {
            vec![]
        } else {
            released.clone()
        };
        assert_eq!(unreg, Ok(want), "{t:?} unregister");
        // Clear by a registrant: every other registrant's reservation is preempted.
        let r = held_by_a(t);
        assert_eq!(
            r.release(B, RELEASE_CLEAR, &keys(2, 0)),
            Ok(notices(&[
                (A, ReservationPreempted),
                (C, ReservationPreempted)
            ])),
            "{t:?} clear"
        );
        // A failed command tells nobody.
        let r = held_by_a(t);
        assert_eq!(r.release(D, RELEASE_CLEAR, &keys(0, 0)), Err(CONFLICT));
    }
}

#[test]
fn preempt_notifications() {
    use NoticeKind::*;
    let preempt = |t: ResvType| ACQUIRE_PREEMPT | (t as u32) << 8;
    // B preempts A's Write Exclusive with the same type: A's registration goes.
    let r = held_by_a(WriteExclusive);
    assert_eq!(
        r.acquire(B, preempt(WriteExclusive), &keys(2, 1)),
        Ok(notices(&[(A, RegistrationPreempted)]))
    );
    // Into another type: C, still registered, hears that the old one was released.
    let r = held_by_a(WriteExclusive);
    assert_eq!(
        r.acquire(B, preempt(ExclusiveAccess), &keys(2, 1)),
        Ok(notices(&[
            (A, RegistrationPreempted),
            (C, ReservationReleased)
        ]))
    );
    // Preempt-and-abort of a registrant that does not hold: only it is told.
    let r = held_by_a(ExclusiveAccessRegistrantsOnly);
    let abort = ACQUIRE_PREEMPT_ABORT | (ExclusiveAccessRegistrantsOnly as u32) << 8;
    assert_eq!(
        r.acquire(B, abort, &keys(2, 3)),
        Ok(notices(&[(C, RegistrationPreempted)]))
    );
    // All registrants, PRKEY 0: everyone else loses the registration.
    let r = held_by_a(ExclusiveAccessAllRegistrants);
    assert_eq!(
        r.acquire(C, preempt(WriteExclusive), &keys(3, 0)),
        Ok(notices(&[
            (A, RegistrationPreempted),
            (B, RegistrationPreempted)
        ]))
    );
    // No reservation: the registrants with PRKEY go (two hosts may share a key).
    let r = Reservations::default();
    register(&r, A, 1);
    register(&r, B, 7);
    register(&r, C, 7);
    assert_eq!(
        r.acquire(A, preempt(WriteExclusive), &keys(1, 7)),
        Ok(notices(&[
            (B, RegistrationPreempted),
            (C, RegistrationPreempted)
        ]))
    );
    // Registering, replacing and acquiring tell nobody.
    let r = Reservations::default();
    assert_eq!(r.register(A, REGISTER_REGISTER, &keys(0, 1)), Ok(vec![]));
    assert_eq!(r.register(A, REGISTER_REPLACE, &keys(1, 2)), Ok(vec![]));
    assert_eq!(
        r.acquire(A, ACQUIRE_ACQUIRE | 1 << 8, &keys(2, 0)),
        Ok(vec![])
    );
}

#[test]
fn notification_log_queue_count_and_overflow() {
    use NoticeKind::*;
    let mut log = NotificationLog::default();
    // Empty: a zero page.
    assert_eq!(log.read(true), ReservationNotificationLog::default());
    assert!(log.add(RegistrationPreempted, 1));
    assert!(log.add(ReservationReleased, 2));
    // A read at an offset looks without removing.
    let peek = log.read(false);
    assert_eq!((peek.count, peek.available), (1, 1));
    let first = log.read(true);
    assert_eq!(
        first,
        ReservationNotificationLog {
            count: 1,
            kind: NOTICE_REGISTRATION_PREEMPTED,
            available: 1,
            nsid: 1,
        }
    );
    let second = log.read(true);
    assert_eq!(
        (second.count, second.kind, second.available, second.nsid),
        (2, NOTICE_RESERVATION_RELEASED, 0, 2)
    );
    assert_eq!(log.read(true).count, 0);
    // Overflow: the queue keeps 64; the 65th and 66th are lost and the newest queued page
    // carries the count of the last lost one.
    for _ in 0..NOTIFICATION_QUEUE + 2 {
        assert!(log.add(ReservationPreempted, 1));
    }
    let counts: Vec<u64> = (0..NOTIFICATION_QUEUE)
        .map(|_| log.read(true).count)
        .collect();
    assert_eq!(counts[0], 3);
    assert_eq!(
        counts[NOTIFICATION_QUEUE - 2],
        2 + NOTIFICATION_QUEUE as u64 - 1
    );
    assert_eq!(
        counts[NOTIFICATION_QUEUE - 1],
        2 + NOTIFICATION_QUEUE as u64 + 2
    );
    assert_eq!(log.read(true).count, 0);
    // Number of Available Log Pages saturates at 255 (never with a 64-page queue, but the
    // field is a byte): 64 queued, the first read reports 63.
    for _ in 0..NOTIFICATION_QUEUE {
        log.add(ReservationPreempted, 1);
    }
    assert_eq!(log.read(true).available, NOTIFICATION_QUEUE as u8 - 1);
    // The count rolls over from FFFFFFFF_FFFFFFFFh to 1h, never 0h (an empty page).
    let mut log = NotificationLog {
        count: u64::MAX,
        ..NotificationLog::default()
    };
    log.add(ReservationPreempted, 1);
    assert_eq!(log.read(true).count, 1);
    // A controller reset empties the queue and restarts the count.
    log.add(ReservationPreempted, 1);
    log.reset();
    assert_eq!(log.read(true).count, 0);
    log.add(ReservationPreempted, 1);
    assert_eq!(log.read(true).count, 1);
}

#[test]
fn notification_mask_per_namespace_and_type() {
    use NoticeKind::*;
    let mut log = NotificationLog::default();
    // REGPRE (bit 1) on namespace 1; reserved bits are not kept.
    log.set_mask(1, 1 << 1 | 1 | 1 << 8);
    assert_eq!(log.mask(1), 1 << 1);
    assert_eq!(log.mask(2), 0);
    assert!(!log.add(RegistrationPreempted, 1));
    assert!(log.add(RegistrationPreempted, 2));
    assert!(log.add(ReservationReleased, 1));
    log.set_mask(1, 0b1110);
    for kind in [
        RegistrationPreempted,
        ReservationReleased,
        ReservationPreempted,
    ] {
        assert!(!log.add(kind, 1), "{kind:?}");
    }
    // Masked notifications create no page and use no count.
    let pages: Vec<_> = (0..3).map(|_| log.read(true)).collect();
    assert_eq!(
        pages.iter().map(|p| (p.count, p.nsid)).collect::<Vec<_>>(),
        vec![(1, 2), (2, 1), (0, 0)]
    );
}

#[test]
fn notification_page_layout() {
    let page = ReservationNotificationLog {
        count: 0x0102_0304_0506_0708,
        kind: NOTICE_RESERVATION_PREEMPTED,
        available: 5,
        nsid: 0x0a0b_0c0d,
    };
    let b = page.encode();
    assert_eq!(b[0], 0x08);
    assert_eq!((b[8], b[9]), (3, 5));
    assert_eq!(&b[12..16], &[0x0d, 0x0c, 0x0b, 0x0a]);
    assert!(b[16..].iter().all(|&x| x == 0));
    assert_eq!(ReservationNotificationLog::decode(&b), Ok(page));
    assert!(ReservationNotificationLog::decode(&b[..63]).is_err());
}

/// A two-registrant state held by an all-registrants type, with every field distinct, for the
/// byte-for-byte checks of the state file, the report and the omap record.
pub(super) fn golden_state() -> State {
    State {
        registrants: vec![
            Registrant {
                host: [0xb; 16],
                key: 2,
            },
            Registrant {
                host: [0xa; 16],
                key: 0x0102_0304_0506_0708,
            },
        ],
        reservation: Some(Reservation {
            rtype: ResvType::WriteExclusiveAllRegistrants,
            host: [0xa; 16],
        }),
        generation: 0x0a0b_0c0d,
        ptpl: true,
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// State files written before the codec rewrite (bytes taken from that encoder): they must
/// still load, and today's encoder must write them identically.
#[test]
fn state_files_of_earlier_versions_still_load() {
    let file = unhex(concat!(
        "4e564d4644525631",                 // magic NVMFDRV1
        "01",                               // PTPL
        "05",                               // RTYPE
        "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a", // holder
        "0d0c0b0a",                         // GEN
        "02000000",                         // registrants
        "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b",
        "0200000000000000",
        "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a",
        "0807060504030201",
    ));
    assert_eq!(decode(&file).unwrap(), golden_state());
    assert_eq!(encode(&golden_state()), file);
    let empty = unhex("4e564d46445256310000000000000000000000000000000000000000000000000000");
    assert_eq!(decode(&empty).unwrap(), State::default());
    assert_eq!(encode(&State::default()), empty);
}

/// A state file cut at every byte, one byte longer, or with a field out of range is refused
/// with a typed error; a registrant count larger than the file is refused before anything is
/// sized from it.
#[test]
fn damaged_state_files_are_refused() {
    let good = encode(&golden_state());
    for cut in 0..good.len() {
        assert!(
            matches!(
                decode(&good[..cut]),
                Err(StoreError::Decode(DecodeError::Truncated { .. }))
            ),
            "{cut}"
        );
    }
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(
        decode(&long),
        Err(StoreError::Decode(DecodeError::TrailingData(1)))
    ));
    let edit = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        decode(&b)
    };
    let field = |r: Result<State, StoreError>| match r {
        Err(StoreError::Decode(DecodeError::InvalidValue { field, .. })) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(edit(0, b"NVMFDRV2")), "magic");
    assert_eq!(field(edit(8, &[2])), "PTPL");
    assert_eq!(field(edit(9, &[7])), "RTYPE");
    assert_eq!(field(edit(30, &u32::MAX.to_le_bytes())), "registrant count");
    assert_eq!(
        field(edit(30, &(MAX_REGISTRANTS as u32 + 1).to_le_bytes())),
        "registrant count"
    );
    assert!(matches!(
        edit(30, &(MAX_REGISTRANTS as u32).to_le_bytes()),
        Err(StoreError::Decode(DecodeError::Truncated { .. }))
    ));
    assert!(matches!(
        edit(10, &[0xc; 16]),
        Err(StoreError::Malformed("holder not registered"))
    ));
}

/// The Reservation Status data structure, extended (Figures 396 and 398), byte for byte.
#[test]
fn report_bytes() {
    let mut want = unhex("0d0c0b0a05020000000100000000000000000000000000000000000000000000");
    want.resize(64, 0);
    for (host, key) in [(0xb, "0200000000000000"), (0xa, "0807060504030201")] {
        let mut e = unhex("ffff010000000000");
        e.extend(unhex(key));
        e.extend([host; 16]);
        e.resize(64, 0);
        want.extend(e);
    }
    assert_eq!(golden_state().report(), want);
}
