//! `nvmfd generate-docs DIR` (hidden): the manual pages nvmfd(8), nvmfd-ctl(8) and
//! nvmfd.toml(5), and the bash, zsh and fish completions, generated from the command-line
//! definition and the configuration schema so that they cannot drift from the code.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::Command;
use clap_complete::Shell;
use conf::manual::roff;

/// Writes every page and completion under `out` (`man/`, `completions/`); returns the paths.
pub fn generate(command: Command, out: &Path) -> io::Result<Vec<PathBuf>> {
    let mut completed = visible(&command);
    let mut command = command;
    command.build();
    let man = out.join("man");
    let completions = out.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let version = env!("CARGO_PKG_VERSION");
    let mut written = Vec::new();
    let mut write = |path: PathBuf, bytes: &[u8]| -> io::Result<()> {
        std::fs::write(&path, bytes)?;
        written.push(path);
        Ok(())
    };
    write(man.join("nvmfd.8"), &nvmfd_page(&command)?)?;
    let ctl = command
        .find_subcommand("ctl")
        .cloned()
        .ok_or_else(|| io::Error::other("no ctl subcommand"))?;
    write(man.join("nvmfd-ctl.8"), &ctl_page(&ctl)?)?;
    write(
        man.join("nvmfd.toml.5"),
        conf::manual::page(version).as_bytes(),
    )?;
    for (shell, name) in [
        (Shell::Bash, "nvmfd.bash"),
        (Shell::Zsh, "_nvmfd"),
        (Shell::Fish, "nvmfd.fish"),
    ] {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut completed, "nvmfd", &mut text);
        write(completions.join(name), &text)?;
    }
    Ok(written)
}

/// `command` without its hidden subcommands (which the completion generators would offer).
fn visible(command: &Command) -> Command {
    let arguments = command
        .get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .cloned();
    let mut visible = Command::new("nvmfd")
        .version(env!("CARGO_PKG_VERSION"))
        .args(arguments)
        .subcommands(
            command
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .cloned(),
        );
    if let Some(about) = command.get_about() {
        visible = visible.about(about.clone());
    }
    visible
}

fn section(w: &mut dyn Write, title: &str, paragraphs: &[&str]) -> io::Result<()> {
    writeln!(w, ".SH {title}")?;
    for (i, paragraph) in paragraphs.iter().enumerate() {
        if i > 0 {
            writeln!(w, ".PP")?;
        }
        writeln!(w, "{}", roff(paragraph))?;
    }
    Ok(())
}

/// One subcommand: its usage, description and every argument.
fn command_entry(w: &mut dyn Write, command: &Command) -> io::Result<()> {
    let name = command.get_bin_name().unwrap_or(command.get_name());
    writeln!(w, ".SS \"{}\"", roff(name))?;
    let usage = command.clone().render_usage().to_string();
    let usage = usage.strip_prefix("Usage: ").unwrap_or(&usage);
    writeln!(w, "\\fB{}\\fR", roff(usage.trim()))?;
    writeln!(w, ".br")?;
    let about = command
        .get_long_about()
        .or(command.get_about())
        .map(ToString::to_string)
        .unwrap_or_default();
    writeln!(w, "{}", roff(&about))?;
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        // Global options are described once, in OPTIONS.
        if arg.is_hide_set() || arg.is_global_set() || id == "help" || id == "version" {
            continue;
        }
        let value = arg
            .get_value_names()
            .map(|names| names.join(" "))
            .unwrap_or_else(|| id.to_ascii_uppercase());
        let takes_value = arg.get_action().takes_values();
        let flag = match (arg.get_short(), arg.get_long()) {
            (None, None) => format!("<{value}>"),
            (short, long) => {
                let mut names: Vec<String> = short.map(|s| format!("-{s}")).into_iter().collect();
                names.extend(long.map(|l| format!("--{l}")));
                let mut flag = names.join(", ");
                if takes_value {
                    flag.push_str(&format!(" <{value}>"));
                }
                flag
            }
        };
        writeln!(w, ".TP")?;
        writeln!(w, "\\fB{}\\fR", roff(&flag))?;
        let mut help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        if !defaults.is_empty() && takes_value {
            help.push_str(&format!(" [default: {}]", defaults.join(", ")));
        }
        writeln!(w, "{}", roff(&help))?;
    }
    Ok(())
}

fn nvmfd_page(command: &Command) -> io::Result<Vec<u8>> {
    let man = clap_mangen::Man::new(command.clone()).section("8");
    let mut w = Vec::new();
    man.render_title(&mut w)?;
    man.render_name_section(&mut w)?;
    man.render_synopsis_section(&mut w)?;
    section(
        &mut w,
        "DESCRIPTION",
        &[
            "nvmfd is an NVMe-over-Fabrics target: it exports block storage (RAM, files, block \
             devices, Ceph RBD) to hosts over NVMe/TCP and NVMe/RDMA. Without a subcommand it \
             serves the configuration given with --config, else /etc/nvmfd/nvmfd.toml when it \
             exists, else a built-in default (a 1 GiB RAM namespace on 127.0.0.1:4420), until \
             SIGTERM or SIGINT.",
            "The configuration is described in nvmfd.toml(5); the running daemon is inspected and \
             changed with nvmfd ctl, nvmfd-ctl(8). Under systemd it runs as nvmfd.service \
             (Type=notify, with a watchdog).",
        ],
    )?;
    man.render_options_section(&mut w)?;
    writeln!(w, ".SH COMMANDS")?;
    for sub in command.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        if sub.get_name() == "ctl" {
            writeln!(w, ".SS \"nvmfd ctl\"")?;
            writeln!(
                w,
                "{}",
                roff("Inspect or change a running nvmfd through its control socket: see nvmfd-ctl(8).")
            )?;
            continue;
        }
        command_entry(&mut w, sub)?;
    }
    section(
        &mut w,
        "SIGNALS",
        &[
            "SIGHUP re-reads the configuration and applies what changes live (see nvmfd.toml(5)); \
             a file that does not validate or changes a restart-only key is refused and the \
             running configuration kept. SIGTERM and SIGINT drain in-flight I/O (at most 3 s) \
             and exit; a second signal exits at once.",
        ],
    )?;
    section(
        &mut w,
        "ENVIRONMENT",
        &[
            "NVMFD_<SECTION>__<KEY> overrides a configuration key, e.g. \
             NVMFD_GLOBAL__LOG_LEVEL=debug; problems with such a value name the variable.",
            "NOTIFY_SOCKET and WATCHDOG_USEC, set by systemd, enable readiness and watchdog \
             notifications.",
        ],
    )?;
    section(
        &mut w,
        "EXIT STATUS",
        &[
            "0: stopped by a signal after serving, or check-config found no problem. \
             1: the configuration has problems (each printed as file:line:column: key: value: \
             reason), or serving failed (a port cannot be opened, a backing file cannot be \
             read). For nvmfd ctl see nvmfd-ctl(8).",
        ],
    )?;
    section(
        &mut w,
        "FILES",
        &[
            "/etc/nvmfd/nvmfd.toml: the configuration. /run/nvmfd/control.sock: the control \
             socket. /var/lib/nvmfd: state (reservations, counters) and image files.",
        ],
    )?;
    section(
        &mut w,
        "SEE ALSO",
        &["nvmfd-ctl(8), nvmfd.toml(5), nvme(1), systemctl(1)"],
    )?;
    man.render_version_section(&mut w)?;
    Ok(w)
}

fn ctl_page(ctl: &Command) -> io::Result<Vec<u8>> {
    let ctl = ctl
        .clone()
        .name("nvmfd-ctl")
        .bin_name("nvmfd ctl")
        .version(env!("CARGO_PKG_VERSION"));
    let man = clap_mangen::Man::new(ctl.clone())
        .section("8")
        .title("NVMFD-CTL");
    let mut w = Vec::new();
    man.render_title(&mut w)?;
    man.render_name_section(&mut w)?;
    man.render_synopsis_section(&mut w)?;
    section(
        &mut w,
        "DESCRIPTION",
        &[
            "nvmfd ctl sends one request to a running nvmfd over its control socket \
             (global.control_socket, default /run/nvmfd/control.sock; root only) and prints the \
             answer as a table, or as the daemon's JSON with --json. A change is applied live and \
             written through to the configuration file unless --transient is given.",
        ],
    )?;
    man.render_options_section(&mut w)?;
    writeln!(w, ".SH COMMANDS")?;
    for sub in ctl.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        command_entry(&mut w, sub)?;
    }
    writeln!(w, ".SH \"EXIT STATUS\"")?;
    for (code, meaning) in crate::control::cli::EXIT_STATUS {
        writeln!(w, ".TP\n\\fB{code}\\fR\n{}", roff(meaning))?;
    }
    section(
        &mut w,
        "SEE ALSO",
        &["nvmfd(8), nvmfd.toml(5), systemctl(1)"],
    )?;
    man.render_version_section(&mut w)?;
    Ok(w)
}
