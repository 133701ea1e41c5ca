//! Kernel TLS (Linux `net/tls`, `Documentation/networking/tls.rst`): after the handshake the
//! TLS 1.3 record keys go to the kernel (`setsockopt(TCP_ULP, "tls")`, then `SOL_TLS`
//! `TLS_TX` / `TLS_RX`), so the NVMe/TCP data path keeps reading and writing plaintext with
//! readv/writev. A record that is not application data (an alert, a KeyUpdate) makes the
//! next read fail with EIO, which closes that connection only (the record type would need a
//! recvmsg control message, TLS_GET_RECORD_TYPE; none of them is one to continue after).

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `/proc/sys/net/ipv4/tcp_available_ulp`: the upper layer protocols the kernel offers now
/// ("tls" once the `tls` module is loaded).
const AVAILABLE_ULP: &str = "/proc/sys/net/ipv4/tcp_available_ulp";

/// True when the kernel lists the "tls" upper layer protocol.
pub fn available() -> bool {
    std::fs::read_to_string(AVAILABLE_ULP)
        .map(|list| list.split_whitespace().any(|ulp| ulp == "tls"))
        .unwrap_or(false)
}

/// The AEAD of a TLS 1.3 cipher suite (RFC 8446 §B.4), which the kernel needs named: an
/// AES-256-GCM key and a ChaCha20-Poly1305 key are both 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aead {
    Aes128Gcm,
    Aes256Gcm,
    ChaCha20Poly1305,
}

impl Aead {
    pub fn key_len(self) -> usize {
        match self {
            Aead::Aes128Gcm => 16,
            Aead::Aes256Gcm | Aead::ChaCha20Poly1305 => 32,
        }
    }
}

/// One direction's record protection for TLS 1.3: the AEAD, the traffic key and the 12-byte
/// IV (RFC 8446 §7.3), with the record sequence number at which the kernel takes over.
pub struct RecordKeys {
    pub aead: Aead,
    pub key: zeroize::Zeroizing<Vec<u8>>,
    pub iv: [u8; 12],
    pub seq: u64,
}

pub enum Direction {
    Tx,
    Rx,
}

/// Why the kernel did not take the record layer.
#[derive(Debug)]
pub enum InstallError {
    /// Before any key was installed (no `tls` ULP, cipher or version refused): the socket
    /// still carries the session's records untouched, a user-space record layer can go on.
    Refused(io::Error),
    /// The transmit key is the kernel's, the receive key is not: the session is lost.
    Partial(io::Error),
}

/// Switches `fd` to kernel TLS: the ULP once, then one call per direction.
pub fn install(fd: BorrowedFd<'_>, tx: &RecordKeys, rx: &RecordKeys) -> Result<(), InstallError> {
    // Checked before the ULP goes on: a key the kernel structure cannot hold is a refusal
    // while the socket still carries plain TCP.
    check_key_len(tx).map_err(InstallError::Refused)?;
    check_key_len(rx).map_err(InstallError::Refused)?;
    let ulp = b"tls";
    setsockopt_bytes(fd, libc::SOL_TCP, libc::TCP_ULP, ulp).map_err(InstallError::Refused)?;
    set_keys(fd, Direction::Tx, tx).map_err(InstallError::Refused)?;
    set_keys(fd, Direction::Rx, rx).map_err(InstallError::Partial)
}

fn check_key_len(keys: &RecordKeys) -> io::Result<()> {
    if keys.key.len() == keys.aead.key_len() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a {}-byte key for {:?}", keys.key.len(), keys.aead),
        ))
    }
}

/// `struct tls12_crypto_info_*` (include/uapi/linux/tls.h) for one direction, the key wiped
/// after the call. The key's length is its AEAD's (checked by [`install`]).
fn set_keys(fd: BorrowedFd<'_>, direction: Direction, keys: &RecordKeys) -> io::Result<()> {
    let optname = match direction {
        Direction::Tx => libc::TLS_TX,
        Direction::Rx => libc::TLS_RX,
    };
    let rec_seq = keys.seq.to_be_bytes();
    // For AES-GCM the kernel's TLS 1.3 nonce is salt (IV bytes 0..4) || iv (bytes 4..12),
    // XORed with the sequence number as RFC 8446 §5.3 says: the 12-byte IV split as the TLS
    // 1.2 structure holds it. ChaCha20-Poly1305 has no salt: its `iv` is the whole IV.
    let (salt, iv) = keys.iv.split_at(4);
    match keys.aead {
        Aead::Aes128Gcm => {
            let mut info = libc::tls12_crypto_info_aes_gcm_128 {
                info: crypto_info(libc::TLS_CIPHER_AES_GCM_128),
                iv: [0; 8],
                key: [0; 16],
                salt: [0; 4],
                rec_seq,
            };
            info.iv.copy_from_slice(iv);
            info.key.copy_from_slice(&keys.key);
            info.salt.copy_from_slice(salt);
            let result = setsockopt_struct(fd, libc::SOL_TLS, optname, &info);
            zeroize::Zeroize::zeroize(&mut info.key);
            result
        }
        Aead::Aes256Gcm => {
            let mut info = libc::tls12_crypto_info_aes_gcm_256 {
                info: crypto_info(libc::TLS_CIPHER_AES_GCM_256),
                iv: [0; 8],
                key: [0; 32],
                salt: [0; 4],
                rec_seq,
            };
            info.iv.copy_from_slice(iv);
            info.key.copy_from_slice(&keys.key);
            info.salt.copy_from_slice(salt);
            let result = setsockopt_struct(fd, libc::SOL_TLS, optname, &info);
            zeroize::Zeroize::zeroize(&mut info.key);
            result
        }
        Aead::ChaCha20Poly1305 => {
            let mut info = libc::tls12_crypto_info_chacha20_poly1305 {
                info: crypto_info(libc::TLS_CIPHER_CHACHA20_POLY1305),
                iv: keys.iv,
                key: [0; 32],
                salt: [],
                rec_seq,
            };
            info.key.copy_from_slice(&keys.key);
            let result = setsockopt_struct(fd, libc::SOL_TLS, optname, &info);
            zeroize::Zeroize::zeroize(&mut info.key);
            result
        }
    }
}

fn crypto_info(cipher_type: u16) -> libc::tls_crypto_info {
    libc::tls_crypto_info {
        version: libc::TLS_1_3_VERSION,
        cipher_type,
    }
}

fn setsockopt_bytes(fd: BorrowedFd<'_>, level: i32, name: i32, value: &[u8]) -> io::Result<()> {
    // SAFETY: `value` is a live slice and its exact length is passed; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn setsockopt_struct<T>(fd: BorrowedFd<'_>, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live, initialised `#[repr(C)]` uapi structure of `size_of::<T>()`
    // bytes; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The uapi structures as include/uapi/linux/tls.h lays them out: `tls_crypto_info`
    /// (version, cipher_type: 2 + 2 bytes), then iv, key, salt, rec_seq.
    #[test]
    fn crypto_info_structures_have_the_uapi_sizes() {
        assert_eq!(size_of::<libc::tls_crypto_info>(), 4);
        assert_eq!(
            size_of::<libc::tls12_crypto_info_aes_gcm_128>(),
            4 + 8 + 16 + 4 + 8
        );
        assert_eq!(
            size_of::<libc::tls12_crypto_info_aes_gcm_256>(),
            4 + 8 + 32 + 4 + 8
        );
        assert_eq!(
            size_of::<libc::tls12_crypto_info_chacha20_poly1305>(),
            4 + 12 + 32 + 8
        );
        assert_eq!(
            (
                libc::TLS_CIPHER_AES_GCM_128,
                libc::TLS_CIPHER_AES_GCM_256,
                libc::TLS_CIPHER_CHACHA20_POLY1305,
                libc::TLS_1_3_VERSION
            ),
            (51, 52, 54, 0x0304)
        );
    }

    /// A key of another length than its AEAD's is refused before the socket changes.
    #[test]
    fn a_key_of_the_wrong_length_is_refused_before_the_ulp() {
        use std::os::fd::AsFd;
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let keys = |aead, len| RecordKeys {
            aead,
            key: zeroize::Zeroizing::new(vec![1; len]),
            iv: [0; 12],
            seq: 0,
        };
        for (aead, len) in [
            (Aead::Aes128Gcm, 32),
            (Aead::Aes256Gcm, 16),
            (Aead::ChaCha20Poly1305, 16),
        ] {
            match install(a.as_fd(), &keys(aead, len), &keys(aead, len)) {
                Err(InstallError::Refused(e)) => {
                    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{aead:?}: {e}")
                }
                other => panic!("{aead:?} with a {len}-byte key: {other:?}"),
            }
        }
    }
}
