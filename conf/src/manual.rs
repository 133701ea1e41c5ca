//! `nvmfd.toml(5)`: the manual page of the configuration file, rendered (roff) from the
//! schema table, so that every key the loader accepts is documented with its type, default
//! and reload behaviour.

use crate::schema::{Absent, Key, Reload, Type, KEYS};
use crate::{DEFAULT_PATH, ENV_PREFIX};

/// Text as roff: backslashes and hyphens escaped, no line starting with a control character.
pub fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    escaped
        .lines()
        .map(|line| {
            if line.starts_with('.') || line.starts_with('\'') {
                format!("\\&{line}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The TOML heading of a section or entry key: `[global]`, `[[subsystems.namespaces]]`.
fn heading(key: &Key) -> String {
    let name = key.path.replace("[]", "");
    match key.ty {
        Type::Entries => format!("[[{name}]]"),
        _ => format!("[{name}]"),
    }
}

fn facts(key: &Key) -> String {
    let default = match key.default {
        Absent::Required => "required".to_owned(),
        Absent::Value(value) => format!("default {value}"),
        Absent::Unset(meaning) => format!("unset: {meaning}"),
    };
    let reload = match key.reload {
        Reload::Live => "changes live on reload",
        Reload::Restart => "restart to change",
    };
    format!("{}; {default}; {reload}.", key.ty.describe())
}

/// The whole page.
pub fn page(version: &str) -> String {
    let mut out = String::new();
    let mut line = |text: &str| {
        out.push_str(text);
        out.push('\n');
    };
    line(&format!(
        ".TH NVMFD.TOML 5 \"\" \"nvmfd {}\" \"File Formats\"",
        roff(version)
    ));
    line(".SH NAME");
    line("nvmfd.toml \\- configuration file of the nvmfd NVMe\\-over\\-Fabrics target");
    line(".SH SYNOPSIS");
    line(&roff(DEFAULT_PATH));
    line(".SH DESCRIPTION");
    line(&roff(
        "nvmfd reads one TOML file: --config PATH, else /etc/nvmfd/nvmfd.toml when it exists, \
         else a built-in default (a 1 GiB RAM namespace on 127.0.0.1:4420). \
         nvmfd check-config FILE reports every problem of a file at once, each as \
         file:line:column, key path and reason (--json for tools); the daemon refuses to start \
         with any.",
    ));
    line(".PP");
    line(&roff(
        "Sizes are integers (bytes) or strings with a binary suffix: \"512M\", \"1G\", \"1GiB\" \
         (K, M, G, T; decimal KB/MB are refused). Keys are listed below by section, each with \
         its type, its default and when a change takes effect: \"changes live on reload\" \
         (systemctl reload nvmfd, SIGHUP or nvmfd ctl reload apply it to the running daemon) or \
         \"restart to change\" (a reload that changes it is refused and the running \
         configuration kept).",
    ));
    line(".SH KEYS");
    for key in KEYS {
        match key.ty {
            Type::Section | Type::Entries => {
                line(&format!(".SS \"{}\"", roff(&heading(key))));
                line(&roff(key.doc));
                line(".br");
                line(&format!("\\fI{}\\fR", roff(&facts(key))));
            }
            _ => {
                line(".TP");
                line(&format!("\\fB{}\\fR", roff(crate::schema::leaf(key.path))));
                line(&roff(key.doc));
                line(".br");
                line(&format!("\\fI{}\\fR", roff(&facts(key))));
            }
        }
    }
    line(".SH ENVIRONMENT");
    line(&roff(&format!(
        "{ENV_PREFIX}_<SECTION>__<KEY> overrides a key of a section: \
         {ENV_PREFIX}_GLOBAL__LOG_LEVEL=debug, {ENV_PREFIX}_GLOBAL__CPUS=2,3, \
         {ENV_PREFIX}_METRICS__LISTEN=127.0.0.1:9469. Entries ([[ports]], [[subsystems]] …) \
         cannot be set from the environment. A problem with an overridden value names the \
         variable."
    )));
    line(".SH EXAMPLE");
    line(".nf");
    line(&roff(
        "[[ports]]\nid = 1\ntransport = \"tcp\"\naddress = \"0.0.0.0\"\nservice = 4420\n\n\
         [[subsystems]]\nnqn = \"nqn.2026-12.com.example:vol1\"\n\
         allowed_hosts = [\"nqn.2014-08.org.nvmexpress:uuid:<host uuid>\"]\n\n\
         [[subsystems.namespaces]]\nnsid = 1\npath = \"/var/lib/nvmfd/vol1.img\"\nsize = \"10G\"",
    ));
    line(".fi");
    line(".SH FILES");
    line(&roff(DEFAULT_PATH));
    line(".br");
    line(&roff(
        "/usr/share/doc/nvmfd/examples/nvmfd.toml (the commented example)",
    ));
    line(".SH SEE ALSO");
    line("\\fBnvmfd\\fR(8), \\fBnvmfd\\-ctl\\fR(8), \\fBnvme\\fR(1)");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_on_the_page_with_its_facts() {
        let page = page("0.1.0");
        for key in KEYS {
            assert!(page.contains(&roff(&facts(key))), "{}", key.path);
        }
        assert!(page.contains(".SS \"[[subsystems.namespaces]]\""));
        assert!(page.contains("\\fBnsid\\fR"));
        assert!(
            !page.lines().any(|l| l.starts_with(".n") && l != ".nf"),
            "{page}"
        );
    }

    #[test]
    fn roff_escapes_control_characters() {
        assert_eq!(roff("a-b\\c\n.x"), "a\\-b\\ec\n\\&.x");
    }
}
