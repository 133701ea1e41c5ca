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

/// One direction's record protection for TLS 1.3 AES-GCM: the traffic key and the 12-byte
/// IV (RFC 8446 §7.3), with the record sequence number at which the kernel takes over.
pub struct RecordKeys {
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
    let ulp = b"tls";
    setsockopt_bytes(fd, libc::SOL_TCP, libc::TCP_ULP, ulp).map_err(InstallError::Refused)?;
    set_keys(fd, Direction::Tx, tx).map_err(InstallError::Refused)?;
    set_keys(fd, Direction::Rx, rx).map_err(InstallError::Partial)
}

fn set_keys(fd: BorrowedFd<'_>, direction: Direction, keys: &RecordKeys) -> io::Result<()> {
    let optname = match direction {
        Direction::Tx => libc::TLS_TX,
        Direction::Rx => libc::TLS_RX,
    };
    // The kernel's TLS 1.3 nonce is salt (IV bytes 0..4) || iv (bytes 4..12), XORed with the
    // sequence number as RFC 8446 §5.3 says: the 12-byte IV split as the TLS 1.2 structure
    // holds it.
    let (salt, iv) = keys.iv.split_at(4);
    let rec_seq = keys.seq.to_be_bytes();
    match keys.key.len() {
        16 => {
            let mut info = libc::tls12_crypto_info_aes_gcm_128 {
                info: libc::tls_crypto_info {
                    version: libc::TLS_1_3_VERSION,
                    cipher_type: libc::TLS_CIPHER_AES_GCM_128,
                },
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
        32 => {
            let mut info = libc::tls12_crypto_info_aes_gcm_256 {
                info: libc::tls_crypto_info {
                    version: libc::TLS_1_3_VERSION,
                    cipher_type: libc::TLS_CIPHER_AES_GCM_256,
                },
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
        n => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no kernel TLS cipher for a {n}-byte AES-GCM key"),
        )),
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
