use super::*;

fn me() -> Instance {
    Instance {
        gateway: "a".into(),
        client: "client.1".into(),
        addr: "v1:127.0.0.1:0/1".into(),
    }
}

fn other(gw: &str, n: u32) -> Instance {
    Instance {
        gateway: gw.into(),
        client: format!("client.{n}"),
        addr: format!("v1:127.0.0.1:0/{n}"),
    }
}

fn settings() -> Settings {
    Settings {
        members: vec!["a".into(), "b".into()],
        groups: vec![1],
        preferred: [(1, "a".to_owned())].into(),
        lease: 5000,
        renew: 1000,
        failback_hold: 15000,
        handover_drain: 2000,
        standby: AnaState::Inaccessible,
    }
}

fn survey(holder: Option<Instance>, record: Record, members: Vec<Instance>) -> Survey {
    Survey {
        members,
        groups: [(1, (holder, record))].into(),
    }
}

/// Owner of group 1 since t=0 (lock sent at 0).
fn owner() -> Machine {
    let mut m = Machine::new(settings(), me(), 0);
    let steps = m.survey(0, survey(None, Record::None, vec![me()]));
    assert_eq!(
        steps,
        vec![Step::Takeover {
            group: 1,
            fence: None,
            stale: None
        }]
    );
    let steps = m.took(10, 1, 0, None, Ok(()));
    assert!(matches!(
        steps[..],
        [Step::Ana {
            state: AnaState::Optimized,
            ..
        }]
    ));
    m
}

#[test]
fn optimized_only_until_the_local_deadline_and_clock_jumps_only_shorten_it() {
    let mut m = owner();
    assert!(m.tick(3999).is_empty());
    assert_eq!(m.ana_state(1), AnaState::Optimized);
    // A jump forward (a stall: SIGSTOP, a long pause) ends it at once.
    let steps = m.tick(3_600_000);
    assert_eq!(
        steps,
        vec![Step::Ana {
            group: 1,
            state: AnaState::Inaccessible,
            reason: Reason::LeaseExpired
        }]
    );
    // Time going backwards is no progress: nothing comes back.
    assert!(m.tick(5).is_empty());
    assert!(m.renewed(6, 1, 5, Ok(())).is_empty());
    assert_eq!(m.ana_state(1), AnaState::Inaccessible);
}

#[test]
fn a_renewal_extends_from_its_send_time_and_a_lost_lock_ends_ownership() {
    let mut m = owner();
    assert!(m.renewed(1100, 1, 1000, Ok(())).is_empty());
    assert!(m.tick(4999).is_empty());
    assert_eq!(m.tick(5000).len(), 1);
    let mut m = owner();
    let steps = m.renewed(1100, 1, 1000, Err(Fault::Lost));
    assert_eq!(steps.len(), 1);
    assert_eq!(m.ana_state(1), AnaState::Inaccessible);
    // Transient failures leave it to the deadline.
    let mut m = owner();
    assert!(m
        .renewed(1100, 1, 1000, Err(Fault::Other(libc::ETIMEDOUT)))
        .is_empty());
    assert_eq!(m.ana_state(1), AnaState::Optimized);
}

#[test]
fn blocklisted_means_inaccessible_everywhere_and_stop() {
    let mut m = owner();
    let steps = m.renewed(1100, 1, 1000, Err(Fault::Blocklisted));
    assert_eq!(
        steps,
        vec![
            Step::Ana {
                group: 1,
                state: AnaState::Inaccessible,
                reason: Reason::Fenced
            },
            Step::Fenced
        ]
    );
    assert!(m.held().is_empty());
    assert!(m
        .survey(2000, survey(None, Record::None, vec![me()]))
        .is_empty());
}

#[test]
fn takeover_fences_the_recorded_or_stale_owner_but_not_a_released_one_or_itself() {
    let b = other("b", 2);
    let members = vec![me(), other("b", 3)];
    // Lock expired, record names b's old instance: fence it.
    let mut m = Machine::new(settings(), me(), 0);
    let steps = m.survey(0, survey(None, Record::Owner(b.clone()), members.clone()));
    assert_eq!(
        steps,
        vec![Step::Takeover {
            group: 1,
            fence: Some(b.clone()),
            stale: None
        }]
    );
    // Held by an instance that is not a member any more: fence and break.
    let mut m = Machine::new(settings(), me(), 0);
    let steps = m.survey(
        0,
        survey(Some(b.clone()), Record::Owner(b.clone()), members.clone()),
    );
    assert_eq!(
        steps,
        vec![Step::Takeover {
            group: 1,
            fence: Some(b.clone()),
            stale: Some(b.clone())
        }]
    );
    // Handed back: no fence.
    let mut m = Machine::new(settings(), me(), 0);
    let steps = m.survey(0, survey(None, Record::Released, members.clone()));
    assert_eq!(
        steps,
        vec![Step::Takeover {
            group: 1,
            fence: None,
            stale: None
        }]
    );
    // A live holder is waited for, even by the preferred gateway.
    let mut m = Machine::new(settings(), me(), 0);
    let live = other("b", 3);
    assert!(m
        .survey(0, survey(Some(live.clone()), Record::Owner(live), members))
        .is_empty());
    // Not Optimized when the takeover failed.
    let mut m = Machine::new(settings(), me(), 0);
    m.survey(0, survey(None, Record::None, vec![me()]));
    assert!(m.took(10, 1, 0, None, Err(Fault::Busy)).is_empty());
    assert_eq!(m.ana_state(1), AnaState::Inaccessible);
}

#[test]
fn a_takeover_that_took_longer_than_the_lease_is_not_optimized() {
    let mut m = Machine::new(settings(), me(), 0);
    m.survey(0, survey(None, Record::None, vec![me()]));
    assert!(m.took(4500, 1, 0, None, Ok(())).is_empty());
    assert_eq!(m.ana_state(1), AnaState::Inaccessible);
}

#[test]
fn failback_waits_for_the_hold_down_then_drains_before_releasing() {
    // b's view: b owns group 1 (preferred: a); a comes back.
    let s = settings();
    let b = other("b", 2);
    let a = me();
    let mut m = Machine::new(s, b.clone(), 0);
    // Not before b has been a member for a lease (a cold start lets a register first).
    assert!(m
        .survey(0, survey(None, Record::None, vec![b.clone()]))
        .is_empty());
    assert_eq!(
        m.survey(5000, survey(None, Record::None, vec![b.clone()]))
            .len(),
        1
    );
    assert_eq!(m.took(5010, 1, 5000, None, Ok(())).len(), 1);
    let mut t = 5000;
    let mut released_at = None;
    let mut standby_at = None;
    while t < 35_000 {
        t += 1000;
        m.renewed(t, 1, t, Ok(()));
        let steps = m.survey(
            t,
            survey(
                Some(b.clone()),
                Record::Owner(b.clone()),
                vec![a.clone(), b.clone()],
            ),
        );
        for s in steps {
            match s {
                Step::Ana { state, .. } if state != AnaState::Optimized => standby_at = Some(t),
                Step::Release { group: 1 } => {
                    released_at.get_or_insert(t);
                }
                _ => {}
            }
        }
    }
    // a first seen at 6000: handback at 21000, release after the 2 s drain.
    assert_eq!(standby_at, Some(21_000));
    assert_eq!(released_at, Some(23_000));
    assert_eq!(m.counts().handbacks, 1);
}
