//! Storage resized underneath the target (an RBD image after `rbd resize`), without Ceph: a
//! backend whose size changes is picked up by `Target::refresh_capacities`, republished with
//! the new block count (same backend and identifiers), and reported once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvme::namespace::{BackendConfig, NamespaceConfig};
use nvme::target::{SubsystemConfig, Target, TargetConfig};
use storage::{Backend, BackendRequest, Capabilities, IoSubmit, Started, Zeroing};

const NQN: &str = "nqn.2026-12.dev.nvmfd:resize";

/// A backend whose size the test changes; it reports a change once, like the RBD backend.
#[derive(Debug)]
struct Resizable {
    size: AtomicU64,
    reported: AtomicU64,
}

impl Backend for Resizable {
    fn capacity(&self) -> u64 {
        self.reported.load(Ordering::Acquire)
    }
    fn kind(&self) -> &'static str {
        "resizable"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    fn start(&self, _: BackendRequest, _: &mut [u8], _: u64, _: &mut dyn IoSubmit) -> Started {
        Started::Done(Ok(()))
    }
    fn start_zeroes(&self, _: &[(u64, u64)], _: Zeroing, _: u64, _: &mut dyn IoSubmit) -> Started {
        Started::Done(Ok(()))
    }
    fn refresh_capacity(&self) -> Option<u64> {
        let now = self.size.load(Ordering::Acquire);
        (self.reported.swap(now, Ordering::AcqRel) != now).then_some(now)
    }
}

fn namespace(nsid: u32, size: u64) -> NamespaceConfig {
    NamespaceConfig::new(nsid, BackendConfig::Ram { size }, 4096)
}

#[test]
fn resized_backends_are_republished_once_with_the_same_identity() {
    let backends: Arc<std::sync::Mutex<Vec<Arc<Resizable>>>> = Arc::default();
    let made = Arc::clone(&backends);
    let opener = move |cfg: &BackendConfig, _bs: u32| {
        let BackendConfig::Ram { size } = cfg else {
            unreachable!("test configs are RAM")
        };
        let b = Arc::new(Resizable {
            size: AtomicU64::new(*size),
            reported: AtomicU64::new(*size),
        });
        made.lock().unwrap().push(Arc::clone(&b));
        Ok(b as Arc<dyn Backend>)
    };
    let config = TargetConfig {
        subsystems: vec![SubsystemConfig::open_to_any_host(
            NQN,
            "nvmfd-test",
            vec![namespace(1, 1 << 20), namespace(2, 1 << 20)],
        )],
        ..TargetConfig::default()
    };
    let target = Target::with_opener(config, &opener).unwrap();
    let sub = target.subsystem(NQN).unwrap();
    let before = sub.namespaces();
    let generation = sub.ns_generation();
    assert!(
        target.refresh_capacities().is_empty(),
        "nothing changed yet"
    );
    assert_eq!(sub.ns_generation(), generation);

    // Grow namespace 2 to 3 MiB plus half a block: the partial block is not exported.
    backends.lock().unwrap()[1]
        .size
        .store((3 << 20) + 2048, Ordering::Release);
    assert_eq!(target.refresh_capacities(), vec![(NQN.to_string(), 2)]);
    assert!(
        sub.ns_generation() > generation,
        "I/O queues must see the new table"
    );
    let after = sub.namespaces();
    let (old2, new2) = (before.get(2).unwrap(), after.get(2).unwrap());
    assert_eq!((old2.blocks, new2.blocks), (256, 768));
    assert!(Arc::ptr_eq(&old2.backend, &new2.backend), "same backend");
    assert_eq!(
        (old2.uuid, old2.nguid),
        (new2.uuid, new2.nguid),
        "same identity"
    );
    assert!(
        Arc::ptr_eq(before.get(1).unwrap(), after.get(1).unwrap()),
        "untouched namespace kept as is"
    );
    assert!(target.refresh_capacities().is_empty(), "reported once");

    // Shrinking below one block keeps the old size (a namespace cannot be empty).
    backends.lock().unwrap()[0]
        .size
        .store(1000, Ordering::Release);
    assert!(target.refresh_capacities().is_empty());
    assert_eq!(sub.namespaces().get(1).unwrap().blocks, 256);
}
