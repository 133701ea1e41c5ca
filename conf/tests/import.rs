//! `nvmetcli save` import against a realistic saveconfig.json (tests/data/).

use std::path::{Path, PathBuf};

use conf::multipath::{AnaGroup, AnaState, PortAnaState};
use conf::{Backing, ByteSize, Config, Import, Port, Referral, Transport};

const SAVECONFIG: &str = include_str!("data/nvmetcli-saveconfig.json");
const ANA_SAVECONFIG: &str = include_str!("data/nvmetcli-ana-4k.json");

/// The backing stores of the sample files as they were on the nvmet machine: devices with
/// 512-byte logical blocks, image files on a 4 KiB-block file system.
fn sample_backing(path: &Path) -> Result<Backing, String> {
    let path = path.to_str().unwrap();
    if path.starts_with("/dev/") {
        Ok(Backing::BlockDevice {
            logical_block_size: 512,
        })
    } else if path.ends_with(".img") {
        Ok(Backing::File {
            fs_block_size: 4096,
        })
    } else {
        Err("no such file".to_owned())
    }
}

fn import_sample(json: &str) -> Import {
    Config::from_nvmetcli_json_with(json, &sample_backing).unwrap()
}

#[test]
fn imports_ports_subsystems_namespaces_and_referrals() {
    let import = import_sample(SAVECONFIG);
    let config = &import.config;

    assert_eq!(
        config.ports,
        vec![
            Port {
                id: 1,
                transport: Transport::Tcp,
                address: "0.0.0.0".into(),
                service: 4420
            },
            Port {
                id: 2,
                transport: Transport::Rdma,
                address: "192.0.2.10".into(),
                service: 4420
            },
        ]
    );
    // Only the enabled referral survives.
    assert_eq!(
        config.referrals,
        vec![Referral {
            transport: Transport::Tcp,
            address: "192.0.2.20".into(),
            service: 8009
        }]
    );
    // Per-port inline_data_size (16384, 8192) becomes the smallest global value.
    assert_eq!(config.global.in_capsule_data_size, ByteSize(8192));

    let nqns: Vec<&str> = config.subsystems.iter().map(|s| s.nqn.as_str()).collect();
    assert_eq!(
        nqns,
        [
            "nqn.2023-04.com.example.storage:vol0",
            "nqn.2023-04.com.example.storage:restricted"
        ]
    );

    let vol0 = &config.subsystems[0];
    assert_eq!(vol0.ports, vec![1, 2]);
    assert_eq!(vol0.allow_any_host, Some(true));
    assert!(vol0.allows_any_host());
    assert_eq!(vol0.serial, "3d83c78b76623f1d");
    assert_eq!(vol0.model, "Linux");
    assert_eq!(vol0.namespaces.len(), 2, "the disabled nsid 3 is skipped");
    let ns1 = &vol0.namespaces[0];
    assert_eq!(ns1.nsid, 1);
    assert_eq!(ns1.path, Some(PathBuf::from("/dev/nvme0n1")));
    assert_eq!(ns1.ram_size, None);
    assert_eq!(
        ns1.uuid.as_deref(),
        Some("26ffc8ce-73b4-321d-9685-7d7a9872c460")
    );
    assert_eq!(
        ns1.nguid.as_deref(),
        Some("ef90689c-6c46-d44c-89c1-4067801309a8")
    );
    let ns2 = &vol0.namespaces[1];
    assert_eq!(ns2.path, Some(PathBuf::from("/var/lib/nvmet/vol0-ns2.img")));
    assert_eq!(ns2.nguid, None, "an all-zero NGUID means none was set");

    let restricted = &config.subsystems[1];
    assert_eq!(restricted.ports, vec![1]);
    assert_eq!(restricted.allow_any_host, Some(false));
    assert!(!restricted.allows_any_host());
    // nvmet's per-host DH-HMAC-CHAP attributes come across on the host that has a key.
    assert_eq!(
        restricted.allowed_hosts,
        ["nqn.2014-08.org.nvmexpress:uuid:4c4c4544-0035-4810-8057-b7c04f4e4d32"]
    );
    assert_eq!(restricted.hosts.len(), 1);
    let host = &restricted.hosts[0];
    assert_eq!(
        host.nqn,
        "nqn.2014-08.org.nvmexpress:uuid:8d1e34a2-9c1b-4f7a-bb5e-2f6d0c9a7e11"
    );
    assert_eq!(
        host.dhchap_key.as_deref(),
        Some("DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:")
    );
    assert_eq!(host.dhchap_ctrl_key, None);
    assert_eq!(host.dhchap_hashes, ["hmac(sha256)"]);
    assert_eq!(host.dhchap_dhgroups, ["ffdhe2048"]);
    let keys = host.keys().unwrap().expect("host has a key");
    assert_eq!(keys.hashes, [nvmfd_auth::HashId::Sha256]);
    assert_eq!(keys.dh_groups, [nvmfd_auth::DhGroup::Ffdhe2048]);
}

#[test]
fn reports_what_it_could_not_carry_over() {
    let import = import_sample(SAVECONFIG);
    let warnings = import.warnings.join("\n");
    for expected in [
        "port 10: transport \"loop\" is not supported: skipped",
        "namespace 3 is disabled: skipped",
        "subsystem testnqn: not linked to any imported port",
        "subsystem nqn.2023-04.com.example.storage:staging: not linked to any imported port",
        "inline_data_size differs between ports",
    ] {
        assert!(
            warnings.contains(expected),
            "missing warning {expected:?} in:\n{warnings}"
        );
    }
    assert_eq!(import.warnings.len(), 5, "{warnings}");
}

#[test]
fn imported_config_round_trips_through_toml() {
    let import = import_sample(SAVECONFIG);
    let toml = import.config.to_toml().unwrap();
    assert!(toml.contains("[[subsystems.namespaces]]"), "{toml}");
    let reparsed = Config::parse_toml(&toml).unwrap();
    assert_eq!(reparsed, import.config);
}

#[test]
fn imported_paths_are_checked_by_validation_not_by_import() {
    let import = import_sample(SAVECONFIG);
    let errors = import.config.validate().unwrap_err();
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|e| e
                == "subsystems[0].namespaces[1].path: /var/lib/nvmet/vol0-ns2.img: no such file"),
        "{text:#?}"
    );
}

#[test]
fn accepts_hand_written_numbers_and_refuses_non_json() {
    let json = r#"{
        "ports": [{"portid": "7", "addr": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": 4421},
                   "subsystems": ["nqn.2026-12.dev.nvmfd:a"]}],
        "subsystems": [{"nqn": "nqn.2026-12.dev.nvmfd:a", "attr": {"allow_any_host": 1},
                        "namespaces": [{"nsid": "4", "device": {"path": "/tmp/x.img"}}]}]
    }"#;
    let import = Config::from_nvmetcli_json_with(json, &|_| {
        Ok(Backing::File {
            fs_block_size: 4096,
        })
    })
    .unwrap();
    assert_eq!(import.config.ports[0].id, 7);
    assert_eq!(import.config.ports[0].service, 4421);
    assert_eq!(import.config.subsystems[0].allow_any_host, Some(true));
    assert_eq!(import.config.subsystems[0].namespaces[0].nsid, 4);
    assert!(import.warnings.is_empty(), "{:?}", import.warnings);

    let err = Config::from_nvmetcli_json("{\"ports\": 3}").unwrap_err();
    assert!(err.to_string().starts_with("nvmetcli JSON:"), "{err}");
}

#[test]
fn carries_block_size_ana_groups_queue_limits_and_buffered_io() {
    let import = import_sample(ANA_SAVECONFIG);
    let config = &import.config;

    // Group 2: optimized on port 1, non-optimized on port 2, and inaccessible on port 3, which
    // has no directory for it (nvmet's default for groups other than 1). Group 1 is optimized
    // everywhere, nvmfd's default, so it needs no entry.
    assert_eq!(
        config.ana_groups,
        vec![AnaGroup {
            id: 2,
            state: AnaState::Optimized,
            port_states: vec![
                PortAnaState {
                    port: 2,
                    state: AnaState::NonOptimized
                },
                PortAnaState {
                    port: 3,
                    state: AnaState::Inaccessible
                },
            ],
        }]
    );
    let ana = &config.subsystems[0];
    let ns: Vec<(u32, u32, bool, u32)> = ana
        .namespaces
        .iter()
        .map(|n| (n.nsid, n.block_size, n.direct_io, n.ana_group))
        .collect();
    assert_eq!(
        ns,
        [
            // A file on a 4 KiB-block file system stays a 4 KiB-block namespace; buffered_io=1.
            (1, 4096, false, 2),
            (2, 512, true, 1),
            // Not inspectable here: the default, with a warning (below).
            (3, 512, true, 1),
        ]
    );
    assert_eq!(config.global.max_queue_size, 256);
    // qid_max 64 and 128: the smallest.
    assert_eq!(config.global.max_io_queues, 64);
    // cntlid_min differs (1, 10): nvmfd's single range stays the default; cntlid_max agrees.
    assert_eq!(
        (config.global.cntlid_min, config.global.cntlid_max),
        (1, 65519)
    );
    // inline_data_size -1 means "transport default" in nvmet: nvmfd's default stays.
    assert_eq!(config.global.in_capsule_data_size, ByteSize(8192));

    let warnings = import.warnings.join("\n");
    for expected in [
        "port 2: treq \"required\" (secure channel) is not supported: exported without TLS",
        "port 2: tsas \"tls1.3\" (TLS) is not supported: exported without TLS",
        "subsystem nqn.2026-12.dev.example:ana: ieee_oui 0x001122 is not carried over",
        "subsystem nqn.2026-12.dev.example:ana: namespace 1: persistent reservations (resv.enable) are not supported",
        "subsystem nqn.2026-12.dev.example:ana: namespace 2: p2pmem (peer-to-peer memory) is not supported",
        "subsystem nqn.2026-12.dev.example:ana: namespace 3: block size unknown (/srv/nvmet/odd.raw: no such file): using 512",
        "attr.qid_max differs between subsystems; using the smallest, 64, for all",
        "attr.cntlid_min differs between subsystems (nqn.2026-12.dev.example:ana: 1, blktests-subsystem-1: 10)",
    ] {
        assert!(
            warnings.contains(expected),
            "missing warning {expected:?} in:\n{warnings}"
        );
    }
    assert_eq!(import.warnings.len(), 8, "{warnings}");

    // The result is a valid configuration apart from the paths that do not exist here, and
    // survives TOML.
    let errors: Vec<String> = match config.validate() {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    };
    assert!(
        errors
            .iter()
            .all(|e| e.ends_with("no such file") || e.contains("/dev/")),
        "{errors:#?}"
    );
    let toml = config.to_toml().unwrap();
    assert!(toml.contains("block_size = 4096"), "{toml}");
    assert!(toml.contains("[[ana_groups]]"), "{toml}");
    assert_eq!(&Config::parse_toml(&toml).unwrap(), config);
}

#[test]
fn block_sizes_follow_what_nvmet_serves() {
    // Files: the file system block size, capped at 4096 (io-cmd-file.c); devices: logical.
    let file = |fs_block_size| Backing::File { fs_block_size }.nvmet_block_size();
    assert_eq!(file(4096), 4096);
    assert_eq!(file(65536), 4096);
    assert_eq!(file(1024), 1024);
    let bdev = |logical_block_size| Backing::BlockDevice { logical_block_size }.nvmet_block_size();
    assert_eq!(bdev(512), 512);
    assert_eq!(bdev(4096), 4096);

    // A size nvmfd cannot serve is a warning naming both sizes, never a silent change.
    let json = r#"{
        "ports": [{"portid": 1, "addr": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420"},
                   "subsystems": ["testnqn"]}],
        "subsystems": [{"nqn": "testnqn", "namespaces": [
            {"nsid": 1, "device": {"path": "/srv/1k.img"}}]}]
    }"#;
    let import = Config::from_nvmetcli_json_with(json, &|_| {
        Ok(Backing::File {
            fs_block_size: 1024,
        })
    })
    .unwrap();
    assert_eq!(import.config.subsystems[0].namespaces[0].block_size, 512);
    assert_eq!(
        import.warnings,
        ["subsystem testnqn: namespace 1: nvmet serves 1024-byte blocks, nvmfd only [512, 4096]: \
          using 512; data moves on the host"]
    );
}

#[test]
fn probes_a_real_file_like_nvmet_does() {
    use std::os::unix::fs::MetadataExt;
    let path = std::env::temp_dir().join(format!("nvmfd-probe-{}.img", std::process::id()));
    std::fs::write(&path, [0u8; 4096]).unwrap();
    let blksize = std::fs::metadata(&path).unwrap().blksize();
    let probed = Backing::probe(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        probed,
        Ok(Backing::File {
            fs_block_size: blksize
        })
    );
    assert!(Backing::probe(Path::new("/nonexistent/nvmfd")).is_err());
    assert_eq!(
        Backing::probe(Path::new("/")),
        Err("not a regular file or block device".to_owned())
    );
}
