//! The host role (`nvmfd_auth::host`) against the controller role, and what it refuses.

use std::sync::Arc;

use nvmfd_auth::host::{Host, HostError};
use nvmfd_auth::{Config, Controller, DhGroup, FailureReason, HashId, Secret};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6b1f0c3e-8d3a-4c55-9a43-3f2a0b7c1d10";
const SUBNQN: &str = "nqn.2026-12.io.nvmfd:test";
const AL: u32 = 4096;

fn config(hash: HashId, group: DhGroup, ctrl_key: Option<Secret>) -> Arc<Config> {
    Arc::new(Config {
        host_key: Secret::generate(None, 32).unwrap(),
        ctrl_key,
        hashes: vec![hash],
        dh_groups: vec![group],
        host_nqn: HOSTNQN.into(),
        subsys_nqn: SUBNQN.into(),
    })
}

/// One transaction; Ok(()) when both sides end authenticated.
fn run(ctrl: &mut Controller, host: &mut Host, tid: u16) -> Result<(), HostError> {
    ctrl.on_send(&host.negotiate(tid)).ok();
    let reply = host.reply(&ctrl.on_receive(AL).unwrap())?;
    ctrl.on_send(&reply).ok();
    let s1 = ctrl.on_receive(AL).unwrap();
    match host.success1(&s1) {
        Ok(Some(s2)) => ctrl.on_send(&s2).unwrap(),
        Ok(None) => {}
        Err(e) => {
            ctrl.on_send(&host.failure2(FailureReason::Failed as u8))
                .ok();
            return Err(e);
        }
    }
    assert!(ctrl.is_authenticated());
    Ok(())
}

#[test]
fn host_role_authenticates_both_ways_with_every_hash() {
    for hash in HashId::ALL {
        for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
            let ck = Secret::generate(Some(HashId::Sha384), 48).unwrap();
            let cfg = config(hash, group, Some(ck.clone()));
            let mut ctrl = Controller::new(cfg.clone());
            let mut host = Host::new(cfg.host_key.clone(), Some(ck), HOSTNQN, SUBNQN);
            run(&mut ctrl, &mut host, 1).unwrap();
            let mut uni = Host::new(cfg.host_key.clone(), None, HOSTNQN, SUBNQN);
            run(&mut ctrl, &mut uni, 2).unwrap();
        }
    }
}

#[test]
fn host_role_sees_failures() {
    let cfg = config(HashId::Sha256, DhGroup::Null, None);
    // Wrong host key: the controller answers AUTH_Failure1 "failed".
    let mut ctrl = Controller::new(cfg.clone());
    let mut host = Host::new(Secret::generate(None, 32).unwrap(), None, HOSTNQN, SUBNQN);
    ctrl.on_send(&host.negotiate(1)).unwrap();
    let reply = host.reply(&ctrl.on_receive(AL).unwrap()).unwrap();
    ctrl.on_send(&reply).unwrap_err();
    match host.success1(&ctrl.on_receive(AL).unwrap()) {
        Err(HostError::Failure1(e)) => assert_eq!(e, FailureReason::Failed as u8),
        other => panic!("{other:?}"),
    }
    // Wrong controller key on the host: R2 does not verify, the host ends with Failure2.
    let cfg = config(
        HashId::Sha256,
        DhGroup::Null,
        Some(Secret::generate(None, 32).unwrap()),
    );
    let mut ctrl = Controller::new(cfg.clone());
    let wrong = Secret::generate(None, 32).unwrap();
    let mut host = Host::new(cfg.host_key.clone(), Some(wrong), HOSTNQN, SUBNQN);
    assert!(matches!(
        run(&mut ctrl, &mut host, 3),
        Err(HostError::ControllerResponse)
    ));
    assert!(!ctrl.is_authenticated() && ctrl.has_failed());
    // A hash the host does not offer: Failure1 "hash unusable".
    let mut ctrl = Controller::new(config(HashId::Sha512, DhGroup::Null, None));
    let mut host = Host::new(cfg.host_key.clone(), None, HOSTNQN, SUBNQN);
    host.hashes = vec![HashId::Sha256];
    ctrl.on_send(&host.negotiate(4)).unwrap_err();
    match host.reply(&ctrl.on_receive(AL).unwrap()) {
        Err(HostError::Failure1(e)) => assert_eq!(e, FailureReason::HashUnusable as u8),
        other => panic!("{other:?}"),
    }
}
