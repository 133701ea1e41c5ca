//! What the conf integration tests share: the smallest valid file and the TOML pieces to grow
//! it, and validation turned into comparable lines.
#![allow(dead_code)]

use conf::Config;

/// The one port every test file needs (a file without ports does not validate).
pub const PORT: &str = r#"
[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = 4420
"#;

pub fn with_port(rest: &str) -> String {
    format!("{PORT}\n{rest}")
}

/// `[[subsystems]]` `nqn` with one `[[subsystems.namespaces]]` table per entry of
/// `namespaces` (each entry holds that table's keys).
pub fn subsystem(nqn: &str, namespaces: &[&str]) -> String {
    let mut text = format!("[[subsystems]]\nnqn = \"{nqn}\"\nallow_any_host = true\n");
    for keys in namespaces {
        text.push_str("[[subsystems.namespaces]]\n");
        text.push_str(keys.trim_start_matches('\n'));
        if !keys.ends_with('\n') {
            text.push('\n');
        }
    }
    text
}

/// Parses (no environment, must succeed) and validates, returning the error lines.
pub fn errors_of(toml: &str) -> Vec<String> {
    let config = Config::parse_toml(toml).unwrap_or_else(|e| panic!("parse failed: {e}"));
    match config.validate() {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

pub fn assert_has(errors: &[String], expected: &str) {
    assert!(
        errors.iter().any(|e| e == expected),
        "expected {expected:?} among {errors:#?}"
    );
}
