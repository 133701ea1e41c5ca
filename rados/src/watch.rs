//! Watch/notify on one object: a watcher's callbacks, a notify that waits (bounded) for every
//! watcher's acknowledgement and says which ones did not answer, and the acknowledgement.
//!
//! Delivery is best effort (gateway-notes.md): a notify reaches the watchers registered when
//! it is sent; a watcher that is disconnected hears of it through its error callback
//! (`-ENOTCONN`, `-ETIMEDOUT`, `-ESHUTDOWN` when blocklisted) and must assume it missed some.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;
use std::time::Duration;

use super::{check, cstr, ffi, Error, IoCtx, Result};

/// One notify as a watcher receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notify {
    /// Identifies the notify for [`IoCtx::notify_ack`].
    pub notify_id: u64,
    /// The watch it arrived on (its cookie).
    pub cookie: u64,
    /// The notifier's client instance id ([`super::Cluster::instance_id`]).
    pub notifier: u64,
    pub data: Vec<u8>,
}

/// A watcher that answered a notify: its client instance id, watch cookie and reply payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub client: u64,
    pub cookie: u64,
    pub reply: Vec<u8>,
}

/// The outcome of [`IoCtx::notify`]: who answered and who did not within the timeout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotifyReply {
    pub acks: Vec<Ack>,
    /// (client instance id, watch cookie) of each watcher that did not answer in time.
    pub timeouts: Vec<(u64, u64)>,
}

type OnNotify = Box<dyn Fn(Notify) + Send + Sync>;
type OnError = Box<dyn Fn(u64, i32) + Send + Sync>;

struct Callbacks {
    on_notify: OnNotify,
    on_error: OnError,
}

/// A registered watch; dropping it unwatches and waits for callbacks in flight.
pub struct Watch {
    io: Arc<IoCtx>,
    cookie: u64,
    callbacks: *mut Callbacks,
}

// SAFETY: the callbacks are Send + Sync closures; the cookie and ioctx are thread-safe.
unsafe impl Send for Watch {}
// SAFETY: as above (no interior mutation through &Watch).
unsafe impl Sync for Watch {}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("cookie", &self.cookie)
            .finish_non_exhaustive()
    }
}

impl Watch {
    pub fn cookie(&self) -> u64 {
        self.cookie
    }

    /// Whether the watch is still registered with the OSD: `Ok` with the milliseconds since
    /// it was last confirmed, or the error that broke it.
    pub fn check(&self) -> Result<u64> {
        // SAFETY: valid ioctx and a cookie it handed out.
        let r = unsafe { ffi::rados_watch_check(self.io.handle, self.cookie) };
        check("rados_watch_check", r).map(|ms| ms as u64)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // SAFETY: valid ioctx and cookie; after unwatch, watch_flush waits for callbacks
        // already queued, so none runs once the callbacks are freed below.
        unsafe {
            ffi::rados_unwatch2(self.io.handle, self.cookie);
            ffi::rados_watch_flush(self.io._cluster.handle);
            drop(Box::from_raw(self.callbacks));
        }
    }
}

unsafe extern "C" fn notify_cb(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    notifier: u64,
    data: *mut c_void,
    len: usize,
) {
    // SAFETY: `arg` is the Callbacks box, alive until the Watch is dropped (after a flush);
    // `data` holds `len` bytes for the duration of the call.
    let (cb, data) = unsafe {
        (
            &*(arg as *const Callbacks),
            if len == 0 || data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(data as *const u8, len).to_vec()
            },
        )
    };
    let n = Notify {
        notify_id,
        cookie,
        notifier,
        data,
    };
    // A panic must not unwind into librados.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (cb.on_notify)(n)));
}

unsafe extern "C" fn error_cb(arg: *mut c_void, cookie: u64, err: c_int) {
    // SAFETY: as in `notify_cb`.
    let cb = unsafe { &*(arg as *const Callbacks) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (cb.on_error)(cookie, err)));
}

impl IoCtx {
    /// Watches `oid` (which must exist): `on_notify` for each notify (acknowledge it with
    /// [`IoCtx::notify_ack`], or the notifier waits until its timeout), `on_error` with the
    /// watch cookie and -errno when the watch breaks. Both run on librados threads: hand
    /// blocking work to a thread of yours.
    pub fn watch(
        self: &Arc<Self>,
        oid: &str,
        on_notify: impl Fn(Notify) + Send + Sync + 'static,
        on_error: impl Fn(u64, i32) + Send + Sync + 'static,
    ) -> Result<Watch> {
        let o = cstr("object name", oid)?;
        let callbacks = Box::into_raw(Box::new(Callbacks {
            on_notify: Box::new(on_notify),
            on_error: Box::new(on_error),
        }));
        let mut cookie = 0u64;
        // SAFETY: valid ioctx, NUL-terminated name, `callbacks` stays allocated until the
        // Watch drops it (after unwatch and flush); on failure it is freed here.
        let r = unsafe {
            ffi::rados_watch2(
                self.handle,
                o.as_ptr(),
                &mut cookie,
                notify_cb,
                error_cb,
                callbacks.cast(),
            )
        };
        if let Err(e) = check("rados_watch2", r) {
            // SAFETY: not registered: nothing else holds the pointer.
            drop(unsafe { Box::from_raw(callbacks) });
            return Err(e);
        }
        Ok(Watch {
            io: Arc::clone(self),
            cookie,
            callbacks,
        })
    }

    /// Notifies every watcher of `oid` with `data` and waits up to `timeout` for their
    /// acknowledgements. A timeout is not an error here: the reply lists who did not answer.
    pub fn notify(&self, oid: &str, data: &[u8], timeout: Duration) -> Result<NotifyReply> {
        let o = cstr("object name", oid)?;
        let len = c_int::try_from(data.len()).map_err(|_| Error::Malformed {
            op: "rados_notify2",
            detail: "payload too large".into(),
        })?;
        let (mut buf, mut buf_len): (*mut c_char, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: valid ioctx, NUL-terminated name, `data` valid for `len` bytes, out-pointers
        // to locals; the reply buffer is freed below with rados_buffer_free.
        let r = unsafe {
            ffi::rados_notify2(
                self.handle,
                o.as_ptr(),
                data.as_ptr().cast(),
                len,
                timeout.as_millis().min(u64::MAX as u128) as u64,
                &mut buf,
                &mut buf_len,
            )
        };
        let reply = if buf.is_null() {
            None
        } else {
            // SAFETY: librados returned `buf_len` bytes at `buf`; copied, then freed once.
            let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, buf_len).to_vec() };
            // SAFETY: a buffer librados allocated for this call.
            unsafe { ffi::rados_buffer_free(buf) };
            Some(bytes)
        };
        if r < 0 && r != -libc::ETIMEDOUT {
            return Err(Error::Os {
                op: "rados_notify2",
                errno: -r,
            });
        }
        match reply {
            Some(b) => decode_notify_reply(&b),
            None => Ok(NotifyReply::default()),
        }
    }

    /// Acknowledges notify `notify_id` received on watch `cookie` of `oid`.
    pub fn notify_ack(&self, oid: &str, notify_id: u64, cookie: u64, reply: &[u8]) -> Result<()> {
        let o: CString = cstr("object name", oid)?;
        let len = c_int::try_from(reply.len()).unwrap_or(0);
        // SAFETY: valid ioctx, NUL-terminated name, `reply` valid for `len` bytes.
        let r = unsafe {
            ffi::rados_notify_ack(
                self.handle,
                o.as_ptr(),
                notify_id,
                cookie,
                reply.as_ptr().cast(),
                len,
            )
        };
        check("rados_notify_ack", r).map(drop)
    }
}

/// The reply of a notify, as librados encodes it: the acknowledgements, a map of (client
/// instance id u64, watch cookie u64) to a payload (u32 length + bytes), then the set of
/// (client, cookie) that timed out; counts are u32, integers little-endian.
pub fn decode_notify_reply(b: &[u8]) -> Result<NotifyReply> {
    let mut r = Reader { b, at: 0 };
    let mut out = NotifyReply::default();
    let acks = r.u32()?;
    for _ in 0..acks {
        let (client, cookie) = (r.u64()?, r.u64()?);
        let n = r.u32()? as usize;
        let reply = r.take(n)?.to_vec();
        out.acks.push(Ack {
            client,
            cookie,
            reply,
        });
    }
    let timeouts = r.u32()?;
    for _ in 0..timeouts {
        out.timeouts.push((r.u64()?, r.u64()?));
    }
    if r.at != b.len() {
        return Err(malformed("trailing bytes"));
    }
    Ok(out)
}

fn malformed(detail: &str) -> Error {
    Error::Malformed {
        op: "rados_notify2 reply",
        detail: detail.into(),
    }
}

/// A cursor that never reads past the reply (counts from the wire are not trusted).
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| malformed("truncated"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u64(&mut self) -> Result<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&2u32.to_le_bytes());
        for (client, cookie, payload) in [(4100u64, 7u64, &b"ok"[..]), (4200, 9, b"")] {
            b.extend_from_slice(&client.to_le_bytes());
            b.extend_from_slice(&cookie.to_le_bytes());
            b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            b.extend_from_slice(payload);
        }
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&4300u64.to_le_bytes());
        b.extend_from_slice(&11u64.to_le_bytes());
        b
    }

    #[test]
    fn notify_reply_decodes_acks_and_timeouts() {
        let r = decode_notify_reply(&reply()).unwrap();
        assert_eq!(
            r.acks,
            vec![
                Ack {
                    client: 4100,
                    cookie: 7,
                    reply: b"ok".to_vec()
                },
                Ack {
                    client: 4200,
                    cookie: 9,
                    reply: vec![]
                }
            ]
        );
        assert_eq!(r.timeouts, vec![(4300, 11)]);
    }

    #[test]
    fn notify_reply_never_reads_past_its_end() {
        let b = reply();
        for n in 0..b.len() {
            assert!(decode_notify_reply(&b[..n]).is_err(), "{n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(decode_notify_reply(&long).is_err());
        // A count far beyond the bytes present.
        let mut huge = b.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_notify_reply(&huge).is_err());
    }
}
