//! QoS limits: `qos = { … }` on namespaces and `[[subsystems.host_qos]]`, their bounds, and
//! the shipped example with its QoS lines uncommented.

mod common;

use common::{assert_has, errors_of, with_port};
use conf::{Config, Qos};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:4c4c4544-0035-4810-8057-b7c04f4e4d32";

#[test]
fn limits_parse_validate_and_round_trip() {
    let text = with_port(&format!(
        r#"
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:a"
allow_any_host = true
[[subsystems.namespaces]]
nsid = 1
ram_size = "1M"
qos = {{ iops = 500, total_mbps = 20, burst_ms = 100 }}
[[subsystems.host_qos]]
host = "{HOST}"
qos = {{ read_mbps = 10, write_mbps = 5 }}
"#
    ));
    assert_eq!(errors_of(&text), Vec::<String>::new());
    let config = Config::parse_toml(&text).unwrap();
    let s = &config.subsystems[0];
    assert_eq!(
        s.namespaces[0].qos,
        Some(Qos {
            iops: 500,
            total_mbps: 20,
            burst_ms: 100,
            ..Qos::default()
        })
    );
    assert_eq!(s.host_qos[0].host, HOST);
    assert_eq!(s.host_qos[0].qos.read_mbps, 10);
    let again = Config::parse_toml(&config.to_toml().unwrap()).unwrap();
    assert_eq!(again, config);
}

#[test]
fn out_of_range_limits_unknown_keys_and_repeated_hosts_are_refused() {
    let ns = |qos: &str| {
        with_port(&format!(
            "[[subsystems]]\nnqn = \"nqn.2026-12.dev.nvmfd:a\"\nallow_any_host = true\n\
             [[subsystems.namespaces]]\nnsid = 1\nram_size = \"1M\"\nqos = {qos}\n"
        ))
    };
    // In a file: refused at load, each with its range.
    let text = ns("{ iops = 1000000001, read_mbps = 1073741825, burst_ms = 60001 }");
    let e = Config::parse_toml(&text).unwrap_err().to_string();
    for want in [
        "subsystems[0].namespaces[0].qos.iops: 1000000001: 1000000001 is out of range 0..=1000000000",
        "subsystems[0].namespaces[0].qos.read_mbps: 1073741825",
        "subsystems[0].namespaces[0].qos.burst_ms: 60001",
    ] {
        assert!(e.contains(want), "{want} in {e}");
    }
    assert!(Config::parse_toml(&ns("{ iopz = 5 }")).is_err());
    // Built otherwise (nvmfd ctl set-qos): refused by validation.
    let mut config = Config::parse_toml(&ns("{ iops = 5 }")).unwrap();
    config.subsystems[0].namespaces[0].qos = Some(Qos {
        iops: 1_000_000_001,
        total_mbps: (1 << 30) + 1,
        burst_ms: 60_001,
        ..Qos::default()
    });
    let errors: Vec<String> = config
        .validate()
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_has(
        &errors,
        "subsystems[0].namespaces[0].qos.iops: 1000000001: at most 1000000000",
    );
    assert_has(
        &errors,
        "subsystems[0].namespaces[0].qos.total_mbps: 1073741825: at most 1073741824 MiB/s",
    );
    assert_has(
        &errors,
        "subsystems[0].namespaces[0].qos.burst_ms: 60001: at most 60000 ms",
    );
    // Hosts: valid NQNs, each once.
    let text = with_port(&format!(
        r#"
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:a"
allow_any_host = true
[[subsystems.host_qos]]
host = "{HOST}"
qos = {{ iops = 1 }}
[[subsystems.host_qos]]
host = "{HOST}"
qos = {{ iops = 2 }}
[[subsystems.host_qos]]
host = "host1"
qos = {{ iops = 2 }}
"#
    ));
    let errors = errors_of(&text);
    assert_has(
        &errors,
        &format!(
            "subsystems[0].host_qos[1].host: {HOST}: listed twice (also subsystems[0].host_qos[0])"
        ),
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("subsystems[0].host_qos[2].host: host1:")),
        "{errors:#?}"
    );
}

#[test]
fn the_shipped_example_validates_with_its_qos_lines_uncommented() {
    let text = include_str!("../../systemd/nvmfd.toml")
        .replace("# qos = {", "qos = {")
        .replace("# [[subsystems.host_qos]]", "[[subsystems.host_qos]]")
        .replace(
            &format!("# host = \"{HOST}\""),
            &format!("host = \"{HOST}\""),
        )
        .replace("# qos = { iops = 20000", "qos = { iops = 20000");
    let config = Config::parse_toml(&text).unwrap();
    assert!(config.subsystems[1].namespaces[0].qos.is_some());
    assert_eq!(config.subsystems[1].host_qos.len(), 1);
    let errors: Vec<String> = match config.validate() {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    };
    for e in &errors {
        assert!(e.contains("/var/lib/nvmfd/disk0.img"), "{e}");
    }
}
