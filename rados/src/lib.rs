//! librados for nvmfd: the C API ([`ffi`]) and a small safe wrapper.
//!
//! nvmfd's gateway groups coordinate only through RADOS, the engine the storage already lives
//! on: object locks with a lease (who owns an ANA group), the OSD blocklist (fencing a gateway
//! that lost its lease), watch/notify and omap (shared reservation state). This crate is the
//! only place those calls are made; every `unsafe` block of it sits in this crate.
//!
//! Blocking: every call here is a network round trip (or waits for one). Callers run them on
//! their own threads, never on a reactor.

pub mod ffi;
pub mod omap;
pub mod watch;

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A librados call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// librados returned a negative errno.
    #[error("{op}: {}", std::io::Error::from_raw_os_error(*errno))]
    Os { op: &'static str, errno: i32 },
    /// A string handed to librados contained a NUL byte.
    #[error("{what} contains a NUL byte")]
    Nul { what: &'static str },
    /// librados returned something this wrapper cannot parse.
    #[error("{op}: malformed reply ({detail})")]
    Malformed { op: &'static str, detail: String },
}

impl Error {
    /// The errno, for an OS error.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Os { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// This client instance has been blocklisted (fenced): Ceph's `EBLOCKLISTED` is
    /// `ESHUTDOWN` on Linux. Every later operation of the instance fails the same way; only a
    /// new instance (a new [`Cluster`]) can work again.
    pub fn is_blocklisted(&self) -> bool {
        self.errno() == Some(libc::ESHUTDOWN)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

fn check(op: &'static str, r: c_int) -> Result<c_int> {
    if r < 0 {
        Err(Error::Os { op, errno: -r })
    } else {
        Ok(r)
    }
}

fn cstr(what: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Nul { what })
}

/// How to reach the cluster: like the `ceph` tools, `ceph_conf` (librados' default search
/// when `None`), the client id (`admin` when `None`; a leading `client.` is accepted), then
/// `CEPH_ARGS`, then `options` (each wins over ceph.conf).
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    pub ceph_conf: Option<PathBuf>,
    pub client_id: Option<String>,
    /// Settings applied after ceph.conf and CEPH_ARGS, e.g. `("rados_osd_op_timeout", "10")`.
    pub options: Vec<(String, String)>,
}

/// One connected librados client instance (a `rados_t`): one address the OSDs know it by,
/// which is what a blocklist entry fences.
pub struct Cluster {
    handle: ffi::rados_t,
}

// SAFETY: a connected `rados_t` is thread-safe (librados serialises internally; Ceph's own
// tools and QEMU share one handle between threads). The pointer is only passed to librados.
unsafe impl Send for Cluster {}
// SAFETY: as above; `&self` methods only call thread-safe librados functions.
unsafe impl Sync for Cluster {}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("instance", &self.instance_id())
            .finish()
    }
}

impl Cluster {
    /// Creates a client instance, configures it and connects. Blocks for at most
    /// `client_mount_timeout` (30 s unless ceph.conf or `options` say otherwise).
    pub fn connect(opts: &ConnectOptions) -> Result<Arc<Cluster>> {
        let id = match &opts.client_id {
            Some(id) => Some(cstr("client id", id.strip_prefix("client.").unwrap_or(id))?),
            None => None,
        };
        let conf = match &opts.ceph_conf {
            Some(p) => Some(cstr("ceph_conf path", &p.to_string_lossy())?),
            None => None,
        };
        let options = opts
            .options
            .iter()
            .map(|(k, v)| Ok((cstr("option name", k)?, cstr("option value", v)?)))
            .collect::<Result<Vec<_>>>()?;

        let mut handle: ffi::rados_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; `id` is NUL-terminated or null (= "admin").
        let r = unsafe {
            ffi::rados_create(
                &mut handle,
                id.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        check("rados_create", r)?;
        // From here on, dropping `cluster` shuts the handle down.
        let cluster = Cluster { handle };
        // A default first, so that ceph.conf wins: an unreachable cluster must not hold up
        // the daemon for librados' default of 300 s.
        cluster.conf_set_raw(c"client_mount_timeout", c"30")?;
        // SAFETY: valid unconnected handle; a null path selects librados' default search.
        let r = unsafe {
            ffi::rados_conf_read_file(
                cluster.handle,
                conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        check("reading ceph.conf", r)?;
        // SAFETY: valid handle; null selects CEPH_ARGS.
        let r = unsafe { ffi::rados_conf_parse_env(cluster.handle, std::ptr::null()) };
        check("parsing CEPH_ARGS", r)?;
        for (k, v) in &options {
            cluster.conf_set_raw(k, v)?;
        }
        // SAFETY: valid configured handle.
        let r = unsafe { ffi::rados_connect(cluster.handle) };
        check("connecting to the cluster", r)?;
        Ok(Arc::new(cluster))
    }

    fn conf_set_raw(&self, key: &CStr, value: &CStr) -> Result<()> {
        // SAFETY: valid handle, NUL-terminated strings that outlive the call.
        let r = unsafe { ffi::rados_conf_set(self.handle, key.as_ptr(), value.as_ptr()) };
        check("rados_conf_set", r).map(drop)
    }

    /// The raw handle, for a library that takes a `rados_t` (librbd opens images on an
    /// ioctx of it). Valid while `self` lives.
    pub fn as_raw(&self) -> ffi::rados_t {
        self.handle
    }

    /// This instance's id (`client.<id>` in the OSD's view, the `clients` column of
    /// [`IoCtx::list_lockers`] is `client.<instance_id>`).
    pub fn instance_id(&self) -> u64 {
        // SAFETY: valid connected handle.
        unsafe { ffi::rados_get_instance_id(self.handle) }
    }

    /// The address the OSDs know this instance by (`IP:port/nonce`; the nonce makes it
    /// unique per instance), as `rados_getaddrs` formats it.
    pub fn addrs(&self) -> Result<String> {
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: valid connected handle, out-pointer to a local.
        let r = unsafe { ffi::rados_getaddrs(self.handle, &mut out) };
        check("rados_getaddrs", r)?;
        if out.is_null() {
            return Err(Error::Malformed {
                op: "rados_getaddrs",
                detail: "null address".into(),
            });
        }
        // SAFETY: librados returned a NUL-terminated string it allocated with malloc and
        // that the caller frees (librados.h: "the caller must free").
        let s = unsafe { CStr::from_ptr(out) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `out` came from librados' malloc and is not used after this.
        unsafe { libc::free(out.cast()) };
        Ok(s)
    }

    /// Fences the client instance at `addr` (as [`IoCtx::list_lockers`] reports it): every
    /// OSD refuses its operations for `expire` (the cluster default when zero). Returns once
    /// the monitor has committed the entry and this client has seen the OSD map carrying it.
    pub fn blocklist_add(&self, addr: &str, expire: Duration) -> Result<()> {
        let c = cstr("client address", addr)?;
        let secs = u32::try_from(expire.as_secs()).unwrap_or(u32::MAX);
        // SAFETY: valid connected handle; librados only reads the NUL-terminated string
        // (the C prototype lacks `const`).
        let r = unsafe { ffi::rados_blocklist_add(self.handle, c.as_ptr() as *mut c_char, secs) };
        check("rados_blocklist_add", r)?;
        // SAFETY: valid connected handle.
        let r = unsafe { ffi::rados_wait_for_latest_osdmap(self.handle) };
        check("rados_wait_for_latest_osdmap", r).map(drop)
    }

    /// Opens an I/O context on `pool`, in RADOS namespace `namespace` (the default namespace
    /// when `None`).
    pub fn ioctx(self: &Arc<Self>, pool: &str, namespace: Option<&str>) -> Result<IoCtx> {
        let p = cstr("pool name", pool)?;
        let n = namespace.map(|n| cstr("namespace", n)).transpose()?;
        let mut handle: ffi::rados_ioctx_t = std::ptr::null_mut();
        // SAFETY: connected handle, NUL-terminated pool name, out-pointer to a local.
        let r = unsafe { ffi::rados_ioctx_create(self.handle, p.as_ptr(), &mut handle) };
        check("opening the pool", r)?;
        if let Some(n) = &n {
            // SAFETY: valid ioctx, NUL-terminated namespace (copied by librados).
            unsafe { ffi::rados_ioctx_set_namespace(handle, n.as_ptr()) };
        }
        Ok(IoCtx {
            handle,
            _cluster: Arc::clone(self),
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: valid handle, not used after this; every IoCtx holds an Arc to `self`, so
        // none outlives it.
        unsafe { ffi::rados_shutdown(self.handle) };
    }
}

/// An I/O context: one pool and namespace of a [`Cluster`] (which it keeps alive).
pub struct IoCtx {
    handle: ffi::rados_ioctx_t,
    _cluster: Arc<Cluster>,
}

// SAFETY: librados ioctx handles may be used from several threads (the RBD backend and Ceph's
// tools do); the pointer is only passed to librados.
unsafe impl Send for IoCtx {}
// SAFETY: as above.
unsafe impl Sync for IoCtx {}

impl std::fmt::Debug for IoCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoCtx").finish_non_exhaustive()
    }
}

/// How [`IoCtx::lock_exclusive`] treats a lock this cookie already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Take the lock; `-EEXIST` if this cookie holds it already, `-EBUSY` if another does.
    Acquire,
    /// Take it or renew it (`LIBRADOS_LOCK_FLAG_MAY_RENEW`).
    AcquireOrRenew,
    /// Renew only (`LIBRADOS_LOCK_FLAG_MUST_RENEW`): `-ENOENT` when this cookie no longer
    /// holds it (expired, broken), so a lost lease is never silently taken again.
    Renew,
}

/// One holder of a lock, as the OSD recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locker {
    /// `client.<instance id>`.
    pub client: String,
    pub cookie: String,
    /// The holder's address (`IP:port/nonce`): what [`Cluster::blocklist_add`] takes.
    pub addr: String,
}

/// [`IoCtx::list_lockers`]'s answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lockers {
    pub exclusive: bool,
    pub tag: String,
    pub lockers: Vec<Locker>,
}

/// Splits librados' NUL-separated string list (`len` bytes including each NUL).
fn nul_list(buf: &[u8]) -> Vec<String> {
    buf.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

impl IoCtx {
    /// The raw handle (librbd's `rbd_open` takes one). Valid while `self` lives.
    pub fn as_raw(&self) -> ffi::rados_ioctx_t {
        self.handle
    }

    /// The version of the object last read or written through this ioctx (for
    /// `assert_version` compare-and-set).
    pub fn last_version(&self) -> u64 {
        // SAFETY: valid ioctx.
        unsafe { ffi::rados_get_last_version(self.handle) }
    }

    /// Takes (or renews) exclusive lock `name` on object `oid` (created empty if missing)
    /// with `cookie` for `duration` (the OSD drops it after that unless renewed; zero = no
    /// expiry). `desc` is stored with the lock for operators (`rados lock info`).
    pub fn lock_exclusive(
        &self,
        oid: &str,
        name: &str,
        cookie: &str,
        desc: &str,
        duration: Duration,
        mode: LockMode,
    ) -> Result<()> {
        let (o, n, c, d) = (
            cstr("object name", oid)?,
            cstr("lock name", name)?,
            cstr("lock cookie", cookie)?,
            cstr("lock description", desc)?,
        );
        let mut tv = libc::timeval {
            tv_sec: duration.as_secs() as libc::time_t,
            tv_usec: duration.subsec_micros() as libc::suseconds_t,
        };
        let flags = match mode {
            LockMode::Acquire => 0,
            LockMode::AcquireOrRenew => ffi::LIBRADOS_LOCK_FLAG_RENEW,
            LockMode::Renew => ffi::LIBRADOS_LOCK_FLAG_MUST_RENEW,
        };
        let tvp = if duration.is_zero() {
            std::ptr::null_mut()
        } else {
            &mut tv as *mut libc::timeval
        };
        // SAFETY: valid ioctx; NUL-terminated strings and the timeval outlive the call.
        let r = unsafe {
            ffi::rados_lock_exclusive(
                self.handle,
                o.as_ptr(),
                n.as_ptr(),
                c.as_ptr(),
                d.as_ptr(),
                tvp,
                flags,
            )
        };
        check("rados_lock_exclusive", r).map(drop)
    }

    /// Releases lock `name` held with `cookie` (`-ENOENT` when not held).
    pub fn unlock(&self, oid: &str, name: &str, cookie: &str) -> Result<()> {
        let (o, n, c) = (
            cstr("object name", oid)?,
            cstr("lock name", name)?,
            cstr("lock cookie", cookie)?,
        );
        // SAFETY: valid ioctx, NUL-terminated strings.
        let r = unsafe { ffi::rados_unlock(self.handle, o.as_ptr(), n.as_ptr(), c.as_ptr()) };
        check("rados_unlock", r).map(drop)
    }

    /// Removes the lock held by `client` (`client.<id>`) with `cookie`, whoever we are.
    pub fn break_lock(&self, oid: &str, name: &str, client: &str, cookie: &str) -> Result<()> {
        let (o, n, cl, c) = (
            cstr("object name", oid)?,
            cstr("lock name", name)?,
            cstr("lock client", client)?,
            cstr("lock cookie", cookie)?,
        );
        // SAFETY: valid ioctx, NUL-terminated strings.
        let r = unsafe {
            ffi::rados_break_lock(self.handle, o.as_ptr(), n.as_ptr(), cl.as_ptr(), c.as_ptr())
        };
        check("rados_break_lock", r).map(drop)
    }

    /// The current holders of lock `name` on `oid` (none when the object or lock is absent,
    /// or the lease expired).
    pub fn list_lockers(&self, oid: &str, name: &str) -> Result<Lockers> {
        let (o, n) = (cstr("object name", oid)?, cstr("lock name", name)?);
        let mut cap = 256usize;
        loop {
            let mut exclusive: c_int = 0;
            let (mut tag, mut clients, mut cookies, mut addrs) = (
                vec![0u8; cap],
                vec![0u8; cap],
                vec![0u8; cap],
                vec![0u8; cap],
            );
            let (mut tag_len, mut clients_len, mut cookies_len, mut addrs_len) =
                (cap, cap, cap, cap);
            // SAFETY: valid ioctx; each buffer is `cap` bytes and its length says so;
            // librados writes at most that and updates the lengths.
            let r = unsafe {
                ffi::rados_list_lockers(
                    self.handle,
                    o.as_ptr(),
                    n.as_ptr(),
                    &mut exclusive,
                    tag.as_mut_ptr().cast(),
                    &mut tag_len,
                    clients.as_mut_ptr().cast(),
                    &mut clients_len,
                    cookies.as_mut_ptr().cast(),
                    &mut cookies_len,
                    addrs.as_mut_ptr().cast(),
                    &mut addrs_len,
                )
            };
            if r == -(libc::ERANGE as isize) {
                // The lengths now hold what is needed.
                let need = tag_len.max(clients_len).max(cookies_len).max(addrs_len);
                if need <= cap || need > 1 << 20 {
                    return Err(Error::Malformed {
                        op: "rados_list_lockers",
                        detail: format!("ERANGE asking for {need} bytes"),
                    });
                }
                cap = need;
                continue;
            }
            if r == -(libc::ENOENT as isize) {
                return Ok(Lockers::default());
            }
            if r < 0 {
                return Err(Error::Os {
                    op: "rados_list_lockers",
                    errno: -(r as i32),
                });
            }
            let clip = |v: &[u8], len: usize| nul_list(&v[..len.min(v.len())]);
            let clients = clip(&clients, clients_len);
            let cookies = clip(&cookies, cookies_len);
            let addrs = clip(&addrs, addrs_len);
            let count = r as usize;
            if clients.len() != count || cookies.len() != count || addrs.len() != count {
                return Err(Error::Malformed {
                    op: "rados_list_lockers",
                    detail: format!(
                        "{count} lockers but {} clients, {} cookies, {} addresses",
                        clients.len(),
                        cookies.len(),
                        addrs.len()
                    ),
                });
            }
            let tag = clip(&tag, tag_len).into_iter().next().unwrap_or_default();
            let lockers = clients
                .into_iter()
                .zip(cookies)
                .zip(addrs)
                .map(|((client, cookie), addr)| Locker {
                    client,
                    cookie,
                    addr,
                })
                .collect();
            return Ok(Lockers {
                exclusive: exclusive != 0,
                tag,
                lockers,
            });
        }
    }

    /// Size and modification time (seconds since the epoch) of `oid`.
    pub fn stat(&self, oid: &str) -> Result<(u64, libc::time_t)> {
        let o = cstr("object name", oid)?;
        let (mut size, mut mtime) = (0u64, 0 as libc::time_t);
        // SAFETY: valid ioctx, NUL-terminated name, out-pointers to locals.
        let r = unsafe { ffi::rados_stat(self.handle, o.as_ptr(), &mut size, &mut mtime) };
        check("rados_stat", r)?;
        Ok((size, mtime))
    }

    /// Replaces the whole content of `oid` (creating it).
    pub fn write_full(&self, oid: &str, data: &[u8]) -> Result<()> {
        let o = cstr("object name", oid)?;
        // SAFETY: valid ioctx, NUL-terminated name, `data` valid for `len` bytes.
        let r = unsafe {
            ffi::rados_write_full(self.handle, o.as_ptr(), data.as_ptr().cast(), data.len())
        };
        check("rados_write_full", r).map(drop)
    }

    /// Reads up to `max` bytes of `oid` from offset 0.
    pub fn read(&self, oid: &str, max: usize) -> Result<Vec<u8>> {
        let o = cstr("object name", oid)?;
        let mut buf = vec![0u8; max];
        // SAFETY: valid ioctx, NUL-terminated name, `buf` is writable for `max` bytes.
        let r =
            unsafe { ffi::rados_read(self.handle, o.as_ptr(), buf.as_mut_ptr().cast(), max, 0) };
        let n = check("rados_read", r)? as usize;
        buf.truncate(n.min(max));
        Ok(buf)
    }
}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: valid ioctx, not used after this; the cluster outlives it (held by Arc).
        unsafe { ffi::rados_ioctx_destroy(self.handle) };
    }
}

impl IoCtx {
    /// Takes (or renews, per `mode`) shared lock `name` on `oid` with `cookie` and `tag` (every
    /// holder must use the same tag) for `duration`, with an empty description; a gateway
    /// group's membership.
    pub fn lock_shared(
        &self,
        oid: &str,
        name: &str,
        cookie: &str,
        tag: &str,
        duration: Duration,
        mode: LockMode,
    ) -> Result<()> {
        let (o, n, c, t) = (
            cstr("object name", oid)?,
            cstr("lock name", name)?,
            cstr("lock cookie", cookie)?,
            cstr("lock tag", tag)?,
        );
        let mut tv = libc::timeval {
            tv_sec: duration.as_secs() as libc::time_t,
            tv_usec: duration.subsec_micros() as libc::suseconds_t,
        };
        let tvp = if duration.is_zero() {
            std::ptr::null_mut()
        } else {
            &mut tv as *mut libc::timeval
        };
        let flags = match mode {
            LockMode::Acquire => 0,
            LockMode::AcquireOrRenew => ffi::LIBRADOS_LOCK_FLAG_RENEW,
            LockMode::Renew => ffi::LIBRADOS_LOCK_FLAG_MUST_RENEW,
        };
        // SAFETY: valid ioctx; NUL-terminated strings and the timeval outlive the call.
        let r = unsafe {
            ffi::rados_lock_shared(
                self.handle,
                o.as_ptr(),
                n.as_ptr(),
                c.as_ptr(),
                t.as_ptr(),
                c"".as_ptr(),
                tvp,
                flags,
            )
        };
        check("rados_lock_shared", r).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_separated_lists_split_and_skip_empty() {
        assert_eq!(nul_list(b"a\0bc\0"), vec!["a", "bc"]);
        assert_eq!(nul_list(b""), Vec::<String>::new());
        assert_eq!(nul_list(b"\0"), Vec::<String>::new());
    }

    #[test]
    fn shutdown_errno_is_blocklisted() {
        let e = Error::Os {
            op: "x",
            errno: libc::ESHUTDOWN,
        };
        assert!(e.is_blocklisted());
        assert!(!Error::Os {
            op: "x",
            errno: libc::EIO
        }
        .is_blocklisted());
        assert!(!Error::Nul { what: "x" }.is_blocklisted());
    }
}
