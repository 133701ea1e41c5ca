use super::*;

#[test]
fn maps_rbd_images_with_and_without_a_rados_namespace() {
    // A second subsystem beside the embedded default's.
    let toml = format!(
        r#"{}
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:ceph"
allow_any_host = true
[[subsystems.namespaces]]
nsid = 1
rbd = "rbd/disk0"
[[subsystems.namespaces]]
nsid = 2
rbd = "volumes/tenant-a/disk1"
ceph_conf = "/etc/hosts"
ceph_client_id = "client.nvmfd"
block_size = 4096
"#,
        conf::EMBEDDED_DEFAULT
    );
    let config = conf::Config::parse_toml(&toml).unwrap();
    config.validate().unwrap();
    let target = target_config(&config).unwrap();
    let ns = &target.subsystems[1].namespaces;
    assert_eq!(
        ns[0].backend,
        BackendConfig::Rbd(storage::RbdTarget {
            pool: "rbd".into(),
            namespace: None,
            image: "disk0".into(),
            ceph_conf: None,
            client_id: None,
        })
    );
    assert_eq!(
        ns[1].backend,
        BackendConfig::Rbd(storage::RbdTarget {
            pool: "volumes".into(),
            namespace: Some("tenant-a".into()),
            image: "disk1".into(),
            ceph_conf: Some("/etc/hosts".into()),
            client_id: Some("client.nvmfd".into()),
        })
    );
    assert_eq!(ns[1].block_size, 4096);
}

#[test]
fn maps_the_embedded_default() {
    let config = conf::Config::load_with_env(None, conf::EnvSource::None).unwrap();
    let target = target_config(&config).unwrap();
    assert_eq!(
        target.ports,
        vec![PortConfig {
            id: 1,
            transport: TransportKind::Tcp,
            address: "127.0.0.1".parse().unwrap(),
            service: 4420,
            secure_channel: Default::default(),
        }]
    );
    assert_eq!(target.limits, Limits::default());
    let subsystem = &target.subsystems[0];
    assert_eq!(subsystem.nqn, "nqn.2026-12.dev.nvmfd:ram0");
    assert!(subsystem.allow_any_host);
    assert_eq!(
        subsystem.namespaces[0].backend,
        BackendConfig::Ram { size: 1 << 30 }
    );
    assert_eq!(subsystem.namespaces[0].block_size, 512);
    assert_eq!(subsystem.namespaces[0].ana_group, 1);
    assert_eq!(target.multipath, MultipathConfig::default());
}

#[test]
fn maps_null_namespaces_and_refuses_mixed_storage() {
    let toml = |storage: &str| {
        format!(
            "[[ports]]\nid = 1\ntransport = \"tcp\"\naddress = \"127.0.0.1\"\nservice = 4420\n\
                 [[subsystems]]\nnqn = \"nqn.2026-12.dev.nvmfd:null\"\nallow_any_host = true\n\
                 [[subsystems.namespaces]]\nnsid = 1\nblock_size = 4096\n{storage}\n"
        )
    };
    let config = conf::Config::parse_toml(&toml("null_size = \"1T\"")).unwrap();
    config.validate().unwrap();
    let target = target_config(&config).unwrap();
    assert_eq!(
        target.subsystems[0].namespaces[0].backend,
        BackendConfig::Null { size: 1 << 40 }
    );
    // Faults wrap the namespace's storage, in bytes of its block size.
    let faulty = "null_size = \"1M\"\n\
                      faults = [{ slba = 2, blocks = 3, on = \"any\", error = \"enospc\" },\
                                { slba = 9, blocks = 1, on = \"read\", latency_ms = 250, every = 4 }]";
    let config = conf::Config::parse_toml(&toml(faulty)).unwrap();
    config.validate().unwrap();
    let target = target_config(&config).unwrap();
    use storage::fault::{FaultOn, FaultRule};
    let rules = vec![
        FaultRule {
            offset: 2 * 4096,
            len: 3 * 4096,
            on: FaultOn::Both,
            errno: Some(libc::ENOSPC),
            latency: None,
            every: 1,
        },
        FaultRule {
            offset: 9 * 4096,
            len: 4096,
            on: FaultOn::Reads,
            errno: None,
            latency: Some(std::time::Duration::from_millis(250)),
            every: 4,
        },
    ];
    assert_eq!(
        target.subsystems[0].namespaces[0].backend,
        BackendConfig::Faulty {
            inner: Box::new(BackendConfig::Null { size: 1 << 20 }),
            rules,
        }
    );
    for (storage, complaint) in [
        (
            "ram_size = \"1M\"\n\
                 faults = [{ slba = 0, blocks = 0, on = \"read\", error = \"eio\" }]",
            "faults[0].blocks",
        ),
        (
            "ram_size = \"1M\"\nfaults = [{ slba = 0, blocks = 1, on = \"read\" }]",
            "needs error, latency_ms or both",
        ),
        (
            "ram_size = \"1M\"\nfaults = [{ slba = 0, blocks = 1, on = \"read\", latency_ms = 0 }]",
            "faults[0].latency_ms",
        ),
        (
            "ram_size = \"1M\"\n\
                 faults = [{ slba = 0, blocks = 1, on = \"read\", error = \"eio\", every = 0 }]",
            "faults[0].every",
        ),
        (
            "null_size = \"1T\"\nram_size = \"1M\"",
            "null_size excludes",
        ),
        ("null_size = \"1000\"", "multiple of block_size"),
        ("null_size = \"0\"", "greater than 0"),
    ] {
        let config = conf::Config::parse_toml(&toml(storage)).unwrap();
        let err = format!("{:?}", config.validate().unwrap_err());
        assert!(err.contains(complaint), "{storage}: {err}");
    }
}

#[test]
fn maps_ana_groups_and_cntlid_range() {
    // The file's limits are the core's.
    assert_eq!(conf::multipath::ANA_GROUP_MAX, nvme::ana::MAX_ANA_GROUP);
    assert_eq!(
        conf::multipath::CNTLID_MAX,
        u32::from(nvme::spec::MAX_CNTLID)
    );
    let toml = r#"
[global]
cntlid_min = 101
cntlid_max = 200
[[ports]]
id = 2
transport = "tcp"
address = "127.0.0.1"
service = 4421
[[ana_groups]]
id = 1
state = "inaccessible"
port_states = [{ port = 2, state = "non-optimized" }]
[[ana_groups]]
id = 7
state = "change"
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:mp"
allow_any_host = true
[[subsystems.namespaces]]
nsid = 1
ram_size = "1M"
ana_group = 7
"#;
    let config = conf::Config::parse_toml(toml).unwrap();
    config.validate().unwrap();
    let target = target_config(&config).unwrap();
    assert_eq!(target.subsystems[0].namespaces[0].ana_group, 7);
    let mp = &target.multipath;
    assert_eq!((mp.cntlid_min, mp.cntlid_max), (101, 200));
    assert_eq!(mp.ana_groups.len(), 2);
    assert_eq!(mp.ana_groups[0].state, AnaState::Inaccessible);
    assert_eq!(
        mp.ana_groups[0].port_states.get(&2),
        Some(&AnaState::NonOptimized)
    );
    assert_eq!(mp.ana_groups[1].state, AnaState::Change);
    // And the core accepts it.
    nvme::target::Target::with_opener(target, &storage::open).unwrap();
}

#[test]
fn maps_files_block_devices_identifiers_and_host_lists() {
    let dir = std::env::temp_dir().join(format!("nvmfd-mapping-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0u8; 4096]).unwrap();
    let toml = format!(
        r#"
[[ports]]
id = 7
transport = "tcp"
address = "::1"
service = 4421
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:files"
allowed_hosts = ["nqn.2014-08.org.nvmexpress:uuid:4c4c4544-0035-4810-8057-b7c04f4e4d32"]
ports = [7]
[[subsystems.namespaces]]
nsid = 1
path = "{image}"
direct_io = false
uuid = "26ffc8ce-73b4-321d-9685-7d7a9872c460"
[[subsystems.namespaces]]
nsid = 2
path = "{new}"
size = "1M"
block_size = 4096
[[referrals]]
transport = "rdma"
address = "192.0.2.1"
service = 4420
"#,
        image = image.display(),
        new = dir.join("new.img").display()
    );
    let config = conf::Config::parse_toml(&toml).unwrap();
    config.validate().unwrap();
    let target = target_config(&config).unwrap();
    let subsystem = &target.subsystems[0];
    assert!(!subsystem.allow_any_host);
    assert_eq!(subsystem.ports, vec![7]);
    assert_eq!(
        subsystem.namespaces[0].backend,
        BackendConfig::File {
            path: image.clone(),
            size: None,
            direct_io: false
        }
    );
    assert_eq!(subsystem.namespaces[0].uuid.unwrap()[0], 0x26);
    assert_eq!(subsystem.namespaces[0].nguid, None);
    assert_eq!(
        subsystem.namespaces[1].backend,
        BackendConfig::File {
            path: dir.join("new.img"),
            size: Some(1 << 20),
            direct_io: true
        }
    );
    assert_eq!(target.referrals[0].transport, TransportKind::Rdma);
    std::fs::remove_dir_all(&dir).unwrap();

    // A block device maps to the block backend (checked only where /dev shows one).
    let block = std::fs::read_dir("/dev")
        .ok()
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()));
    if let Some(block) = block {
        let mut namespace = conf::Namespace::new_ram(1, conf::ByteSize(0));
        namespace.ram_size = None;
        namespace.path = Some(block.clone());
        assert_eq!(
            backend("k".into(), &block, &namespace).unwrap(),
            BackendConfig::Block { path: block }
        );
    }
}
