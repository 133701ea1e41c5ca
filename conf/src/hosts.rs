//! `[[subsystems.hosts]]`: an allowed host with its DH-HMAC-CHAP settings (NVMe Base 2.0
//! §8.13, in-band authentication), and their checks.
//!
//! A host listed here may connect and must authenticate every queue when it has a key. Keys are
//! in the `DHHC-1:<hh>:<base64>:` interchange format, inline or in a key file of their own so
//! the main configuration can stay readable by everyone; a key file that its group or others
//! may read is refused (it would leak the secret as much as an inline key).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nvmfd_auth::{DhGroup, HashId, Secret};
use serde::{Deserialize, Serialize};

use crate::names::check_nqn;
use crate::report::Errors;

/// `[[subsystems.hosts]]`. `Debug` never shows an inline secret (requests carrying a host
/// are logged).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub nqn: String,
    /// The host's secret, `DHHC-1:…` (exclusive with `dhchap_key_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_key: Option<String>,
    /// A file holding the host's secret (mode 0600 or stricter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_key_file: Option<PathBuf>,
    /// The controller's secret for bidirectional authentication (needs a host key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_key_file: Option<PathBuf>,
    /// Hash functions allowed, most preferred first ("hmac(sha256)" or "sha256" …); empty =
    /// [`DEFAULT_HASHES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dhchap_hashes: Vec<String>,
    /// DH groups allowed, most preferred first ("null", "ffdhe2048" …); empty =
    /// [`DEFAULT_DH_GROUPS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dhchap_dhgroups: Vec<String>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inline = |k: &Option<String>| k.as_ref().map(|_| "<secret>");
        f.debug_struct("Host")
            .field("nqn", &self.nqn)
            .field("dhchap_key", &inline(&self.dhchap_key))
            .field("dhchap_key_file", &self.dhchap_key_file)
            .field("dhchap_ctrl_key", &inline(&self.dhchap_ctrl_key))
            .field("dhchap_ctrl_key_file", &self.dhchap_ctrl_key_file)
            .field("dhchap_hashes", &self.dhchap_hashes)
            .field("dhchap_dhgroups", &self.dhchap_dhgroups)
            .finish()
    }
}

/// Every hash function, the shortest first (what the Linux host and nvmet prefer).
pub const DEFAULT_HASHES: [HashId; 3] = HashId::ALL;
/// Every FFDHE group, the cheapest first, then the NULL group: a host that offers a DH group
/// gets the ephemeral key exchange (which keeps a captured exchange from being replayed
/// offline against the secret), one that offers only NULL still authenticates.
pub const DEFAULT_DH_GROUPS: [DhGroup; 6] = [
    DhGroup::Ffdhe2048,
    DhGroup::Ffdhe3072,
    DhGroup::Ffdhe4096,
    DhGroup::Ffdhe6144,
    DhGroup::Ffdhe8192,
    DhGroup::Null,
];

/// A host's authentication settings, keys read and parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostKeys {
    pub host_key: Secret,
    pub ctrl_key: Option<Secret>,
    pub hashes: Vec<HashId>,
    pub dh_groups: Vec<DhGroup>,
}

/// What is wrong with a host's authentication settings: the key (field name) and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostKeyError {
    pub field: &'static str,
    pub value: String,
    pub reason: String,
}

impl std::fmt::Display for HostKeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.field, self.reason)
        } else {
            write!(f, "{}: {}: {}", self.field, self.value, self.reason)
        }
    }
}

fn key_error(field: &'static str, value: impl ToString, reason: impl ToString) -> HostKeyError {
    HostKeyError {
        field,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// Reads a key file, refusing one its group or others may read (the secret would be as exposed
/// as in a world-readable configuration file).
pub fn read_key_file(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read key file: {e}"))?;
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "key file {} is readable by group or others (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read key file: {e}"))
}

/// A hash name as nvmetcli ("hmac(sha256)") or plainly ("sha256").
pub fn parse_hash(name: &str) -> Option<HashId> {
    HashId::from_hmac_name(name).or_else(|| HashId::from_hmac_name(&format!("hmac({name})")))
}

impl Host {
    /// A host allowed without authentication.
    pub fn new(nqn: impl Into<String>) -> Host {
        Host {
            nqn: nqn.into(),
            dhchap_key: None,
            dhchap_key_file: None,
            dhchap_ctrl_key: None,
            dhchap_ctrl_key_file: None,
            dhchap_hashes: Vec::new(),
            dhchap_dhgroups: Vec::new(),
        }
    }

    /// Whether the host must authenticate.
    pub fn has_key(&self) -> bool {
        self.dhchap_key.is_some() || self.dhchap_key_file.is_some()
    }

    /// The host's keys read (key files included) and parsed; `Ok(None)` when it has no key.
    pub fn keys(&self) -> Result<Option<HostKeys>, HostKeyError> {
        let host_key = secret(
            ("dhchap_key", self.dhchap_key.as_deref()),
            ("dhchap_key_file", self.dhchap_key_file.as_deref()),
        )?;
        let ctrl_key = secret(
            ("dhchap_ctrl_key", self.dhchap_ctrl_key.as_deref()),
            ("dhchap_ctrl_key_file", self.dhchap_ctrl_key_file.as_deref()),
        )?;
        let mut hashes = Vec::new();
        for name in &self.dhchap_hashes {
            let hash = parse_hash(name).ok_or_else(|| {
                key_error(
                    "dhchap_hashes",
                    name,
                    "not one of hmac(sha256), hmac(sha384), hmac(sha512)",
                )
            })?;
            if !hashes.contains(&hash) {
                hashes.push(hash);
            }
        }
        let mut dh_groups = Vec::new();
        for name in &self.dhchap_dhgroups {
            let group = DhGroup::from_name(name).ok_or_else(|| {
                key_error(
                    "dhchap_dhgroups",
                    name,
                    "not one of null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192",
                )
            })?;
            if !dh_groups.contains(&group) {
                dh_groups.push(group);
            }
        }
        let Some(host_key) = host_key else {
            if ctrl_key.is_some() {
                return Err(key_error(
                    "dhchap_ctrl_key",
                    "",
                    "a controller key needs a host key (dhchap_key or dhchap_key_file)",
                ));
            }
            if !hashes.is_empty() || !dh_groups.is_empty() {
                return Err(key_error(
                    "dhchap_hashes",
                    "",
                    "hashes and DH groups need a host key (dhchap_key or dhchap_key_file)",
                ));
            }
            return Ok(None);
        };
        if hashes.is_empty() {
            hashes = DEFAULT_HASHES.to_vec();
        }
        if dh_groups.is_empty() {
            dh_groups = DEFAULT_DH_GROUPS.to_vec();
        }
        Ok(Some(HostKeys {
            host_key,
            ctrl_key,
            hashes,
            dh_groups,
        }))
    }
}

/// One secret from its inline field or its key file (not both).
fn secret(
    inline: (&'static str, Option<&str>),
    file: (&'static str, Option<&Path>),
) -> Result<Option<Secret>, HostKeyError> {
    let text = match (inline.1, file.1) {
        (None, None) => return Ok(None),
        (Some(_), Some(path)) => {
            return Err(key_error(
                file.0,
                path.display(),
                format!("exclusive with {}", inline.0),
            ))
        }
        // Never echo a secret into a message: name the field only.
        (Some(text), None) => (inline.0, String::new(), text.to_owned()),
        (None, Some(path)) => {
            let text = read_key_file(path).map_err(|e| key_error(file.0, path.display(), e))?;
            (file.0, path.display().to_string(), text)
        }
    };
    let (field, shown, text) = text;
    Secret::parse(&text)
        .map(Some)
        .map_err(|e| key_error(field, shown, e))
}

/// Every problem with one subsystem's `hosts` entries (`key` = `subsystems[i]`).
pub(crate) fn check(key: &str, hosts: &[Host], errors: &mut Errors) {
    for (h, host) in hosts.iter().enumerate() {
        let hkey = format!("{key}.hosts[{h}]");
        if let Err(e) = check_nqn(&host.nqn) {
            errors.push(format!("{hkey}.nqn"), &host.nqn, e.to_string());
        }
        if let Err(e) = host.keys() {
            errors.push(format!("{hkey}.{}", e.field), e.value, e.reason);
        }
    }
}
