//! NVMe/TCP over TLS 1.3 (NVMe/TCP Transport Specification 1.1 §3.6, TP 8011): each TCP
//! port's policy (`ports[].tls`) and `[[tls_keys]]`, the configured PSKs per host (or per
//! host and subsystem), each in a key file in the interchange format
//! `NVMeTLSkey-1:<hh>:<base64>:` that `nvme gen-tls-key` prints.
//!
//! ```toml
//! [[ports]]
//! id = 1
//! transport = "tcp"
//! address = "0.0.0.0"
//! service = 4420
//! tls = "required"          # "none" (default) | "optional" | "required"
//!
//! [[tls_keys]]
//! host = "nqn.2014-08.org.nvmexpress:uuid:…"
//! subsystem = "nqn.2026-12.dev.nvmfd:ram0"   # optional: this subsystem only
//! key_file = "/etc/nvmfd/tls/host1.psk"        # owner-only (mode 0600 or stricter)
//! hkdf_label = "compat"                       # or "rfc8446" (see `HkdfLabel`)
//! ```

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::names::{check_nqn, DISCOVERY_NQN};
use crate::report::Errors;

/// A port's secure channel requirement, as nvmet's `addr_treq` (and TREQ of its discovery log
/// entries, NVMe Base 2.0 Figure 295): "required" refuses connections that do not start a TLS
/// handshake; "optional" serves both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsPolicy {
    #[default]
    None,
    Optional,
    Required,
}

impl TlsPolicy {
    pub fn is_none(&self) -> bool {
        *self == TlsPolicy::None
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TlsPolicy::None => "none",
            TlsPolicy::Optional => "optional",
            TlsPolicy::Required => "required",
        }
    }
}

/// `[[tls_keys]]`: one configured PSK.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsKey {
    /// The host NQN of the PSK identities this key answers.
    pub host: String,
    /// Only for this subsystem (and not the discovery subsystem); unset: every subsystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subsystem: Option<String>,
    /// The key in the interchange format; a regular file readable by its owner only.
    pub key_file: PathBuf,
    /// How the key's creator encoded HKDF-Expand-Label's `info` when deriving the retained
    /// and TLS PSKs (see `nvmfd_auth::psk`).
    #[serde(default, skip_serializing_if = "HkdfLabel::is_compat")]
    pub hkdf_label: HkdfLabel,
}

/// `"compat"` (default): libnvme's encoding without the label/context length bytes, which
/// nvme-cli 2.13 (Debian 13) uses for `gen-tls-key --insert` — observed in the e2e scenario
/// nvmfd-tls, where only this derivation matched the host's TLS PSK. `"rfc8446"`: the HkdfLabel
/// of RFC 8446 §7.1, which newer libnvme makes by default (and calls the other "compat").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HkdfLabel {
    #[default]
    Compat,
    Rfc8446,
}

impl HkdfLabel {
    pub fn is_compat(&self) -> bool {
        *self == HkdfLabel::Compat
    }
}

/// Largest key file read: an interchange key is at most 89 characters.
const KEY_FILE_MAX: u64 = 4096;

/// The text of a key file, after checking that nobody but its owner can read or change it
/// (the key is a long-term secret; same rule as ssh private keys).
pub fn read_key_file(path: &Path) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "mode {:04o}: a key file must not be accessible to group or others (chmod 600)",
            meta.mode() & 0o7777
        ));
    }
    let mut text = String::new();
    file.take(KEY_FILE_MAX)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read: {e}"))?;
    Ok(text)
}

/// Keys name valid NQNs, absolute key files that exist with owner-only permissions, and no
/// (host, subsystem) twice. (What a TLS port needs is checked with the ports, `ports::check_tls`.)
pub(crate) fn check(keys: &[TlsKey], errors: &mut Errors) {
    let mut seen = HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        let at = format!("tls_keys[{i}]");
        if let Err(e) = check_nqn(&key.host) {
            errors.push(format!("{at}.host"), &key.host, e.to_string());
        }
        // The well-known discovery NQN has no ":<identifier>" but is a subsystem a host
        // connects to over TLS (`nvme discover --tls`).
        if let Some(sub) = key.subsystem.as_ref().filter(|s| *s != DISCOVERY_NQN) {
            if let Err(e) = check_nqn(sub) {
                errors.push(format!("{at}.subsystem"), sub, e.to_string());
            }
        }
        if let Some(first) = seen.insert((&key.host, &key.subsystem), i) {
            errors.push(
                format!("{at}.host"),
                &key.host,
                format!("a second key for this host and subsystem (also tls_keys[{first}])"),
            );
        }
        let shown = key.key_file.display().to_string();
        if !key.key_file.is_absolute() {
            errors.push(format!("{at}.key_file"), shown, "must be an absolute path");
        } else if let Err(e) = read_key_file(&key.key_file) {
            errors.push(format!("{at}.key_file"), shown, e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-326500000001";

    fn key_file(dir: &Path, name: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, "NVMeTLSkey-1:01:AAAA:\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn errors_of(keys: &[TlsKey]) -> Vec<String> {
        let mut errors = Errors::default();
        check(keys, &mut errors);
        match errors.into_result() {
            Ok(()) => Vec::new(),
            Err(list) => list.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn keys_are_checked() {
        let dir = std::env::temp_dir().join(format!("nvmfd-conf-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = key_file(&dir, "good.psk", 0o600);
        let open = key_file(&dir, "open.psk", 0o644);
        let key = |file: &Path, sub: Option<&str>| TlsKey {
            host: HOST.into(),
            subsystem: sub.map(str::to_owned),
            key_file: file.to_path_buf(),
            hkdf_label: HkdfLabel::Compat,
        };
        assert!(errors_of(&[key(&good, None)]).is_empty());
        assert!(errors_of(&[key(&good, Some(DISCOVERY_NQN))]).is_empty());
        let cases: Vec<(Vec<TlsKey>, &str)> = vec![
            (vec![key(&open, None)], "mode 0644"),
            (vec![key(Path::new("relative.psk"), None)], "absolute path"),
            (vec![key(&dir.join("missing"), None)], "cannot open"),
            (vec![key(&dir, None)], "not a regular file"),
            (
                vec![key(&good, Some("x")), key(&good, Some("x"))],
                "tls_keys[1].subsystem",
            ),
            (vec![key(&good, None), key(&good, None)], "a second key"),
        ];
        for (keys, expected) in cases {
            let errors = errors_of(&keys);
            assert!(
                errors.iter().any(|e| e.contains(expected)),
                "{expected}: {errors:?}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn policy_spelling() {
        #[derive(Deserialize)]
        struct P {
            tls: TlsPolicy,
        }
        for (text, policy) in [
            ("none", TlsPolicy::None),
            ("optional", TlsPolicy::Optional),
            ("required", TlsPolicy::Required),
        ] {
            let p: P = toml::from_str(&format!("tls = \"{text}\"")).unwrap();
            assert_eq!(p.tls, policy);
            assert_eq!(policy.as_str(), text);
        }
        assert!(toml::from_str::<P>("tls = \"yes\"").is_err());
        #[derive(Deserialize)]
        struct K {
            #[serde(default)]
            hkdf_label: HkdfLabel,
        }
        let k: K = toml::from_str("").unwrap();
        assert_eq!(k.hkdf_label, HkdfLabel::Compat);
        let k: K = toml::from_str("hkdf_label = \"rfc8446\"").unwrap();
        assert_eq!(k.hkdf_label, HkdfLabel::Rfc8446);
    }
}
