//! DH-HMAC-CHAP secrets in the interchange format `DHHC-1:<hh>:<base64(secret || CRC-32)>:`
//! (NVMe Base 2.0 §8.13.5 "Secret representation"; what `nvme gen-dhchap-key` prints and
//! `nvme_auth_extract_key` in Linux `drivers/nvme/common/auth.c` reads).
//!
//! `<hh>` says how the secret is transformed before use: 00 not at all, 01/02/03 with HMAC-SHA-256/
//! 384/512 keyed with the secret over the NQN of its owner and "NVMe-over-Fabrics" (§8.13.5).

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use thiserror::Error;
use zeroize::Zeroizing;

use crate::hash::HashId;

const PREFIX: &str = "DHHC-1:";
/// Secret lengths the format allows (before the CRC).
pub const SECRET_LENGTHS: [usize; 3] = [32, 48, 64];
const CRC_LEN: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    #[error("a DH-HMAC-CHAP secret starts with \"DHHC-1:<hh>:\"")]
    Format,
    #[error("unknown secret transformation {0:?} (00, 01, 02 or 03)")]
    Transform(String),
    #[error("the secret is not valid base64")]
    Base64,
    #[error("a secret of {0} bytes; it must be 32, 48 or 64 bytes")]
    Length(usize),
    #[error("the secret's CRC-32 does not match (corrupted or mistyped)")]
    Crc,
    #[error("no randomness for a new secret: {0}")]
    Random(String),
}

/// A DH-HMAC-CHAP secret (a host's or a controller's). The bytes are wiped on drop and never
/// printed by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    transform: Option<HashId>,
    bytes: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("transform", &self.transform)
            .field("len", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

impl Secret {
    /// A secret from its raw bytes. Any of the three lengths goes with any transformation
    /// (§8.13.5 does not tie them; Linux allows mixing them since 6.7, "nvme-auth: allow mixing
    /// of secret and hash lengths"): the transformed key always has the hash's length.
    pub fn new(transform: Option<HashId>, bytes: Vec<u8>) -> Result<Self, KeyError> {
        let bytes = Zeroizing::new(bytes);
        if !SECRET_LENGTHS.contains(&bytes.len()) {
            return Err(KeyError::Length(bytes.len()));
        }
        Ok(Self { transform, bytes })
    }

    /// A new random secret of `len` bytes (32, 48 or 64).
    pub fn generate(transform: Option<HashId>, len: usize) -> Result<Self, KeyError> {
        let mut bytes = vec![0u8; len];
        getrandom::fill(&mut bytes).map_err(|e| KeyError::Random(e.to_string()))?;
        Self::new(transform, bytes)
    }

    /// Parses `DHHC-1:<hh>:<base64>:` (the last colon may be missing, as the kernel allows).
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let rest = text.trim().strip_prefix(PREFIX).ok_or(KeyError::Format)?;
        let (hh, rest) = rest.split_once(':').ok_or(KeyError::Format)?;
        let transform = match hh {
            "00" => None,
            _ => Some(
                ["01", "02", "03"]
                    .iter()
                    .position(|id| *id == hh)
                    .map(|i| HashId::ALL[i])
                    .ok_or_else(|| KeyError::Transform(hh.to_owned()))?,
            ),
        };
        let b64 = match rest.split_once(':') {
            Some((b64, "")) => b64,
            Some(_) => return Err(KeyError::Format),
            None => rest,
        };
        let mut raw = Zeroizing::new(STANDARD.decode(b64).map_err(|_| KeyError::Base64)?);
        let secret_len = raw.len().checked_sub(CRC_LEN).ok_or(KeyError::Length(0))?;
        if !SECRET_LENGTHS.contains(&secret_len) {
            return Err(KeyError::Length(secret_len));
        }
        let crc = u32::from_le_bytes(raw[secret_len..].try_into().expect("4 bytes"));
        if crc != crc32fast::hash(&raw[..secret_len]) {
            return Err(KeyError::Crc);
        }
        raw.truncate(secret_len);
        Self::new(transform, std::mem::take(&mut *raw))
    }

    /// The interchange form, `DHHC-1:<hh>:<base64(secret || CRC-32 LE)>:`.
    pub fn to_interchange(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(Vec::with_capacity(self.bytes.len() + CRC_LEN));
        raw.extend_from_slice(&self.bytes);
        raw.extend_from_slice(&crc32fast::hash(&self.bytes).to_le_bytes());
        let hh = self.transform.map_or(0, HashId::id);
        let b64 = Zeroizing::new(STANDARD.encode(&*raw));
        Zeroizing::new(format!("{PREFIX}{hh:02x}:{}:", &*b64))
    }

    /// The hash the secret is transformed with before use; `None` for `00`.
    pub fn transform(&self) -> Option<HashId> {
        self.transform
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The key the responses are keyed with: the secret itself for `00`, else
    /// HMAC-H(secret, NQN || "NVMe-over-Fabrics") — the host key with the host NQN, the controller
    /// key with the subsystem NQN (`nvme_auth_transform_key`).
    pub fn transformed(&self, nqn: &str) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.bytes.clone(),
            Some(hash) => hash.hmac(&self.bytes, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

impl FromStr for Secret {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example secret of NVMe Base 2.0 §8.13.5 (32 bytes), with every transformation.
    const SPEC_EXAMPLE: &str = "ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n";

    #[test]
    fn spec_example_parses_with_every_transformation() {
        for (hh, transform) in [
            ("00", None),
            ("01", Some(HashId::Sha256)),
            ("02", Some(HashId::Sha384)),
            ("03", Some(HashId::Sha512)),
        ] {
            let text = format!("DHHC-1:{hh}:{SPEC_EXAMPLE}:");
            let key = Secret::parse(&text).unwrap();
            assert_eq!(key.transform(), transform);
            assert_eq!(key.len(), 32);
            assert_eq!(*key.to_interchange(), text);
            let len = transform.map_or(32, HashId::digest_len);
            assert_eq!(key.transformed("nqn.x").len(), len);
        }
        // The last colon is optional, surrounding whitespace (a config file's newline) ignored.
        let bare = format!("DHHC-1:00:{SPEC_EXAMPLE}");
        assert!(Secret::parse(&bare).is_ok());
        assert!(Secret::parse(&format!(" {bare}:\n")).is_ok());
    }

    #[test]
    fn generated_secrets_round_trip() {
        for transform in [
            None,
            Some(HashId::Sha256),
            Some(HashId::Sha384),
            Some(HashId::Sha512),
        ] {
            for len in SECRET_LENGTHS {
                let key = Secret::generate(transform, len).unwrap();
                let back = Secret::parse(&key.to_interchange()).unwrap();
                assert_eq!(back, key);
            }
        }
        assert_eq!(Secret::generate(None, 33), Err(KeyError::Length(33)));
    }

    #[test]
    fn malformed_secrets() {
        let ok = format!("DHHC-1:00:{SPEC_EXAMPLE}:");
        let mut flipped = ok.clone().into_bytes();
        flipped[12] = if flipped[12] == b'A' { b'B' } else { b'A' };
        let flipped = String::from_utf8(flipped).unwrap();
        let short = STANDARD.encode([0u8; 31 + 4]);
        let long = STANDARD.encode([0u8; 65 + 4]);
        let tiny = STANDARD.encode([0u8; 3]);
        let cases: Vec<(String, KeyError)> = vec![
            (String::new(), KeyError::Format),
            ("DHHC-2:00:abcd:".into(), KeyError::Format),
            ("dhhc-1:00:abcd:".into(), KeyError::Format),
            ("DHHC-1:00".into(), KeyError::Format),
            (
                format!("DHHC-1:04:{SPEC_EXAMPLE}:"),
                KeyError::Transform("04".into()),
            ),
            (
                format!("DHHC-1:1:{SPEC_EXAMPLE}:"),
                KeyError::Transform("1".into()),
            ),
            (
                format!("DHHC-1::{SPEC_EXAMPLE}:"),
                KeyError::Transform("".into()),
            ),
            (format!("DHHC-1:00:{SPEC_EXAMPLE}:x"), KeyError::Format),
            (format!("DHHC-1:00:{SPEC_EXAMPLE}::"), KeyError::Format),
            ("DHHC-1:00:!!!!:".into(), KeyError::Base64),
            (
                format!("DHHC-1:00:{}:", &SPEC_EXAMPLE[1..]),
                KeyError::Base64,
            ),
            (format!("DHHC-1:00:{short}:"), KeyError::Length(31)),
            (format!("DHHC-1:00:{long}:"), KeyError::Length(65)),
            (format!("DHHC-1:00:{tiny}:"), KeyError::Length(0)),
            (flipped, KeyError::Crc),
        ];
        for (text, err) in cases {
            assert_eq!(Secret::parse(&text), Err(err), "{text:?}");
        }
    }

    #[test]
    fn debug_does_not_show_the_secret() {
        let key = Secret::parse(&format!("DHHC-1:01:{SPEC_EXAMPLE}:")).unwrap();
        let shown = format!("{key:?}");
        assert!(!shown.contains('[') && shown.contains("Sha256"), "{shown}");
    }
}
