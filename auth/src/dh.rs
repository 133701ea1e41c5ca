//! Finite-field Diffie-Hellman over the RFC 7919 groups (generator 2) that DH-HMAC-CHAP uses
//! (NVMe Base 2.0 §8.13.5, DH group identifiers 01h–05h).
//!
//! Values go on the wire big-endian and left-padded to the prime's size, and the shared secret is
//! padded the same way before it is hashed, as the Linux kernel's `ffdheXXXX(dh)` kpp produces them.
//!
//! The exponentiations are OpenSSL's `BN_mod_exp` with the exponent flagged
//! `BN_FLG_CONSTTIME`, which takes the constant-time Montgomery ladder
//! (`BN_mod_exp_mont_consttime`: fixed windows, table lookups that touch every entry); the
//! private exponent lives in a "secure" BIGNUM, cleared when freed, and in a [`Zeroizing`]
//! buffer. Each key pair is still ephemeral: one per authentication transaction.
//!
//! An exponentiation costs milliseconds (ffdhe8192: ~15 ms on a current core, 20x that in an
//! emulated guest), far too long for a thread that serves queues: a thread marks itself with
//! [`forbid_exponentiation_on_this_thread`] (every reactor thread of the daemon does) and any
//! exponentiation it then attempts fails with [`DhError::ForbiddenThread`] instead of running.

use std::cell::Cell;
use std::sync::OnceLock;

use openssl::bn::{BigNum, BigNumContext, BigNumRef};
use openssl::error::ErrorStack;
use thiserror::Error;
use zeroize::Zeroizing;

use codec::coded_enum;

coded_enum! {
    /// A DH group identifier (DHgID) of DH-HMAC-CHAP (NVMe Base 2.0 §8.13.5).
    #[derive(Hash)]
    pub enum DhGroup: u8, from_id {
        /// No Diffie-Hellman exchange: the plain challenge is used.
        Null = 0x00,
        Ffdhe2048 = 0x01,
        Ffdhe3072 = 0x02,
        Ffdhe4096 = 0x03,
        Ffdhe6144 = 0x04,
        Ffdhe8192 = 0x05,
    }
}

#[derive(Debug, Error)]
pub enum DhError {
    #[error("the NULL DH group has no key exchange")]
    NullGroup,
    #[error("DH public value of {len} bytes, the group needs {expected}")]
    PeerLength { len: usize, expected: usize },
    #[error("DH public value outside 1 < y < p-1")]
    PeerOutOfRange,
    #[error("private key of {len} bytes is not in 2 <= x < p")]
    PrivateOutOfRange { len: usize },
    #[error("no randomness for a DH private key: {0}")]
    Random(getrandom::Error),
    #[error("OpenSSL: {0}")]
    OpenSsl(#[from] ErrorStack),
    /// A thread that must not spend milliseconds computing (a reactor) asked for an
    /// exponentiation: a bug of the caller, refused rather than stalling the thread.
    #[error("DH exponentiation refused on thread {0:?}, which must not run one")]
    ForbiddenThread(String),
}

thread_local! {
    static FORBIDDEN: Cell<bool> = const { Cell::new(false) };
}

/// From now on, every exponentiation asked for on the calling thread fails with
/// [`DhError::ForbiddenThread`] (and logs an error). Reactor threads call this when
/// they start: authentication work must go to the worker pool.
pub fn forbid_exponentiation_on_this_thread() {
    FORBIDDEN.with(|f| f.set(true));
}

/// Whether the calling thread was marked with [`forbid_exponentiation_on_this_thread`].
pub fn exponentiation_forbidden_here() -> bool {
    FORBIDDEN.with(Cell::get)
}

fn check_thread() -> Result<(), DhError> {
    if !exponentiation_forbidden_here() {
        return Ok(());
    }
    let name = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .to_owned();
    tracing::error!(thread = %name, "DH exponentiation refused on a thread that forbids it");
    Err(DhError::ForbiddenThread(name))
}

impl DhGroup {
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    pub fn id(self) -> u8 {
        self as u8
    }

    /// The name nvme-cli and nvmetcli use ("null", "ffdhe2048" …).
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == name)
    }

    /// Size in bytes of a public value and of the shared secret (DHVLEN); 0 for NULL.
    pub fn key_size(self) -> usize {
        self.bits() / 8
    }

    fn bits(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 2048,
            DhGroup::Ffdhe3072 => 3072,
            DhGroup::Ffdhe4096 => 4096,
            DhGroup::Ffdhe6144 => 6144,
            DhGroup::Ffdhe8192 => 8192,
        }
    }

    /// Private exponent size: RFC 7919 §5.2 recommends at least twice the group's security
    /// strength; these are the sizes its table lists.
    fn exponent_bits(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 225,
            DhGroup::Ffdhe3072 => 275,
            DhGroup::Ffdhe4096 => 325,
            DhGroup::Ffdhe6144 => 375,
            DhGroup::Ffdhe8192 => 400,
        }
    }

    /// The prime p and p - 1, parsed once.
    fn prime(self) -> Result<&'static Prime, DhError> {
        static PRIMES: [OnceLock<Prime>; 5] = [const { OnceLock::new() }; 5];
        let (slot, hex) = match self {
            DhGroup::Null => return Err(DhError::NullGroup),
            DhGroup::Ffdhe2048 => (0, FFDHE2048_P),
            DhGroup::Ffdhe3072 => (1, FFDHE3072_P),
            DhGroup::Ffdhe4096 => (2, FFDHE4096_P),
            DhGroup::Ffdhe6144 => (3, FFDHE6144_P),
            DhGroup::Ffdhe8192 => (4, FFDHE8192_P),
        };
        if let Some(p) = PRIMES[slot].get() {
            return Ok(p);
        }
        let p = BigNum::from_hex_str(hex)?;
        let mut p_minus_1 = BigNum::new()?;
        p_minus_1.checked_sub(&p, BigNum::from_u32(1)?.as_ref())?;
        Ok(PRIMES[slot].get_or_init(|| Prime { p, p_minus_1 }))
    }

    /// Checks a peer's public value without any exponentiation (cheap enough for any thread):
    /// exactly the group's size and 1 < y < p-1 (NIST SP 800-56A §5.6.2.3.1; with a safe prime
    /// this excludes the only small subgroup, {1, p-1}).
    pub fn check_peer(self, peer: &[u8]) -> Result<(), DhError> {
        let expected = self.key_size();
        if expected == 0 {
            return Err(DhError::NullGroup);
        }
        if peer.len() != expected {
            return Err(DhError::PeerLength {
                len: peer.len(),
                expected,
            });
        }
        let prime = self.prime()?;
        let y = BigNum::from_slice(peer)?;
        if y.ucmp(BigNum::from_u32(1)?.as_ref()).is_le() || y.ucmp(&prime.p_minus_1).is_ge() {
            return Err(DhError::PeerOutOfRange);
        }
        Ok(())
    }
}

struct Prime {
    p: BigNum,
    p_minus_1: BigNum,
}

/// An ephemeral DH key pair in one group.
pub struct KeyPair {
    group: DhGroup,
    /// x, in a BIGNUM that is flagged constant-time and cleared when freed.
    private: BigNum,
    public: Vec<u8>,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl KeyPair {
    /// A fresh private exponent from the OS RNG and its public value g^x mod p.
    pub fn generate(group: DhGroup) -> Result<Self, DhError> {
        let bits = group.exponent_bits();
        if bits == 0 {
            return Err(DhError::NullGroup);
        }
        check_thread()?;
        let mut bytes = Zeroizing::new(vec![0u8; bits.div_ceil(8)]);
        loop {
            getrandom::fill(&mut bytes).map_err(DhError::Random)?;
            // Keep exactly `bits` bits.
            bytes[0] &= 0xff >> (bytes.len() * 8 - bits);
            match Self::from_private(group, &bytes) {
                Err(DhError::PrivateOutOfRange { .. }) => continue,
                other => return other,
            }
        }
    }

    /// The key pair of a given private exponent (big-endian); `2 <= x < p`.
    pub fn from_private(group: DhGroup, x: &[u8]) -> Result<Self, DhError> {
        let prime = group.prime()?;
        check_thread()?;
        let mut private = BigNum::new_secure()?;
        private.copy_from_slice(x)?;
        private.set_const_time();
        if private.ucmp(BigNum::from_u32(2)?.as_ref()).is_lt() || private.ucmp(&prime.p).is_ge() {
            return Err(DhError::PrivateOutOfRange { len: x.len() });
        }
        let g = BigNum::from_u32(2)?;
        let public = mod_exp(&g, &private, &prime.p)?;
        Ok(Self {
            group,
            private,
            public: public.to_vec_padded(group.key_size() as i32)?,
        })
    }

    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// g^x mod p, big-endian, exactly [`DhGroup::key_size`] bytes.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// (g^y)^x mod p from the peer's public value, left-padded to the group size. The peer's
    /// value is checked first ([`DhGroup::check_peer`]).
    pub fn shared_secret(&self, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, DhError> {
        self.group.check_peer(peer)?;
        check_thread()?;
        let prime = self.group.prime()?;
        let y = BigNum::from_slice(peer)?;
        let mut z = mod_exp(&y, &self.private, &prime.p)?;
        let padded = Zeroizing::new(z.to_vec_padded(self.group.key_size() as i32)?);
        z.clear();
        Ok(padded)
    }
}

/// base^exponent mod p. The exponent is always flagged constant-time (`BN_FLG_CONSTTIME`),
/// which makes `BN_mod_exp` take `BN_mod_exp_mont_consttime`; the result is a secure BIGNUM
/// (a shared secret before it is hashed).
fn mod_exp(base: &BigNumRef, exponent: &BigNumRef, p: &BigNumRef) -> Result<BigNum, DhError> {
    debug_assert!(exponent.is_const_time());
    let mut ctx = BigNumContext::new_secure()?;
    let mut r = BigNum::new_secure()?;
    r.mod_exp(base, exponent, p, &mut ctx)?;
    Ok(r)
}

// RFC 7919 Appendix A. auth/tests/kat.py re-derives each of them from the RFC's definition
// (p = 2^b - 2^{b-64} + {[2^{b-130} e] + X} * 2^64 - 1) and checks this file.
const FFDHE2048_P: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B423861285C97FFFFFFFFFFFFFFFF",
);

const FFDHE3072_P: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B66C62E37FFFFFFFFFFFFFFFF",
);

const FFDHE4096_P: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E655F6AFFFFFFFFFFFFFFFF",
);

const FFDHE6144_P: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E0DD9020BFD64B645036C7A",
    "4E677D2C38532A3A23BA4442CAF53EA63BB454329B7624C8917BDD64B1C0FD4C",
    "B38E8C334C701C3ACDAD0657FCCFEC719B1F5C3E4E46041F388147FB4CFDB477",
    "A52471F7A9A96910B855322EDB6340D8A00EF092350511E30ABEC1FFF9E3A26E",
    "7FB29F8C183023C3587E38DA0077D9B4763E4E4B94B2BBC194C6651E77CAF992",
    "EEAAC0232A281BF6B3A739C1226116820AE8DB5847A67CBEF9C9091B462D538C",
    "D72B03746AE77F5E62292C311562A846505DC82DB854338AE49F5235C95B9117",
    "8CCF2DD5CACEF403EC9D1810C6272B045B3B71F9DC6B80D63FDD4A8E9ADB1E69",
    "62A69526D43161C1A41D570D7938DAD4A40E329CD0E40E65FFFFFFFFFFFFFFFF",
);

const FFDHE8192_P: &str = concat!(
    "FFFFFFFFFFFFFFFFADF85458A2BB4A9AAFDC5620273D3CF1D8B9C583CE2D3695",
    "A9E13641146433FBCC939DCE249B3EF97D2FE363630C75D8F681B202AEC4617A",
    "D3DF1ED5D5FD65612433F51F5F066ED0856365553DED1AF3B557135E7F57C935",
    "984F0C70E0E68B77E2A689DAF3EFE8721DF158A136ADE73530ACCA4F483A797A",
    "BC0AB182B324FB61D108A94BB2C8E3FBB96ADAB760D7F4681D4F42A3DE394DF4",
    "AE56EDE76372BB190B07A7C8EE0A6D709E02FCE1CDF7E2ECC03404CD28342F61",
    "9172FE9CE98583FF8E4F1232EEF28183C3FE3B1B4C6FAD733BB5FCBC2EC22005",
    "C58EF1837D1683B2C6F34A26C1B2EFFA886B4238611FCFDCDE355B3B6519035B",
    "BC34F4DEF99C023861B46FC9D6E6C9077AD91D2691F7F7EE598CB0FAC186D91C",
    "AEFE130985139270B4130C93BC437944F4FD4452E2D74DD364F2E21E71F54BFF",
    "5CAE82AB9C9DF69EE86D2BC522363A0DABC521979B0DEADA1DBF9A42D5C4484E",
    "0ABCD06BFA53DDEF3C1B20EE3FD59D7C25E41D2B669E1EF16E6F52C3164DF4FB",
    "7930E9E4E58857B6AC7D5F42D69F6D187763CF1D5503400487F55BA57E31CC7A",
    "7135C886EFB4318AED6A1E012D9E6832A907600A918130C46DC778F971AD0038",
    "092999A333CB8B7A1A1DB93D7140003C2A4ECEA9F98D0ACC0A8291CDCEC97DCF",
    "8EC9B55A7F88A46B4DB5A851F44182E1C68A007E5E0DD9020BFD64B645036C7A",
    "4E677D2C38532A3A23BA4442CAF53EA63BB454329B7624C8917BDD64B1C0FD4C",
    "B38E8C334C701C3ACDAD0657FCCFEC719B1F5C3E4E46041F388147FB4CFDB477",
    "A52471F7A9A96910B855322EDB6340D8A00EF092350511E30ABEC1FFF9E3A26E",
    "7FB29F8C183023C3587E38DA0077D9B4763E4E4B94B2BBC194C6651E77CAF992",
    "EEAAC0232A281BF6B3A739C1226116820AE8DB5847A67CBEF9C9091B462D538C",
    "D72B03746AE77F5E62292C311562A846505DC82DB854338AE49F5235C95B9117",
    "8CCF2DD5CACEF403EC9D1810C6272B045B3B71F9DC6B80D63FDD4A8E9ADB1E69",
    "62A69526D43161C1A41D570D7938DAD4A40E329CCFF46AAA36AD004CF600C838",
    "1E425A31D951AE64FDB23FCEC9509D43687FEB69EDD1CC5E0B8CC3BDF64B10EF",
    "86B63142A3AB8829555B2F747C932665CB2C0F1CC01BD70229388839D2AF05E4",
    "54504AC78B7582822846C0BA35C35F5C59160CC046FD8251541FC68C9C86B022",
    "BB7099876A460E7451A8A93109703FEE1C217E6C3826E52C51AA691E0E423CFC",
    "99E9E31650C1217B624816CDAD9A95F9D5B8019488D9C0A0A1FE3075A577E231",
    "83F81D4A3F2FA4571EFC8CE0BA8A4FE8B6855DFE72B0A66EDED2FBABFBE58A30",
    "FAFABE1C5D71A87E2F741EF8C1FE86FEA6BBFDE530677F0D97D11D49F7A8443D",
    "0822E506A9F4614E011E2A94838FF88CD68C8BB7C5C6424CFFFFFFFFFFFFFFFF",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_forbids_exponentiation_runs_none() {
        let kp = KeyPair::generate(DhGroup::Ffdhe2048).expect("allowed here");
        let peer = kp.public().to_vec();
        std::thread::Builder::new()
            .name("reactor-test".into())
            .spawn(move || {
                forbid_exponentiation_on_this_thread();
                assert!(exponentiation_forbidden_here());
                for g in &DhGroup::ALL[1..] {
                    assert!(matches!(
                        KeyPair::generate(*g),
                        Err(DhError::ForbiddenThread(ref n)) if n == "reactor-test"
                    ));
                }
                assert!(matches!(
                    kp.shared_secret(&peer),
                    Err(DhError::ForbiddenThread(_))
                ));
                // Checking a peer's value is no exponentiation: allowed.
                DhGroup::Ffdhe2048.check_peer(&peer).expect("valid share");
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(!exponentiation_forbidden_here(), "per thread");
    }

    #[test]
    fn peer_values_are_checked_before_any_exponentiation() {
        let g = DhGroup::Ffdhe2048;
        let n = g.key_size();
        let mut one = vec![0u8; n];
        one[n - 1] = 1;
        let mut two = vec![0u8; n];
        two[n - 1] = 2;
        let p = g.prime().unwrap().p.to_vec();
        let p_minus_1 = g.prime().unwrap().p_minus_1.to_vec();
        let mut p_minus_2 = p_minus_1.clone();
        p_minus_2[n - 1] -= 1;
        assert!(matches!(g.check_peer(&one), Err(DhError::PeerOutOfRange)));
        assert!(matches!(
            g.check_peer(&vec![0; n]),
            Err(DhError::PeerOutOfRange)
        ));
        assert!(matches!(
            g.check_peer(&p_minus_1),
            Err(DhError::PeerOutOfRange)
        ));
        assert!(matches!(g.check_peer(&p), Err(DhError::PeerOutOfRange)));
        assert!(matches!(
            g.check_peer(&[0xff; 256]),
            Err(DhError::PeerOutOfRange)
        ));
        assert!(matches!(
            g.check_peer(&two[1..]),
            Err(DhError::PeerLength { .. })
        ));
        g.check_peer(&two).expect("2 is in range");
        g.check_peer(&p_minus_2).expect("p-2 is in range");
        assert!(matches!(
            DhGroup::Null.check_peer(&two),
            Err(DhError::NullGroup)
        ));
    }

    #[test]
    fn both_sides_agree_in_every_group() {
        for g in &DhGroup::ALL[1..] {
            let a = KeyPair::generate(*g).unwrap();
            let b = KeyPair::generate(*g).unwrap();
            assert_eq!(a.public().len(), g.key_size());
            assert_eq!(
                *a.shared_secret(b.public()).unwrap(),
                *b.shared_secret(a.public()).unwrap(),
                "{}",
                g.name()
            );
        }
    }
}
