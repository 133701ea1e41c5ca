//! The DH-HMAC-CHAP hash functions and the values computed with them (NVMe Base 2.0 §8.13.5 –
//! §8.13.5), in the byte order Linux computes them (`nvmet_auth_host_hash`,
//! `nvmet_auth_ctrl_hash`, `nvme_auth_augmented_challenge`, `nvme_auth_transform_key` in
//! `drivers/nvme/{target,common}/auth.c`): a real host checks exactly these bytes.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};
use zeroize::Zeroizing;

use codec::coded_enum;

coded_enum! {
    /// A DH-HMAC-CHAP hash function (HashID; NVMe Base 2.0 §8.13.5).
    #[derive(Hash)]
    pub enum HashId: u8, from_id {
        Sha256 = 0x01,
        Sha384 = 0x02,
        Sha512 = 0x03,
    }
}

impl HashId {
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    pub fn id(self) -> u8 {
        self as u8
    }

    /// Output length in bytes (the HL of the messages).
    pub fn digest_len(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }

    /// The name nvme-cli and nvmetcli use ("hmac(sha256)" …).
    pub fn hmac_name(self) -> &'static str {
        match self {
            HashId::Sha256 => "hmac(sha256)",
            HashId::Sha384 => "hmac(sha384)",
            HashId::Sha512 => "hmac(sha512)",
        }
    }

    pub fn from_hmac_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.hmac_name() == name)
    }

    /// H(data).
    pub fn digest(self, data: &[u8]) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(match self {
            HashId::Sha256 => Sha256::digest(data).to_vec(),
            HashId::Sha384 => Sha384::digest(data).to_vec(),
            HashId::Sha512 => Sha512::digest(data).to_vec(),
        })
    }

    /// HMAC(key, the parts concatenated).
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            // HMAC accepts keys of any length (RFC 2104 §2), so this cannot fail.
            let mut mac = <M as hmac::digest::KeyInit>::new_from_slice(key)
                .expect("HMAC takes keys of any length");
            for p in parts {
                mac.update(p);
            }
            mac.finalize().into_bytes().to_vec()
        }
        Zeroizing::new(match self {
            HashId::Sha256 => run::<Hmac<Sha256>>(key, parts),
            HashId::Sha384 => run::<Hmac<Sha384>>(key, parts),
            HashId::Sha512 => run::<Hmac<Sha512>>(key, parts),
        })
    }
}

/// The augmented challenge Ca = HMAC(H(g^xy mod p), C) used when a DH group is in effect
/// (NVMe Base 2.0 §8.13.5; `nvme_auth_augmented_challenge`). `shared_secret` is the DH value
/// big-endian, left-padded to the group's size, as the kernel's kpp produces it.
pub fn augmented_challenge(
    hash: HashId,
    shared_secret: &[u8],
    challenge: &[u8],
) -> Zeroizing<Vec<u8>> {
    let hashed_key = hash.digest(shared_secret);
    hash.hmac(&hashed_key, &[challenge])
}

/// What a response is computed over besides the key; the same for both directions.
#[derive(Debug, Clone, Copy)]
pub struct ResponseInput<'a> {
    pub hash: HashId,
    /// C1 or C2, already augmented when a DH group is in effect.
    pub challenge: &'a [u8],
    /// S1 for the host's response, S2 for the controller's.
    pub seqnum: u32,
    pub tid: u16,
    /// SC_C from AUTH_Negotiate in the host's response; always 0 in the controller's (as nvmet).
    pub sc_c: u8,
    pub host_nqn: &'a str,
    pub subsys_nqn: &'a str,
}

/// R1 = HMAC(Kh', Ca1 || S1 (LE32) || T_ID (LE16) || SC_C || "HostHost" || NQNh || 00h || NQNc),
/// where Kh' is the host key transformed with the host NQN (NVMe Base 2.0 §8.13.5).
pub fn host_response(transformed_host_key: &[u8], i: &ResponseInput<'_>) -> Zeroizing<Vec<u8>> {
    i.hash.hmac(
        transformed_host_key,
        &[
            i.challenge,
            &i.seqnum.to_le_bytes(),
            &i.tid.to_le_bytes(),
            &[i.sc_c],
            b"HostHost",
            i.host_nqn.as_bytes(),
            &[0],
            i.subsys_nqn.as_bytes(),
        ],
    )
}

/// R2 = HMAC(Kc', Ca2 || S2 (LE32) || T_ID (LE16) || 00h || "Controller" || NQNc || 00h || NQNh),
/// where Kc' is the controller key transformed with the subsystem NQN (NVMe Base 2.0 §8.13.5).
pub fn controller_response(
    transformed_ctrl_key: &[u8],
    i: &ResponseInput<'_>,
) -> Zeroizing<Vec<u8>> {
    i.hash.hmac(
        transformed_ctrl_key,
        &[
            i.challenge,
            &i.seqnum.to_le_bytes(),
            &i.tid.to_le_bytes(),
            &[0],
            b"Controller",
            i.subsys_nqn.as_bytes(),
            &[0],
            i.host_nqn.as_bytes(),
        ],
    )
}
