//! Multipath settings: `[[ana_groups]]` with per-port states, the namespaces' `ana_group`, and
//! the controller ID range, parsed and validated with every problem's key.

mod common;

use common::{subsystem, PORT};
use conf::multipath::{AnaState, PortAnaState};
use conf::Config;

/// `cntlid_min`/`cntlid_max`, the port, `ana_groups` (TOML) and one subsystem whose namespaces
/// (1 MiB each, nsid 1, 2, …) are in the given ANA groups (None: the default).
fn file((min, max): (u32, u32), ana_groups: &str, namespace_groups: &[Option<u32>]) -> Config {
    let namespaces: Vec<String> = (1..)
        .zip(namespace_groups)
        .map(|(nsid, group)| match group {
            Some(group) => format!("nsid = {nsid}\nram_size = \"1M\"\nana_group = {group}"),
            None => format!("nsid = {nsid}\nram_size = \"1M\""),
        })
        .collect();
    let namespaces: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let text = format!(
        "[global]\ncntlid_min = {min}\ncntlid_max = {max}\n{PORT}\n{ana_groups}\n{}",
        subsystem("nqn.2026-12.dev.nvmfd:mp", &namespaces)
    );
    Config::parse_toml(&text).unwrap()
}

/// The key of every problem the whole validation reports.
fn error_keys(config: &Config) -> Vec<String> {
    let errors = config.validate().err().unwrap_or_default();
    errors.into_iter().map(|e| e.key).collect()
}

#[test]
fn parses_groups_states_and_namespace_groups() {
    let c = file(
        (101, 200),
        r#"
[[ana_groups]]
id = 2
state = "inaccessible"
port_states = [{ port = 1, state = "non-optimized" }]

[[ana_groups]]
id = 3
"#,
        &[Some(2), None],
    );
    assert_eq!((c.global.cntlid_min, c.global.cntlid_max), (101, 200));
    assert_eq!(c.ana_groups[0].state, AnaState::Inaccessible);
    assert_eq!(
        c.ana_groups[0].port_states,
        vec![PortAnaState {
            port: 1,
            state: AnaState::NonOptimized
        }]
    );
    assert_eq!(c.ana_groups[1].state, AnaState::Optimized, "default");
    assert_eq!(c.subsystems[0].namespaces[0].ana_group, 2);
    assert_eq!(c.subsystems[0].namespaces[1].ana_group, 1, "default");
    assert_eq!(error_keys(&c), Vec::<String>::new());
    // Every state name the file accepts.
    for name in [
        "optimized",
        "non-optimized",
        "inaccessible",
        "persistent-loss",
        "change",
    ] {
        let text = format!("{PORT}\n[[ana_groups]]\nid = 2\nstate = \"{name}\"\n");
        assert!(Config::parse_toml(&text).is_ok(), "{name}");
    }
    assert!(Config::parse_toml(&format!(
        "{PORT}\n[[ana_groups]]\nid = 2\nstate = \"optimised\"\n"
    ))
    .is_err());
}

#[test]
fn reports_every_problem_with_its_key() {
    let mut c = file(
        (300, 200),
        r#"
[[ana_groups]]
id = 0
[[ana_groups]]
id = 2
port_states = [{ port = 9, state = "change" }, { port = 1, state = "change" }, { port = 1, state = "optimized" }]
[[ana_groups]]
id = 2
"#,
        &[Some(5)],
    );
    assert_eq!(
        error_keys(&c),
        vec![
            "global.cntlid_max",
            "ana_groups[0].id",
            "ana_groups[1].port_states[0].port",
            "ana_groups[1].port_states[2].port",
            "ana_groups[2].id",
            "subsystems[0].namespaces[0].ana_group",
        ]
    );
    c.global.cntlid_min = 0;
    c.global.cntlid_max = 0x1_0000;
    let keys = error_keys(&c);
    assert_eq!(&keys[..2], &["global.cntlid_min", "global.cntlid_max"]);
}
