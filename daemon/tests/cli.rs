//! `nvmfd check-config`, `nvmfd import-nvmetcli`, `nvmfd ctl` without a daemon and the
//! generated manual pages: exit codes and messages.

mod fixture;

use std::path::Path;
use std::process::Command;

use fixture::{nvmfd, tcp_port, TempDir};

/// `nvmfd check-config FILE` (positional, as documented).
fn check_config(path: &Path) -> Command {
    let mut command = nvmfd();
    command.arg("check-config").arg(path);
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
    let file = path.display();
    for expected in [
        format!("{file}:6:11: ports[0].service: 0: must be 1..=65535"),
        format!(
            "{file}:9:7: subsystems[0].nqn: not/an-nqn: contains '/' (not a configfs directory \
             name, so nvmet could not hold it either)"
        ),
        format!(
            "{file}:13:8: subsystems[0].namespaces[0].path: /dev/sdz-does-not-exist: no such file"
        ),
        format!("nvmfd: 3 errors in {file}"),
    ] {
        assert!(
            stderr.lines().any(|line| line == expected),
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
    assert_eq!(
        stderr,
        format!(
            "{file}:2:1: global.log_levle: unknown key (did you mean log_level?)\n\
             {file}: ports: at least one port is required\n\
             nvmfd: 2 errors in {file}\n",
            file = path.display()
        )
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
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "NVMFD_GLOBAL__MAX_QUEUE_SIZE: global.max_queue_size: 4: must be 16..=1024\n"
    );
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

/// The mistakes a new user makes first: each gives one line naming the file, line and column
/// (where the file has one), the key and what is wrong.
#[test]
fn a_new_users_ten_mistakes_each_give_one_clear_message() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("cli-ten");
    let port = tcp_port(1, 4420);
    let subsystem = |nqn: &str, namespaces: &str| {
        format!("[[subsystems]]\nnqn = \"{nqn}\"\nallow_any_host = true\n{namespaces}")
    };
    let ram = "[[subsystems.namespaces]]\nnsid = 1\nram_size = \"64M\"\n";
    let key_file = dir.join("host.key");
    std::fs::write(
        &key_file,
        "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:\n",
    )
    .unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let long_nqn = format!("nqn.2026-12.dev.nvmfd:{}", "x".repeat(210));
    let cases: Vec<(&str, String, String)> =
        vec![
        (
            "syntax error",
            format!("{port}\n[[subsystems]\n"),
            ":8:13: TOML syntax error: invalid table header; expected `.`, `]]`".into(),
        ),
        (
            "unknown key",
            format!("{port}\n{}read_ony = true\n", subsystem("nqn.2026-12.dev.nvmfd:a", ram)),
            ":14:1: subsystems[0].namespaces[0].read_ony: unknown key (did you mean read_only?)"
                .into(),
        ),
        (
            "wrong type",
            format!("[global]\nreactors = \"two\"\n{port}"),
            ":2:12: global.reactors: two: expected integer, found string".into(),
        ),
        (
            "duplicate NSID",
            format!("{port}\n{}{ram}", subsystem("nqn.2026-12.dev.nvmfd:a", ram)),
            ":15:8: subsystems[0].namespaces[1].nsid: 1: duplicate nsid (also \
             subsystems[0].namespaces[0])"
                .into(),
        ),
        (
            "missing backing file",
            format!(
                "{port}\n{}",
                subsystem(
                    "nqn.2026-12.dev.nvmfd:a",
                    "[[subsystems.namespaces]]\nnsid = 1\npath = \"/nonexistent/disk.img\"\n"
                )
            ),
            ":13:8: subsystems[0].namespaces[0].path: /nonexistent/disk.img: no such file".into(),
        ),
        (
            "bad size",
            format!(
                "{port}\n{}",
                subsystem(
                    "nqn.2026-12.dev.nvmfd:a",
                    "[[subsystems.namespaces]]\nnsid = 1\nram_size = \"64MB\"\n"
                )
            ),
            ":13:12: subsystems[0].namespaces[0].ram_size: 64MB: \"64MB\" is not a number with \
             an optional K/M/G/T (or KiB/MiB/GiB/TiB) suffix (sizes are binary: 4096, \"512M\", \
             \"1G\", \"1GiB\"; no decimal KB/MB)"
                .into(),
        ),
        (
            "overlong NQN",
            format!("{port}\n{}", subsystem(&long_nqn, ram)),
            format!(":9:7: subsystems[0].nqn: {long_nqn}: longer than 223 bytes (232)"),
        ),
        (
            "key file readable by others",
            format!(
                "{port}\n[[subsystems]]\nnqn = \"nqn.2026-12.dev.nvmfd:a\"\n\
                 [[subsystems.hosts]]\nnqn = \"nqn.2014-08.org.nvmexpress:uuid:\
                 8ca1bf4e-5e7e-4a7b-a3a4-9f0b2d5c1e01\"\ndhchap_key_file = \"{}\"\n",
                key_file.display()
            ),
            format!(
                ":12:19: subsystems[0].hosts[0].dhchap_key_file: {key}: key file {key} is \
                 readable by group or others (mode 644); chmod 600 it",
                key = key_file.display()
            ),
        ),
        (
            "duplicate NQN",
            format!(
                "{port}\n{}{}",
                subsystem("nqn.2026-12.dev.nvmfd:a", ram),
                subsystem("nqn.2026-12.dev.nvmfd:a", "")
            ),
            ":15:7: subsystems[1].nqn: nqn.2026-12.dev.nvmfd:a: duplicate NQN (also \
             subsystems[0])"
                .into(),
        ),
    ];
    for (case, text, expected) in cases {
        let path = dir.write_config(&text);
        let out = check_config(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{case}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{case}: one message expected:\n{stderr}");
        let expected = format!("{}{expected}", path.display());
        assert!(
            lines[0].starts_with(&expected),
            "{case}:\n got {}\nwant {expected}",
            lines[0]
        );
    }

    // The tenth: a port another process holds, found when the daemon starts serving.
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().port();
    let path = dir.write_config(&format!(
        "[global]\ncontrol_socket = \"{}\"\n{}\n{}",
        dir.join("control.sock").display(),
        tcp_port(1, taken),
        subsystem("nqn.2026-12.dev.nvmfd:a", ram)
    ));
    let out = fixture::serve(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let expected = format!(
        "{}:8:11: port 1: cannot listen on 127.0.0.1:{taken}: Address already in use (os error \
         98) (another process listens there: another nvmfd, or the kernel target nvmet; `ss \
         -ltnp 'sport = :{taken}'` names it)",
        path.display()
    );
    assert!(
        errors[0].ends_with(&expected),
        "got {}\nwant …{expected}",
        errors[0]
    );
}

#[test]
fn check_config_reports_every_schema_error_at_once_and_as_json() {
    let dir = TempDir::new("cli-json");
    let path = dir.write_config(&format!(
        "[global]\nreactor = 1\nmax_io_queues = \"8\"\n{}",
        tcp_port(1, 4420)
    ));
    let out = nvmfd()
        .args(["check-config", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let errors = report["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{report:#}");
    assert_eq!(errors[0]["kind"], "unknown-key");
    assert_eq!(errors[0]["key"], "global.reactor");
    assert_eq!(errors[0]["line"], 2);
    assert_eq!(errors[0]["column"], 1);
    assert_eq!(errors[1]["kind"], "wrong-type");
    assert_eq!(errors[1]["key"], "global.max_io_queues");
    assert_eq!(errors[1]["line"], 3);
    assert_eq!(errors[1]["file"], path.display().to_string());

    let path = dir.write_config(&tcp_port(1, 4420));
    let out = nvmfd()
        .args(["check-config", "--json", "-c"])
        .arg(&path)
        .env("NVMFD_GLOBAL__LOG_FORMAT", "xml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors"][0]["env"], "NVMFD_GLOBAL__LOG_FORMAT");
    assert_eq!(report["errors"][0]["key"], "global.log_format");

    let out = nvmfd()
        .args(["check-config", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&report["ok"], &report["ports"]), (&true.into(), &1.into()));
}

#[test]
fn ctl_without_a_daemon_exits_3_with_a_hint() {
    let dir = TempDir::new("cli-ctl");
    let socket = dir.join("control.sock");
    let out = nvmfd()
        .args(["ctl", "--socket"])
        .arg(&socket)
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "nvmfd ctl: nvmfd is not running: nothing listens on {}",
            socket.display()
        )) && stderr.contains("systemctl status nvmfd"),
        "{stderr}"
    );
    // A socket file left behind by a daemon that is gone: the same.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let out = nvmfd()
        .args(["ctl", "-s"])
        .arg(&socket)
        .arg("subsystems")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

#[test]
fn generated_manual_pages_render_and_completions_are_written() {
    let dir = TempDir::new("cli-docs");
    let out = nvmfd()
        .arg("generate-docs")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for file in [
        "man/nvmfd.8",
        "man/nvmfd-ctl.8",
        "man/nvmfd.toml.5",
        "completions/nvmfd.bash",
        "completions/_nvmfd",
        "completions/nvmfd.fish",
    ] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(text.contains("check") || text.contains("nsid"), "{file}");
    }
    let bash = std::fs::read_to_string(dir.join("completions/nvmfd.bash")).unwrap();
    assert!(bash.contains("add-namespace"), "ctl subcommands complete");
    assert!(
        !bash.contains("generate-docs"),
        "hidden commands are not offered"
    );
    // Rendered as a reader would (man-db), where installed.
    if Command::new("man").arg("--version").output().is_err() {
        eprintln!("man not installed: pages checked as text only");
        return;
    }
    for page in ["nvmfd.8", "nvmfd-ctl.8", "nvmfd.toml.5"] {
        let out = Command::new("man")
            .args(["-l", "--warnings=all"])
            .arg(dir.join("man").join(page))
            .env("MANWIDTH", "80")
            .env("MAN_KEEP_FORMATTING", "0")
            .output()
            .unwrap();
        // Bold and underline are overstruck (`X\bX`) when the output is not a terminal.
        let mut stdout = String::new();
        for c in String::from_utf8_lossy(&out.stdout).chars() {
            if c == '\u{8}' {
                stdout.pop();
            } else {
                stdout.push(c);
            }
        }
        assert!(out.status.success(), "{page}: {out:?}");
        assert!(
            out.stderr.is_empty(),
            "{page}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("SEE ALSO"), "{page}: {stdout}");
    }
}
