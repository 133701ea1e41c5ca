//! `nvmetcli save` import against a realistic saveconfig.json (tests/data/).

use std::path::PathBuf;

use conf::{ByteSize, Config, Port, Referral, Transport};

const SAVECONFIG: &str = include_str!("data/nvmetcli-saveconfig.json");

#[test]
fn imports_ports_subsystems_namespaces_and_referrals() {
    let import = Config::from_nvmetcli_json(SAVECONFIG).unwrap();
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
    let import = Config::from_nvmetcli_json(SAVECONFIG).unwrap();
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
    let import = Config::from_nvmetcli_json(SAVECONFIG).unwrap();
    let toml = import.config.to_toml().unwrap();
    assert!(toml.contains("[[subsystems.namespaces]]"), "{toml}");
    let reparsed = Config::parse_toml(&toml).unwrap();
    assert_eq!(reparsed, import.config);
}

#[test]
fn imported_paths_are_checked_by_validation_not_by_import() {
    let import = Config::from_nvmetcli_json(SAVECONFIG).unwrap();
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
    let import = Config::from_nvmetcli_json(json).unwrap();
    assert_eq!(import.config.ports[0].id, 7);
    assert_eq!(import.config.ports[0].service, 4421);
    assert_eq!(import.config.subsystems[0].allow_any_host, Some(true));
    assert_eq!(import.config.subsystems[0].namespaces[0].nsid, 4);
    assert!(import.warnings.is_empty(), "{:?}", import.warnings);

    let err = Config::from_nvmetcli_json("{\"ports\": 3}").unwrap_err();
    assert!(err.to_string().starts_with("nvmetcli JSON:"), "{err}");
}
