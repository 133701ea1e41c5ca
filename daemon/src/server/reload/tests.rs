use super::restart_only_changes;

const BASE: &str = r#"
[global]
reactors = 2

[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = 4420

[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:test"
allow_any_host = true

"#;

fn parse(text: &str) -> conf::Config {
    conf::Config::parse_toml(text).expect("test configuration parses")
}

#[test]
fn live_changes_need_no_restart() {
    let old = parse(BASE);
    let new = parse(&BASE.replace("service = 4420", "service = 4421"));
    assert!(restart_only_changes(&old, &new).is_empty());
    let new = parse(&format!(
        "{BASE}\n[[ports]]\nid = 2\ntransport = \"tcp\"\naddress = \"127.0.0.1\"\nservice = 4422\n"
    ));
    assert!(restart_only_changes(&old, &new).is_empty());
}

#[test]
fn restart_only_keys_are_named() {
    let old = parse(BASE);
    let new = parse(&BASE.replace("reactors = 2", "reactors = 1\nmax_io_queues = 4"));
    assert_eq!(
        restart_only_changes(&old, &new),
        ["global.reactors", "global.max_io_queues"]
    );
    // RDMA ports open and close live; their pool sizes do not change under them.
    let rdma_port =
        "\n[[ports]]\nid = 2\ntransport = \"rdma\"\naddress = \"127.0.0.1\"\nservice = 4420\n";
    let new = parse(&format!("{BASE}{rdma_port}"));
    assert!(restart_only_changes(&old, &new).is_empty());
    let new = parse(&format!(
        "{BASE}{rdma_port}\n[rdma]\ncapsule_buffers = 512\n"
    ));
    assert_eq!(restart_only_changes(&old, &new), ["rdma"]);
    // A TLS port is set up at start; plain ports change live.
    let new = parse(&BASE.replace("service = 4420", "service = 4420\ntls = \"required\""));
    assert_eq!(restart_only_changes(&old, &new), ["ports[].tls"]);
    let new = parse(&BASE.replace("reactors = 2", "reactors = 2\nstate_dir = \"/x\""));
    assert_eq!(restart_only_changes(&old, &new), ["global.state_dir"]);
    let new = parse(&BASE.replace(
        "reactors = 2",
        "reactors = 2\ndiscovery_nqn = \"nqn.2026-12.dev.nvmfd:disc\"",
    ));
    assert_eq!(restart_only_changes(&old, &new), ["global.discovery_nqn"]);
}
