//! `nvmfd check-config` and `nvmfd import-nvmetcli`: exit codes and messages.

use std::path::PathBuf;
use std::process::Command;

fn nvmfd() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nvmfd"));
    // The embedded default must not be shadowed by overrides from the test environment.
    command
        .env_remove("NVMFD_GLOBAL__LOG_LEVEL")
        .env_remove("RUST_LOG");
    command
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nvmfd-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn check_config_accepts_a_valid_file() {
    let dir = scratch("valid");
    let path = dir.join("nvmfd.toml");
    std::fs::write(
        &path,
        r#"
[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = 4420
[[subsystems]]
nqn = "nqn.2026-12.dev.nvmfd:t"
[[subsystems.namespaces]]
nsid = 1
ram_size = "64M"
"#,
    )
    .unwrap();
    let out = nvmfd()
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("OK (1 port(s), 1 subsystem(s), 1 namespace(s))"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_config_lists_every_error_and_exits_1() {
    let dir = scratch("invalid");
    let path = dir.join("nvmfd.toml");
    std::fs::write(
        &path,
        r#"
[[ports]]
id = 1
transport = "tcp"
address = "127.0.0.1"
service = 0
[[subsystems]]
nqn = "not-an-nqn"
[[subsystems.namespaces]]
nsid = 1
path = "/dev/sdz-does-not-exist"
"#,
    )
    .unwrap();
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
        "subsystems[0].nqn: not-an-nqn: must start with \"nqn.yyyy-mm.\"",
        "subsystems[0].namespaces[0].path: /dev/sdz-does-not-exist: no such file",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_config_reports_syntax_unknown_keys_and_missing_files() {
    let dir = scratch("syntax");
    let path = dir.join("nvmfd.toml");
    std::fs::write(&path, "[global]\nlog_levle = \"debug\"\n").unwrap();
    let out = nvmfd()
        .arg("check-config")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("global.log_levle: unknown field `log_levle`"),
        "{stderr}"
    );

    let missing = dir.join("missing.toml");
    let out = nvmfd()
        .arg("check-config")
        .arg("--config")
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_config_applies_environment_overrides() {
    let dir = scratch("env");
    let path = dir.join("nvmfd.toml");
    std::fs::write(
        &path,
        "[[ports]]\nid = 1\ntransport = \"tcp\"\naddress = \"127.0.0.1\"\nservice = 4420\n",
    )
    .unwrap();
    let out = nvmfd()
        .arg("check-config")
        .arg("--config")
        .arg(&path)
        .env("NVMFD_GLOBAL__MAX_QUEUE_SIZE", "4")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("global.max_queue_size: 4: must be 16..=1024"));
    std::fs::remove_dir_all(&dir).unwrap();
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
