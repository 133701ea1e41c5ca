//! NVMe/TCP TLS pre-shared keys (NVMe/TCP Transport Specification 1.1 §3.6.1, from TP 8011),
//! without I/O: the PSK interchange format `NVMeTLSkey-1:<hh>:<base64(PSK || CRC-32)>:`, the
//! retained PSK, the TLS PSK and the PSK identities a host offers.
//!
//! - Configured PSK → retained PSK (§3.6.1.2): `<hh>` = 00 uses the configured PSK as it is;
//!   01 (SHA-256) / 02 (SHA-384): `HKDF-Expand-Label(HKDF-Extract(0, configured), "HostNQN",
//!   NQNh, len)`.
//! - Retained PSK → TLS PSK (§3.6.1.3): `HKDF-Expand-Label(HKDF-Extract(0, retained),
//!   "nvme-tls-psk", context, len)` with the hash of the identity's cipher suite; the context is
//!   the identity itself (identity version 0, `NVMe0R<hh> <hostnqn> <subnqn>`) or
//!   `"<hh> <digest>"` (version 1, `NVMe1R<hh> <hostnqn> <subnqn> <digest>`, the digest being
//!   base64(HMAC(retained, "<hostnqn> <subnqn> NVMe-over-Fabrics"))).
//!
//! HKDF-Expand-Label is RFC 8446 §7.1's ([`Derivation::Rfc8446`]: big-endian length,
//! length-prefixed "tls13 " label and context), or libnvme's encoding of its `info`
//! ([`Derivation::LibnvmeCompat`]: little-endian length, no length prefixes), which is what
//! nvme-cli 2.13 (Debian 13) uses for `nvme gen-tls-key --insert`: in the e2e scenario
//! nvmfd-tls only that derivation matched the TLS PSK the host inserted. Newer libnvme derives
//! per RFC 8446 by default and keeps the other as "compat".
//! Linux 6.12 itself derives nothing for retained PSKs: the host looks the TLS PSK up in its
//! `.nvme` keyring by identity, where `nvme gen-tls-key --insert` put it.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::{Sha256, Sha384};
use thiserror::Error;
use zeroize::Zeroizing;

const PREFIX: &str = "NVMeTLSkey-1:";
const CRC_LEN: usize = 4;
/// Appended to the NQNs for the version 1 identity digest (as for DH-HMAC-CHAP, §8.13.5).
const DIGEST_SEED: &[u8] = b"NVMe-over-Fabrics";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PskError {
    #[error("a TLS PSK starts with \"NVMeTLSkey-1:<hh>:\" and ends with ':'")]
    Format,
    #[error("unknown PSK hash {0:?} (00, 01 or 02)")]
    Hash(String),
    #[error("the PSK is not valid base64")]
    Base64,
    #[error("a PSK of {len} bytes with hash {hash}; it must be 32 (00, 01) or 48 (00, 02) bytes")]
    Length { len: usize, hash: String },
    #[error("the PSK's CRC-32 does not match (corrupted or mistyped)")]
    Crc,
    #[error("not an NVMe TLS PSK identity: {0:?}")]
    Identity(String),
}

/// The hash of a PSK (`<hh>` of the interchange format and the identity): SHA-256 goes with
/// TLS_AES_128_GCM_SHA256, SHA-384 with TLS_AES_256_GCM_SHA384 (§3.6.1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PskHash {
    Sha256,
    Sha384,
}

impl PskHash {
    /// The TLS 1.3 cipher suite that goes with the hash (§3.6.1.3), by its RFC 8446 name.
    pub fn cipher_suite(self) -> &'static str {
        match self {
            PskHash::Sha256 => "TLS_AES_128_GCM_SHA256",
            PskHash::Sha384 => "TLS_AES_256_GCM_SHA384",
        }
    }

    /// The hash's name as RFC 8446 and the logs write it.
    pub fn name(self) -> &'static str {
        match self {
            PskHash::Sha256 => "SHA-256",
            PskHash::Sha384 => "SHA-384",
        }
    }

    pub fn id(self) -> u8 {
        match self {
            PskHash::Sha256 => 1,
            PskHash::Sha384 => 2,
        }
    }

    fn from_id(id: u8) -> Option<Self> {
        match id {
            1 => Some(PskHash::Sha256),
            2 => Some(PskHash::Sha384),
            _ => None,
        }
    }

    pub fn key_len(self) -> usize {
        match self {
            PskHash::Sha256 => 32,
            PskHash::Sha384 => 48,
        }
    }

    fn for_len(len: usize) -> Option<Self> {
        match len {
            32 => Some(PskHash::Sha256),
            48 => Some(PskHash::Sha384),
            _ => None,
        }
    }
}

/// Which HkdfLabel encoding the key's creator used (see the module notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Derivation {
    Rfc8446,
    LibnvmeCompat,
}

/// A configured PSK as the interchange format carries it. Wiped on drop, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    /// None: `<hh>` = 00, used as the retained PSK without a transformation.
    transform: Option<PskHash>,
    bytes: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfiguredPsk")
            .field("transform", &self.transform)
            .field("len", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

impl ConfiguredPsk {
    /// Reads `NVMeTLSkey-1:<hh>:<base64>:` (surrounding white space ignored, as in a key file).
    pub fn parse(text: &str) -> Result<Self, PskError> {
        let rest = text.trim().strip_prefix(PREFIX).ok_or(PskError::Format)?;
        let (hh, rest) = rest.split_once(':').ok_or(PskError::Format)?;
        let b64 = rest.strip_suffix(':').ok_or(PskError::Format)?;
        if b64.contains(':') {
            return Err(PskError::Format);
        }
        let transform = match hh {
            "00" => None,
            "01" => Some(PskHash::Sha256),
            "02" => Some(PskHash::Sha384),
            _ => return Err(PskError::Hash(hh.to_owned())),
        };
        let raw = Zeroizing::new(STANDARD.decode(b64).map_err(|_| PskError::Base64)?);
        let len = raw.len().saturating_sub(CRC_LEN);
        let len_ok = match transform {
            None => PskHash::for_len(len).is_some(),
            Some(hash) => len == hash.key_len(),
        };
        if raw.len() < CRC_LEN || !len_ok {
            return Err(PskError::Length {
                len,
                hash: hh.to_owned(),
            });
        }
        let (key, crc) = raw.split_at(len);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(PskError::Crc);
        }
        Ok(ConfiguredPsk {
            transform,
            bytes: Zeroizing::new(key.to_vec()),
        })
    }

    /// The interchange text of this key (what `nvme gen-tls-key` prints).
    pub fn to_interchange(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(self.bytes.to_vec());
        raw.extend_from_slice(&crc32fast::hash(&self.bytes).to_le_bytes());
        let hh = self.transform.map_or(0, PskHash::id);
        Zeroizing::new(format!("{PREFIX}{hh:02}:{}:", STANDARD.encode(&*raw)))
    }

    /// The hash of the TLS PSKs made from this key: the transformation's, or for `00` the one
    /// of the key's length (libnvme `default_hmac`).
    pub fn hash(&self) -> PskHash {
        self.transform
            .or_else(|| PskHash::for_len(self.bytes.len()))
            .unwrap_or(PskHash::Sha256)
    }

    /// The retained PSK for the host `hostnqn` (§3.6.1.2).
    pub fn retained(&self, hostnqn: &str, derivation: Derivation) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.bytes.clone(),
            Some(hash) => expand_label(
                hash,
                &self.bytes,
                b"HostNQN",
                hostnqn.as_bytes(),
                self.bytes.len(),
                derivation,
            ),
        }
    }

    /// The TLS PSK for `identity`, or None when the identity's hash is not this key's (the
    /// host then derived its key from another configured PSK).
    pub fn tls_psk(
        &self,
        identity: &Identity,
        derivation: Derivation,
    ) -> Option<Zeroizing<Vec<u8>>> {
        if identity.hash != self.hash() {
            return None;
        }
        let retained = self.retained(&identity.hostnqn, derivation);
        let context = match &identity.digest {
            None => identity.to_string(),
            Some(digest) => {
                // The identity names the key it was made from: a digest that is not the one
                // of this retained PSK means another key.
                if *digest != psk_digest(identity.hash, &retained, identity) {
                    return None;
                }
                format!("{:02} {digest}", identity.hash.id())
            }
        };
        let len = retained.len();
        Some(expand_label(
            identity.hash,
            &retained,
            b"nvme-tls-psk",
            context.as_bytes(),
            len,
            derivation,
        ))
    }
}

/// A PSK identity as the host offers it in its ClientHello (§3.6.1.3): `NVMe<v>R<hh> <hostnqn>
/// <subnqn>` with v = 0, or v = 1 followed by ` <digest>`. Only retained PSKs ('R') are
/// accepted; generated PSKs ('G', from DH-HMAC-CHAP secure channel concatenation) are not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub hash: PskHash,
    pub hostnqn: String,
    pub subnqn: String,
    /// Version 1 only.
    pub digest: Option<String>,
}

impl Identity {
    pub fn parse(bytes: &[u8]) -> Result<Self, PskError> {
        let bad = || PskError::Identity(String::from_utf8_lossy(bytes).into_owned());
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let mut words = text.split(' ');
        let head = words.next().ok_or_else(bad)?;
        let (version, hash) = match head.as_bytes() {
            [b'N', b'V', b'M', b'e', v @ (b'0' | b'1'), b'R', h1, h2] => {
                let hh = (*h1 as char).to_digit(10).zip((*h2 as char).to_digit(10));
                let hash = hh
                    .and_then(|(a, b)| u8::try_from(a * 10 + b).ok())
                    .and_then(PskHash::from_id)
                    .ok_or_else(bad)?;
                (*v - b'0', hash)
            }
            _ => return Err(bad()),
        };
        let hostnqn = words.next().filter(|w| !w.is_empty()).ok_or_else(bad)?;
        let subnqn = words.next().filter(|w| !w.is_empty()).ok_or_else(bad)?;
        let digest = match version {
            0 => None,
            _ => Some(words.next().filter(|w| !w.is_empty()).ok_or_else(bad)?),
        };
        if words.next().is_some() {
            return Err(bad());
        }
        Ok(Identity {
            hash,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            digest: digest.map(str::to_owned),
        })
    }

    /// The version 0 identity of a host/subsystem pair.
    pub fn v0(hash: PskHash, hostnqn: &str, subnqn: &str) -> Self {
        Identity {
            hash,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            digest: None,
        }
    }

    /// The version 1 identity of a host/subsystem pair for `key`.
    pub fn v1(key: &ConfiguredPsk, hostnqn: &str, subnqn: &str, derivation: Derivation) -> Self {
        let mut identity = Identity::v0(key.hash(), hostnqn, subnqn);
        let retained = key.retained(hostnqn, derivation);
        identity.digest = Some(psk_digest(identity.hash, &retained, &identity));
        identity
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let version = u8::from(self.digest.is_some());
        write!(
            f,
            "NVMe{version}R{:02} {} {}",
            self.hash.id(),
            self.hostnqn,
            self.subnqn
        )?;
        if let Some(digest) = &self.digest {
            write!(f, " {digest}")?;
        }
        Ok(())
    }
}

/// base64(HMAC(retained, "<hostnqn> <subnqn> NVMe-over-Fabrics")) (§3.6.1.3, PSK digest).
fn psk_digest(hash: PskHash, retained: &[u8], identity: &Identity) -> String {
    fn mac<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        let mut mac = <M as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().to_vec()
    }
    let parts: [&[u8]; 5] = [
        identity.hostnqn.as_bytes(),
        b" ",
        identity.subnqn.as_bytes(),
        b" ",
        DIGEST_SEED,
    ];
    let raw = match hash {
        PskHash::Sha256 => mac::<Hmac<Sha256>>(retained, &parts),
        PskHash::Sha384 => mac::<Hmac<Sha384>>(retained, &parts),
    };
    STANDARD.encode(raw)
}

/// HKDF-Expand-Label(HKDF-Extract(0, ikm), label, context, len) (RFC 8446 §7.1), or libnvme's
/// compat encoding of the HkdfLabel.
fn expand_label(
    hash: PskHash,
    ikm: &[u8],
    label: &[u8],
    context: &[u8],
    len: usize,
    derivation: Derivation,
) -> Zeroizing<Vec<u8>> {
    let info = hkdf_label(label, context, len, derivation);
    let mut out = Zeroizing::new(vec![0u8; len]);
    // Output lengths here are ≤ 48 bytes, far below HKDF's 255 × hash-length limit.
    match hash {
        PskHash::Sha256 => Hkdf::<Sha256>::new(None, ikm)
            .expand(&info, &mut out)
            .expect("HKDF output within 255 hash lengths"),
        PskHash::Sha384 => Hkdf::<Sha384>::new(None, ikm)
            .expand(&info, &mut out)
            .expect("HKDF output within 255 hash lengths"),
    }
    out
}

/// The `info` of HKDF-Expand for HKDF-Expand-Label. RFC 8446 §7.1: `struct { uint16 length;
/// opaque label<7..255> = "tls13 " + Label; opaque context<0..255>; }`. Labels and contexts
/// longer than 255 bytes (an NQN is at most 223) are cut at 255 by the length prefix's type.
pub fn hkdf_label(label: &[u8], context: &[u8], len: usize, derivation: Derivation) -> Vec<u8> {
    let full_label = [b"tls13 ".as_slice(), label].concat();
    let len = u16::try_from(len).unwrap_or(u16::MAX);
    let mut info = Vec::with_capacity(4 + full_label.len() + context.len());
    match derivation {
        Derivation::Rfc8446 => {
            let label = &full_label[..full_label.len().min(255)];
            let context = &context[..context.len().min(255)];
            info.extend_from_slice(&len.to_be_bytes());
            info.push(label.len() as u8);
            info.extend_from_slice(label);
            info.push(context.len() as u8);
            info.extend_from_slice(context);
        }
        Derivation::LibnvmeCompat => {
            info.extend_from_slice(&len.to_le_bytes());
            info.extend_from_slice(&full_label);
            info.extend_from_slice(context);
        }
    }
    info
}

#[cfg(test)]
mod tests;
