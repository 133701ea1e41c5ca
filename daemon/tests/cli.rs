//! `nvmfd check-config` and `nvmfd import-nvmetcli`: exit codes and messages.

mod fixture;

use std::path::Path;
use std::process::Command;

use fixture::{nvmfd, tcp_port, TempDir};

fn check_config(path: &Path) -> Command {
    let mut command = nvmfd();
    command.arg("check-config").arg("--config").arg(path);
    command
}

#[test]
fn check_config_accepts_a_valid_file() {
    let dir = TempDir::new("cli-valid");
    let path = dir.write_config(&format!(
        "{}\n[[subsystems]]\nnqn = \"nqn.2026-12.dev.nvmfd:t\"\nallow_any_host = true\n\
         [[subsystems.namespaces]]\nnsid = 1\nram_size = \"64M\"\n",
        tcp_port(1, 4420)
    ));
    let out = check_config(&path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("OK (1 port(s), 1 subsystem(s), 1 namespace(s))"),
        "{stdout}"
    );
}

#[test]
fn check_config_lists_every_error_and_exits_1() {
    let dir = TempDir::new("cli-invalid");
    let path = dir.write_config(&format!(
        "{}\n[[subsystems]]\nnqn = \"not/an-nqn\"\nallow_any_host = true\n\
         [[subsystems.namespaces]]\nnsid = 1\npath = \"/dev/sdz-does-not-exist\"\n",
        tcp_port(1, 0)
    ));
    let out = nvmfd()
        .arg("check-config")
        .arg("-c")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "3 error(s):",
        "ports[0].service: 0: must be 1..=65535",
        "subsystems[0].nqn: not/an-nqn: contains '/'",
        "subsystems[0].namespaces[0].path: /dev/sdz-does-not-exist: no such file",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
}

#[test]
fn check_config_reports_syntax_unknown_keys_and_missing_files() {
    let dir = TempDir::new("cli-syntax");
    let path = dir.write_config("[global]\nlog_levle = \"debug\"\n");
    let out = check_config(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("global.log_levle: unknown field `log_levle`"),
        "{stderr}"
    );

    let missing = dir.join("missing.toml");
    let out = check_config(&missing).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
}

#[test]
fn check_config_applies_environment_overrides() {
    let dir = TempDir::new("cli-env");
    let path = dir.write_config(&tcp_port(1, 4420));
    let out = check_config(&path)
        .env("NVMFD_GLOBAL__MAX_QUEUE_SIZE", "4")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("global.max_queue_size: 4: must be 16..=1024"));
}

#[test]
fn import_nvmetcli_prints_toml_and_warnings() {
    let json = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../conf/tests/data/nvmetcli-saveconfig.json"
    );
    let out = nvmfd().args(["import-nvmetcli", json]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let config = conf::Config::parse_toml(&stdout).unwrap();
    assert_eq!(config.subsystems.len(), 2);
    assert_eq!(config.ports.len(), 2);
    assert!(
        stderr.contains("warning: port 10: transport \"loop\" is not supported"),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: would not validate here: "),
        "{stderr}"
    );

    let out = nvmfd()
        .args(["import-nvmetcli", "/nonexistent/config.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}
