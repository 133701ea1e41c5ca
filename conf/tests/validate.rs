//! Loading and validation: one test per error class, each checking the key path and value.

mod common;

use std::collections::HashMap;
use std::io::Write;

use common::{assert_has, errors_of, subsystem, with_port, PORT};
use conf::{ByteSize, ConfError, Config, EnvSource, LogFormat, ProblemKind, Storage, Transport};

#[test]
fn embedded_default_is_one_ram_namespace_on_localhost() {
    let config = Config::load_with_env(None, EnvSource::None).unwrap();
    assert_eq!(config.ports.len(), 1);
    assert_eq!(config.ports[0].transport, Transport::Tcp);
    assert_eq!(config.ports[0].address, "127.0.0.1");
    assert_eq!(config.ports[0].service, 4420);
    let subsystem = &config.subsystems[0];
    assert_eq!(subsystem.nqn, "nqn.2026-12.dev.nvmfd:ram0");
    assert!(subsystem.allows_any_host());
    assert_eq!(subsystem.namespaces[0].nsid, 1);
    assert_eq!(
        subsystem.namespaces[0].storage(),
        Some(Storage::Ram { size: 1 << 30 })
    );
    assert_eq!(subsystem.namespaces[0].block_size, 512);
    assert_eq!(config.global.max_queue_size, 128);
    assert_eq!(config.global.max_data_transfer, ByteSize(1 << 20));
}

#[test]
fn environment_overrides_file_values() {
    let vars = HashMap::from([
        ("NVMFD_GLOBAL__LOG_LEVEL".to_owned(), "debug".to_owned()),
        ("NVMFD_GLOBAL__LOG_FORMAT".to_owned(), "json".to_owned()),
        ("NVMFD_GLOBAL__REACTORS".to_owned(), "3".to_owned()),
        ("NVMFD_GLOBAL__CPUS".to_owned(), "2,3".to_owned()),
        (
            "NVMFD_GLOBAL__MAX_DATA_TRANSFER".to_owned(),
            "256K".to_owned(),
        ),
        ("OTHER_GLOBAL__REACTORS".to_owned(), "9".to_owned()),
        // Not overrides: no section separator (variables of the test scripts).
        ("NVMFD_BIN".to_owned(), "/opt/nvmfd/nvmfd".to_owned()),
        ("NVMFD_SKIP_E2E".to_owned(), "1".to_owned()),
    ]);
    let config = Config::load_with_env(None, EnvSource::Vars(vars)).unwrap();
    assert_eq!(config.global.log_level, "debug");
    assert_eq!(config.global.log_format, LogFormat::Json);
    assert_eq!(config.global.reactors, 3);
    assert_eq!(config.global.cpus, vec![2, 3]);
    assert_eq!(config.global.max_data_transfer, ByteSize(256 << 10));
}

#[test]
fn an_override_of_an_unknown_key_is_refused_with_its_variable_and_path() {
    let vars = HashMap::from([("NVMFD_GLOBAL__REACTOR".to_owned(), "2".to_owned())]);
    let err = Config::load_with_env(None, EnvSource::Vars(vars)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "NVMFD_GLOBAL__REACTOR: global.reactor: 2: unknown key (did you mean \
         NVMFD_GLOBAL__REACTORS?)"
    );
}

#[test]
fn environment_values_are_validated_like_file_values() {
    let vars = HashMap::from([("NVMFD_GLOBAL__MAX_QUEUE_SIZE".to_owned(), "8".to_owned())]);
    let err = Config::load_with_env(None, EnvSource::Vars(vars)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "NVMFD_GLOBAL__MAX_QUEUE_SIZE: global.max_queue_size: 8: must be 16..=1024"
    );
    let vars = HashMap::from([("NVMFD_GLOBAL__REACTORS".to_owned(), "many".to_owned())]);
    let err = Config::load_with_env(None, EnvSource::Vars(vars)).unwrap_err();
    let problem = &err.problems()[0];
    assert_eq!(problem.kind, ProblemKind::WrongType);
    assert_eq!(problem.key, "global.reactors");
    assert_eq!(problem.env.as_deref(), Some("NVMFD_GLOBAL__REACTORS"));
}

#[test]
fn loads_a_file_and_names_it_in_errors() {
    let dir = std::env::temp_dir().join(format!("conf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nvmfd.toml");
    let mut file = std::fs::File::create(&path).unwrap();
    writeln!(file, "{}\n[global]\nreactors = 2", PORT).unwrap();
    drop(file);
    let config = Config::load_with_env(Some(&path), EnvSource::None).unwrap();
    assert_eq!(config.global.reactors, 2);
    assert!(config.subsystems.is_empty());

    std::fs::write(&path, "[global\n").unwrap();
    let err = Config::load_with_env(Some(&path), EnvSource::None).unwrap_err();
    assert_eq!(err.problems()[0].kind, ProblemKind::Syntax);
    assert!(
        err.to_string()
            .starts_with(&format!("{}:1:8: ", path.display())),
        "{err}"
    );

    let missing = dir.join("missing.toml");
    let err = Config::load_with_env(Some(&missing), EnvSource::None).unwrap_err();
    assert!(matches!(err, ConfError::Read { .. }), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unknown_keys_are_rejected_with_their_path() {
    let err = Config::parse_toml(&with_port(&subsystem(
        "nqn.2026-12.dev.nvmfd:a",
        &["nsid = 1\nram_size = \"1M\"\nread_ony = true"],
    )))
    .unwrap_err();
    let problem = &err.problems()[0];
    assert_eq!(problem.kind, ProblemKind::UnknownKey);
    assert_eq!(problem.key, "subsystems[0].namespaces[0].read_ony");
    assert_eq!(problem.message, "unknown key (did you mean read_only?)");
    let err = Config::parse_toml("[global]\nreactor = 1\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "<string>:2:1: global.reactor: unknown key (did you mean reactors?)"
    );
    let err = Config::parse_toml("[extra]\n").unwrap_err();
    assert_eq!(err.to_string(), "<string>:1:2: extra: unknown section");
}

#[test]
fn type_errors_and_bad_sizes_name_the_key() {
    let err = Config::parse_toml("[global]\nreactors = \"x\"\n").unwrap_err();
    assert_eq!(err.problems()[0].key, "global.reactors");
    assert_eq!(err.problems()[0].kind, ProblemKind::WrongType);
    let err = Config::parse_toml("[global]\nmax_data_transfer = \"1MB\"\n").unwrap_err();
    let problem = &err.problems()[0];
    assert_eq!(problem.key, "global.max_data_transfer");
    assert!(problem.message.contains("\"1MB\""), "{err}");
    let err = Config::parse_toml(&with_port(
        "[[ports]]\nid = 2\ntransport = \"udp\"\naddress = \"::1\"\nservice = 1\n",
    ))
    .unwrap_err();
    assert_eq!(err.problems()[0].key, "ports[1].transport");
}

#[test]
fn sizes_accept_integers_and_binary_suffixes() {
    for (text, bytes) in [
        ("4096", 4096),
        ("\"512M\"", 512 << 20),
        ("\"1G\"", 1 << 30),
        ("\"1GiB\"", 1 << 30),
    ] {
        let config = Config::parse_toml(&with_port(&subsystem(
            "nqn.2026-12.dev.nvmfd:a",
            &[&format!("nsid = 1\nram_size = {text}")],
        )))
        .unwrap();
        assert_eq!(
            config.subsystems[0].namespaces[0].ram_size,
            Some(ByteSize(bytes)),
            "{text}"
        );
        assert_eq!(config.validate(), Ok(()));
    }
}

#[test]
fn every_error_is_reported_not_just_the_first() {
    let errors = errors_of(
        r#"
[global]
max_queue_size = 8
max_io_queues = 0
reactors = 5000
cpus = [1, 1, 4096]
max_data_transfer = "3M"
in_capsule_data_size = 100
kato_default_ms = 10
connect_timeout_ms = 5
poll_window_us = 200000
uring_registered_files = 40000
uring_fixed_buffers = "65G"
log_level = "loud"
control_socket = "relative.sock"

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = 4420

[[ports]]
id = 1
transport = "tcp"
address = "localhost"
service = 0
"#,
    );
    for expected in [
        "global.max_queue_size: 8: must be 16..=1024",
        "global.max_io_queues: 0: must be 1..=1024",
        "global.reactors: 5000: must be 0..=1024",
        "global.cpus[1]: 1: duplicate CPU (also global.cpus[0])",
        "global.cpus[2]: 4096: must be 0..=1023",
        "global.max_data_transfer: 3M: must be a power of two in 4K..=16M",
        "global.in_capsule_data_size: 100: must be a multiple of 16",
        "global.kato_default_ms: 10: must be 1000..=86400000 (the keep-alive timer has 1 s granularity on Linux)",
        "global.connect_timeout_ms: 5: must be 100..=600000",
        "global.poll_window_us: 200000: must be 0..=100000",
        "global.uring_registered_files: 40000: must be 0..=32768",
        "global.uring_fixed_buffers: 65G: must be at most 64G",
        "global.log_level: loud: \"loud\" is not one of trace/debug/info/warn/error/off",
        "global.control_socket: relative.sock: must be an absolute path",
        "ports[1].id: 1: duplicate port id (also ports[0])",
        "ports[1].service: 0: must be 1..=65535",
        "ports[1].address: localhost: not an IPv4 or IPv6 address",
    ] {
        assert_has(&errors, expected);
    }
    assert_eq!(errors.len(), 17, "{errors:#?}");
}

#[test]
fn log_level_accepts_env_filter_directives() {
    for ok in [
        "info",
        "DEBUG",
        "nvmfd=debug,transport=trace",
        "warn,nvme::queue=trace",
    ] {
        let errors = errors_of(&format!("{PORT}\n[global]\nlog_level = \"{ok}\"\n"));
        assert!(errors.is_empty(), "{ok}: {errors:?}");
    }
}

#[test]
fn in_capsule_data_cannot_exceed_mdts() {
    let errors = errors_of(&format!(
        "{PORT}\n[global]\nmax_data_transfer = \"4K\"\nin_capsule_data_size = \"8K\"\n"
    ));
    assert_eq!(
        errors,
        ["global.in_capsule_data_size: 8K: must not exceed max_data_transfer (4K)"]
    );
}

#[test]
fn ports_are_required_and_must_not_overlap() {
    assert_eq!(errors_of(""), ["ports: at least one port is required"]);
    let errors = errors_of(
        r#"
[[ports]]
id = 1
transport = "tcp"
address = "0.0.0.0"
service = 4420
[[ports]]
id = 2
transport = "tcp"
address = "127.0.0.1"
service = 4420
[[ports]]
id = 3
transport = "rdma"
address = "127.0.0.1"
service = 4420
[[ports]]
id = 4
transport = "tcp"
address = "::1"
service = 4420
[[ports]]
id = 5
transport = "tcp"
address = "70000"
service = 70000
"#,
    );
    assert_eq!(
        errors,
        [
            "ports[1].address: 127.0.0.1:4420: overlaps ports[0] (0.0.0.0:4420)",
            "ports[4].service: 70000: must be 1..=65535",
            "ports[4].address: 70000: not an IPv4 or IPv6 address",
        ]
    );
}

#[test]
fn subsystem_nqns_are_checked_and_unique() {
    let errors = errors_of(&with_port(
        r#"
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:a"
allow_any_host = true
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:a"
allow_any_host = true
[[subsystems]]
nqn = "testnqn"
allow_any_host = true
[[subsystems]]
nqn = "nqn.2014-08.org.nvmexpress.discovery"
allow_any_host = true
[[subsystems]]
nqn = "nqn.2014-08.org.nvmexpress:uuid:zzzz"
allow_any_host = true
"#,
    ));
    assert_eq!(
        errors,
        [
            "subsystems[1].nqn: nqn.2026-12.dev.nvmfd:a: duplicate NQN (also subsystems[0])",
            "subsystems[3].nqn: nqn.2014-08.org.nvmexpress.discovery: reserved for the discovery subsystem",
        ]
    );
    // Names nvmet accepts validate; those that are not NVMe Base 2.0 §4.5 NQNs are warnings.
    let config = conf::Config::parse_toml(&with_port(
        r#"
[[subsystems]]
nqn = "testnqn"
allow_any_host = true
[[subsystems]]
nqn = "blktests-subsystem-1"
allow_any_host = true
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:a"
allow_any_host = true
[[subsystems]]
nqn = "nqn.2014-08.org.nvmexpress:uuid:zzzz"
allow_any_host = true
"#,
    ))
    .unwrap();
    assert_eq!(config.validate(), Ok(()));
    let warnings: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "subsystems[0].nqn: testnqn: not a well-formed NQN (must start with \"nqn.yyyy-mm.\" (NVMe Base 2.0 §4.5)); served as nvmet would",
            "subsystems[1].nqn: blktests-subsystem-1: not a well-formed NQN (must start with \"nqn.yyyy-mm.\" (NVMe Base 2.0 §4.5)); served as nvmet would",
            "subsystems[3].nqn: nqn.2014-08.org.nvmexpress:uuid:zzzz: not a well-formed NQN (\"zzzz\" is not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)); served as nvmet would",
        ]
    );
    let errors = errors_of(&with_port(
        "[[subsystems]]\nnqn = \"\"\nallow_any_host = true\n[[subsystems]]\nnqn = \"a/b\"\n\
         allow_any_host = true\n[[subsystems]]\nnqn = \"a\\tb\"\nallow_any_host = true\n",
    ));
    assert_eq!(
        errors,
        [
            "subsystems[0].nqn: empty",
            "subsystems[1].nqn: a/b: contains '/' (not a configfs directory name, so nvmet could not hold it either)",
            "subsystems[2].nqn: a\tb: contains control characters",
        ]
    );
    let long = format!("nqn.2026-12.dev.nvmfd:{}", "x".repeat(210));
    let errors = errors_of(&with_port(&format!(
        "[[subsystems]]\nnqn = \"{long}\"\nallow_any_host = true\n"
    )));
    assert_eq!(
        errors,
        [format!(
            "subsystems[0].nqn: {long}: longer than 223 bytes (232)"
        )]
    );
}

#[test]
fn subsystem_hosts_ports_and_identity_fields_are_checked() {
    let errors = errors_of(&with_port(
        r#"
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:a"
serial = "012345678901234567890"
model = "modèle"
allow_any_host = true
allowed_hosts = ["nqn.2014-08.org.nvmexpress:uuid:4c4c4544-0035-4810-8057-b7c04f4e4d32", "host1",
                 "nqn.2014-08.org.nvmexpress:uuid:4c4c4544-0035-4810-8057-b7c04f4e4d32"]
ports = [1, 9, 1]
"#,
    ));
    assert_eq!(
        errors,
        [
            "subsystems[0].serial: 012345678901234567890: longer than 20 characters",
            "subsystems[0].model: modèle: must be printable ASCII",
            "subsystems[0].allow_any_host: true: contradicts the non-empty allowed_hosts / hosts lists",
            "subsystems[0].allowed_hosts[1]: host1: must start with \"nqn.yyyy-mm.\" (NVMe Base 2.0 §4.5)",
            "subsystems[0].allowed_hosts[2]: nqn.2014-08.org.nvmexpress:uuid:4c4c4544-0035-4810-8057-b7c04f4e4d32: listed twice (also subsystems[0].allowed_hosts[0])",
            "subsystems[0].ports[1]: 9: no port with this id in [[ports]]",
            "subsystems[0].ports[2]: 1: listed twice (also subsystems[0].ports[0])",
        ]
    );
}

#[test]
fn namespace_fields_are_checked() {
    let errors = errors_of(&with_port(&subsystem(
        "nqn.2026-12.dev.nvmfd:a",
        &[
            "nsid = 1\nram_size = \"1M\"\nblock_size = 1024",
            "nsid = 1\nram_size = 1000\nblock_size = 4096",
            "nsid = 0",
            "nsid = 4\nram_size = \"1M\"\npath = \"/dev/null\"",
            "nsid = 5\nram_size = 0\nsize = \"1G\"",
            "nsid = 6\nram_size = \"1M\"\nuuid = \"not-a-uuid\"\n\
             nguid = \"00000000000000000000000000000000\"",
        ],
    )));
    assert_eq!(
        errors,
        [
            "subsystems[0].namespaces[0].block_size: 1024: must be 512 or 4096",
            "subsystems[0].namespaces[1].nsid: 1: duplicate nsid (also subsystems[0].namespaces[0])",
            "subsystems[0].namespaces[1].ram_size: 1000: must be a multiple of block_size (4096)",
            "subsystems[0].namespaces[2].nsid: 0: must be 1..=4294967294",
            "subsystems[0].namespaces[2]: needs exactly one of ram_size / path",
            "subsystems[0].namespaces[3]: needs exactly one of ram_size / path",
            "subsystems[0].namespaces[4].ram_size: 0: must be greater than 0",
            "subsystems[0].namespaces[4].size: 1G: only valid with path (RAM namespaces use ram_size)",
            "subsystems[0].namespaces[5].uuid: not-a-uuid: not a UUID (8-4-4-4-12 hex)",
            "subsystems[0].namespaces[5].nguid: 00000000000000000000000000000000: all zeros means \"none\"",
        ]
    );
}

#[test]
fn namespace_paths_are_checked_on_the_filesystem() {
    let dir = std::env::temp_dir().join(format!("conf-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0u8; 8192]).unwrap();
    let empty = dir.join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    let d = dir.display();
    // Namespace i + 1 has the keys of entry i besides its nsid.
    let keys = [
        format!("path = \"{d}/disk.img\""),
        "path = \"/dev/sdz-nvmfd-test\"".to_owned(),
        format!("path = \"{d}/new.img\"\nsize = \"1G\""),
        format!("path = \"{d}/no-dir/new.img\"\nsize = \"1G\""),
        format!("path = \"{d}\""),
        "path = \"relative.img\"".to_owned(),
        format!("path = \"{d}/empty.img\""),
        format!("path = \"{d}/disk.img\""),
        format!("path = \"{d}/ro.img\"\nsize = \"1M\"\nread_only = true"),
    ];
    let namespaces: Vec<String> = (1..)
        .zip(&keys)
        .map(|(nsid, keys)| format!("nsid = {nsid}\n{keys}"))
        .collect();
    let namespaces: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let errors = errors_of(&with_port(&subsystem(
        "nqn.2026-12.dev.nvmfd:a",
        &namespaces,
    )));
    let expected = [
        "subsystems[0].namespaces[1].path: /dev/sdz-nvmfd-test: no such file".to_owned(),
        format!("subsystems[0].namespaces[3].path: {d}/no-dir/new.img: cannot be created: no such directory {d}/no-dir"),
        format!("subsystems[0].namespaces[4].path: {d}: not a regular file or block device"),
        "subsystems[0].namespaces[5].path: relative.img: must be an absolute path".to_owned(),
        format!("subsystems[0].namespaces[6].path: {d}/empty.img: empty file (set size to extend it)"),
        format!("subsystems[0].namespaces[7].path: {d}/disk.img: already exported by subsystems[0].namespaces[0]"),
        "subsystems[0].namespaces[8].size: 1M: cannot create or extend a read_only namespace's file".to_owned(),
    ];
    assert_eq!(errors, expected);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn namespace_identifiers_are_unique_across_subsystems() {
    // The same identifiers, spelt differently.
    let a = "nsid = 1\nram_size = \"1M\"\nuuid = \"26ffc8ce-73b4-321d-9685-7d7a9872c460\"\n\
             nguid = \"ef90689c6c46d44c89c14067801309a8\"";
    let b = "nsid = 1\nram_size = \"1M\"\nuuid = \"26FFC8CE-73B4-321D-9685-7D7A9872C460\"\n\
             nguid = \"ef90689c-6c46-d44c-89c1-4067801309a8\"";
    let errors = errors_of(&with_port(&format!(
        "{}{}",
        subsystem("nqn.2026-12.dev.nvmfd:a", &[a]),
        subsystem("nqn.2026-12.dev.nvmfd:b", &[b])
    )));
    assert_eq!(
        errors,
        [
            "subsystems[1].namespaces[0].uuid: 26FFC8CE-73B4-321D-9685-7D7A9872C460: duplicate uuid (also subsystems[0].namespaces[0])",
            "subsystems[1].namespaces[0].nguid: ef90689c-6c46-d44c-89c1-4067801309a8: duplicate nguid (also subsystems[0].namespaces[0])",
        ]
    );
}

#[test]
fn referrals_are_checked() {
    let errors = errors_of(&with_port(
        "[[referrals]]\ntransport = \"tcp\"\naddress = \"discovery.example\"\nservice = 0\n",
    ));
    assert_eq!(
        errors,
        [
            "referrals[0].address: discovery.example: not an IPv4 or IPv6 address",
            "referrals[0].service: 0: must be 1..=65535",
        ]
    );
}

#[test]
fn to_toml_round_trips_the_embedded_default() {
    let config = Config::load_with_env(None, EnvSource::None).unwrap();
    let text = config.to_toml().unwrap();
    assert_eq!(Config::parse_toml(&text).unwrap(), config);
    assert!(text.contains("ram_size = \"1G\""), "{text}");
}

#[test]
fn the_shipped_example_config_parses_and_validates_but_for_its_image_directory() {
    let text = include_str!("../../systemd/nvmfd.toml");
    let config = Config::parse_toml(text).unwrap();
    assert_eq!(config.ports.len(), 1);
    assert_eq!(config.subsystems.len(), 2);
    let errors: Vec<String> = match config.validate() {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    };
    // /var/lib/nvmfd exists only where nvmfd is installed (StateDirectory= creates it).
    for e in &errors {
        assert!(
            e.starts_with("subsystems[1].namespaces[0].path: /var/lib/nvmfd/disk0.img"),
            "{e}"
        );
    }
}

#[test]
fn discovery_nqn_is_a_well_formed_nqn_no_subsystem_takes() {
    let unique = "nqn.2026-12.dev.nvmfd:discovery-a";
    let ok = format!(
        "[global]\ndiscovery_nqn = \"{unique}\"\n{}",
        with_port(&subsystem("nqn.2026-12.dev.nvmfd:a", &[]))
    );
    assert_eq!(errors_of(&ok), Vec::<String>::new());
    let config = Config::parse_toml(&ok).unwrap();
    assert_eq!(config.global.discovery_nqn.as_deref(), Some(unique));
    let clash = format!(
        "[global]\ndiscovery_nqn = \"{unique}\"\n{}",
        with_port(&subsystem(unique, &[]))
    );
    assert_eq!(
        errors_of(&clash),
        [format!(
            "subsystems[0].nqn: {unique}: is global.discovery_nqn, the discovery subsystem's name"
        )]
    );
    let malformed = format!(
        "[global]\ndiscovery_nqn = \"discovery\"\n{}",
        with_port(&subsystem("nqn.2026-12.dev.nvmfd:a", &[]))
    );
    assert_eq!(
        errors_of(&malformed),
        ["global.discovery_nqn: discovery: must start with \"nqn.yyyy-mm.\" (NVMe Base 2.0 §4.5)"]
    );
}

#[test]
fn schema_and_validation_problems_are_reported_together_in_file_order() {
    let dir = std::env::temp_dir().join(format!("conf-together-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nvmfd.toml");
    std::fs::write(
        &path,
        "[global]\nreactor = 1\nmax_queue_size = 8\n\n[[ports]]\nid = 1\ntransport = \"tcp\"\n\
         address = \"localhost\"\nservice = 4420\n\n[[subsystems]]\n\
         nqn = \"nqn.2026-12.dev.nvmfd:a\"\nallow_any_host = \"yes\"\ncpus = [1]\n",
    )
    .unwrap();
    let err = Config::load_with_env(Some(&path), EnvSource::None).unwrap_err();
    let file = path.display();
    let lines: Vec<String> = err.problems().iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            format!("{file}:2:1: global.reactor: unknown key (did you mean reactors?)"),
            format!("{file}:3:18: global.max_queue_size: 8: must be 16..=1024"),
            format!("{file}:8:11: ports[0].address: localhost: not an IPv4 or IPv6 address"),
            // Deleting the wrongly typed key leaves no host list: that is not reported again.
            format!(
                "{file}:13:18: subsystems[0].allow_any_host: yes: expected boolean, found string"
            ),
            format!("{file}:14:1: subsystems[0].cpus: unknown key"),
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
