//! Ceph RBD namespaces through librbd's asynchronous C API (cargo feature `rbd`).
//!
//! Reads, writes and flushes are `rbd_aio_*` calls: librbd runs them on its own threads and
//! calls back on one of them; the callback hands `(tag, result)` to the submitting reactor's
//! [`ExternalCompletions`], which wakes the reactor through its io_uring eventfd. The reactor
//! then routes the result to `Queue::finish` exactly like an io_uring completion, so the core
//! and the transports see no difference between a file namespace and an RBD one.
//!
//! * FUA (NVM Command Set 1.0 §3.2.6): the write and an `rbd_aio_flush` are issued back to
//!   back; librbd orders a flush after the writes issued before it, so the command completes
//!   when both have, with the write's error if any.
//! * Deallocate and Write Zeroes use `rbd_aio_write_zeroes`, not `rbd_aio_discard`: librbd
//!   skips discards of partial objects (`rbd_skip_partial_discard`, on by default), which would
//!   break the core's promise that deallocated blocks read back as zeroes (DLFEAT). Whole
//!   objects are still deallocated. All ranges of one command complete as one result
//!   (`Backend::start_zeroes`); callers without a completion channel (tools, tests) get them
//!   synchronously.
//! * Resize: an `rbd_update_watch` callback marks the header as changed;
//!   [`Backend::refresh_capacity`] (called by the target's periodic capacity check) then
//!   re-reads the size outside librbd's callback thread, because `rbd_get_size` may wait for
//!   an image refresh that needs that very thread.
//! * Gateway groups: the daemon registers its gateway's RADOS client with [`share_cluster`]
//!   before opening namespaces; images are then opened on that client instance, so that
//!   blocklisting the gateway (fencing it) makes the OSDs refuse its image writes too. Ops
//!   refused that way (`-ESHUTDOWN`) are counted ([`fenced_ops`]) and logged.

use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::{
    check_range, Backend, BackendError, BackendRequest, Capabilities, ExternalCompletions,
    IoSubmit, RbdTarget, Started, Zeroing,
};

/// The librados / librbd C API subset nvmfd uses, declared by hand from Debian 12's
/// `rados/librados.h` and `rbd/librbd.h` (librbd 1.16, Ceph 16 Pacific; every function here
/// exists unchanged since Ceph 15). All handles are opaque `void *`.
#[allow(non_camel_case_types)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    pub type rados_t = *mut c_void;
    pub type rados_ioctx_t = *mut c_void;
    pub type rbd_image_t = *mut c_void;
    pub type rbd_completion_t = *mut c_void;
    pub type rbd_callback_t = unsafe extern "C" fn(cb: rbd_completion_t, arg: *mut c_void);
    pub type rbd_update_callback_t = unsafe extern "C" fn(arg: *mut c_void);

    #[link(name = "rados")]
    extern "C" {
        pub fn rados_create(cluster: *mut rados_t, id: *const c_char) -> c_int;
        pub fn rados_conf_set(
            cluster: rados_t,
            option: *const c_char,
            value: *const c_char,
        ) -> c_int;
        pub fn rados_conf_read_file(cluster: rados_t, path: *const c_char) -> c_int;
        pub fn rados_conf_parse_env(cluster: rados_t, var: *const c_char) -> c_int;
        pub fn rados_connect(cluster: rados_t) -> c_int;
        pub fn rados_shutdown(cluster: rados_t);
        pub fn rados_ioctx_create(
            cluster: rados_t,
            pool_name: *const c_char,
            ioctx: *mut rados_ioctx_t,
        ) -> c_int;
        pub fn rados_ioctx_set_namespace(io: rados_ioctx_t, nspace: *const c_char);
        pub fn rados_ioctx_destroy(io: rados_ioctx_t);
    }

    #[link(name = "rbd")]
    extern "C" {
        pub fn rbd_open(
            io: rados_ioctx_t,
            name: *const c_char,
            image: *mut rbd_image_t,
            snap_name: *const c_char,
        ) -> c_int;
        pub fn rbd_close(image: rbd_image_t) -> c_int;
        pub fn rbd_get_size(image: rbd_image_t, size: *mut u64) -> c_int;
        pub fn rbd_read(image: rbd_image_t, ofs: u64, len: usize, buf: *mut c_char) -> isize;
        pub fn rbd_write(image: rbd_image_t, ofs: u64, len: usize, buf: *const c_char) -> isize;
        pub fn rbd_flush(image: rbd_image_t) -> c_int;
        pub fn rbd_write_zeroes(
            image: rbd_image_t,
            ofs: u64,
            len: usize,
            zero_flags: c_int,
            op_flags: c_int,
        ) -> isize;
        pub fn rbd_aio_create_completion(
            cb_arg: *mut c_void,
            complete_cb: rbd_callback_t,
            c: *mut rbd_completion_t,
        ) -> c_int;
        pub fn rbd_aio_get_return_value(c: rbd_completion_t) -> isize;
        pub fn rbd_aio_release(c: rbd_completion_t);
        pub fn rbd_aio_read(
            image: rbd_image_t,
            off: u64,
            len: usize,
            buf: *mut c_char,
            c: rbd_completion_t,
        ) -> c_int;
        pub fn rbd_aio_write(
            image: rbd_image_t,
            off: u64,
            len: usize,
            buf: *const c_char,
            c: rbd_completion_t,
        ) -> c_int;
        pub fn rbd_aio_flush(image: rbd_image_t, c: rbd_completion_t) -> c_int;
        pub fn rbd_aio_write_zeroes(
            image: rbd_image_t,
            off: u64,
            len: usize,
            c: rbd_completion_t,
            zero_flags: c_int,
            op_flags: c_int,
        ) -> c_int;
        pub fn rbd_update_watch(
            image: rbd_image_t,
            handle: *mut u64,
            watch_cb: rbd_update_callback_t,
            arg: *mut c_void,
        ) -> c_int;
        pub fn rbd_update_unwatch(image: rbd_image_t, handle: u64) -> c_int;
        pub fn rbd_config_image_list(
            image: rbd_image_t,
            options: *mut rbd_config_option_t,
            max_options: *mut c_int,
        ) -> c_int;
        pub fn rbd_config_image_list_cleanup(options: *mut rbd_config_option_t, max_options: c_int);
    }

    /// One effective configuration option of an image (`rbd_config_option_t`; `source` is
    /// the `rbd_config_source_t` enum: config, pool or image).
    #[repr(C)]
    pub struct rbd_config_option_t {
        pub name: *mut c_char,
        pub value: *mut c_char,
        pub source: c_int,
    }
}

/// The gateway's RADOS client, when the daemon runs in a gateway group.
static SHARED: std::sync::OnceLock<Arc<rados::Cluster>> = std::sync::OnceLock::new();
/// Image operations refused because this process's RADOS client is blocklisted.
static FENCED_OPS: AtomicU64 = AtomicU64::new(0);

/// Opens every later image on `cluster` (one client instance for the whole process: the one
/// a gateway group fences). Set once; a second call is refused.
pub fn share_cluster(cluster: Arc<rados::Cluster>) -> Result<(), Arc<rados::Cluster>> {
    SHARED.set(cluster)
}

/// The client [`share_cluster`] registered (a gateway group's reservation objects live on it
/// too).
pub fn shared_cluster() -> Option<Arc<rados::Cluster>> {
    SHARED.get().cloned()
}

/// Image operations (reads, writes, flushes) refused with `-ESHUTDOWN` (blocklisted).
pub fn fenced_ops() -> u64 {
    FENCED_OPS.load(Ordering::Relaxed)
}

/// librbd refuses discard / write-zeroes lengths above `INT_MAX` (its C return type is `int`);
/// larger ranges go in pieces of this size (a multiple of every block size).
const ZERO_CHUNK: u64 = 1 << 30;

/// Marks the image header as changed; set from librbd's watch callback.
#[derive(Debug, Default)]
struct HeaderWatch {
    changed: AtomicBool,
}

/// The opened image and the cluster connection behind it.
pub struct RbdBackend {
    spec: String,
    cluster: ffi::rados_t,
    ioctx: ffi::rados_ioctx_t,
    image: ffi::rbd_image_t,
    block_size: u32,
    /// Usable bytes (image size rounded down to the block size), as last read.
    capacity: AtomicU64,
    /// Registered update watch and its callback state (must outlive the registration).
    watch: Option<(u64, Box<HeaderWatch>)>,
    /// librbd's write-back cache is on for this image (`rbd_cache`, read at open).
    cache: bool,
    /// The shared client's ioctx (then `cluster` is null and `ioctx` borrowed from it).
    shared: Option<rados::IoCtx>,
}

// SAFETY: librados cluster handles and librbd image handles are thread-safe for the calls made
// here (librbd serialises internally; concurrent aio submission from several threads is how
// QEMU's and tcmu-runner's RBD drivers use it). The raw pointers are only passed to librbd.
unsafe impl Send for RbdBackend {}
// SAFETY: as above; `&self` methods only call thread-safe librbd functions and atomics.
unsafe impl Sync for RbdBackend {}

impl std::fmt::Debug for RbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdBackend")
            .field("image", &self.spec)
            .field("capacity", &self.capacity.load(Ordering::Relaxed))
            .field("watching", &self.watch.is_some())
            .finish_non_exhaustive()
    }
}

fn errno_result(r: c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::from_raw_os_error(-r))
    } else {
        Ok(())
    }
}

fn c_string(spec: &str, what: &'static str, value: &str) -> Result<CString, BackendError> {
    CString::new(value).map_err(|_| BackendError::Rbd {
        spec: spec.to_string(),
        step: what,
        source: io::Error::from_raw_os_error(libc::EINVAL),
    })
}

/// librbd's update-watch callback: only flag the change (see the module comment).
unsafe extern "C" fn on_header_update(arg: *mut c_void) {
    // SAFETY: `arg` is the `HeaderWatch` boxed in `RbdBackend::watch`, which is unregistered
    // (rbd_update_unwatch waits for running callbacks) before the box is freed.
    let watch = unsafe { &*(arg as *const HeaderWatch) };
    watch.changed.store(true, Ordering::Release);
}

impl RbdBackend {
    /// Connects to the cluster and opens the image. Blocks (network round trips); librados
    /// gives up after `client_mount_timeout` (set to 30 s here unless ceph.conf says otherwise).
    pub fn open(target: &RbdTarget, block_size: u32) -> Result<Self, BackendError> {
        let spec = target.spec();
        let fail = |step: &'static str, r: c_int| BackendError::Rbd {
            spec: spec.clone(),
            step,
            source: io::Error::from_raw_os_error(-r),
        };
        let id = match &target.client_id {
            Some(id) => Some(c_string(
                &spec,
                "client id",
                id.strip_prefix("client.").unwrap_or(id),
            )?),
            None => None,
        };
        let conf = match &target.ceph_conf {
            Some(p) => Some(c_string(&spec, "ceph_conf path", &p.to_string_lossy())?),
            None => None,
        };
        let pool = c_string(&spec, "pool name", &target.pool)?;
        let nspace = match &target.namespace {
            Some(n) => Some(c_string(&spec, "namespace", n)?),
            None => None,
        };
        let image_name = c_string(&spec, "image name", &target.image)?;

        let mut backend = RbdBackend {
            spec: spec.clone(),
            cluster: std::ptr::null_mut(),
            ioctx: std::ptr::null_mut(),
            image: std::ptr::null_mut(),
            block_size,
            capacity: AtomicU64::new(0),
            watch: None,
            cache: true,
            shared: None,
        };
        if let Some(cluster) = SHARED.get() {
            let io = cluster
                .ioctx(&target.pool, target.namespace.as_deref())
                .map_err(|e| BackendError::Rbd {
                    spec: spec.clone(),
                    step: "opening the pool on the gateway's RADOS client",
                    source: io::Error::from_raw_os_error(e.errno().unwrap_or(libc::EINVAL)),
                })?;
            backend.ioctx = io.as_raw();
            backend.shared = Some(io);
            return backend.open_image(&spec, &image_name, block_size);
        }
        // From here on, `Drop` releases whatever was created if a step fails.
        // SAFETY: out-pointer to a field of `backend`; `id` is NUL-terminated or null.
        let r = unsafe {
            ffi::rados_create(
                &mut backend.cluster,
                id.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            backend.cluster = std::ptr::null_mut();
            return Err(fail("rados_create", r));
        }
        // A default first, so that a ceph.conf value wins: an unreachable cluster must not
        // hold up the daemon's start for librados' default of 300 s.
        // SAFETY: valid unconnected cluster handle, NUL-terminated strings.
        unsafe {
            ffi::rados_conf_set(
                backend.cluster,
                c"client_mount_timeout".as_ptr(),
                c"30".as_ptr(),
            );
        }
        // SAFETY: as above; a null path means librados' default search.
        let r = unsafe {
            ffi::rados_conf_read_file(
                backend.cluster,
                conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            return Err(fail("reading ceph.conf", r));
        }
        // CEPH_ARGS, like the ceph tools.
        // SAFETY: valid cluster handle; null selects CEPH_ARGS.
        let r = unsafe { ffi::rados_conf_parse_env(backend.cluster, std::ptr::null()) };
        if r < 0 {
            return Err(fail("parsing CEPH_ARGS", r));
        }
        // SAFETY: valid configured cluster handle.
        let r = unsafe { ffi::rados_connect(backend.cluster) };
        if r < 0 {
            return Err(fail("connecting to the cluster", r));
        }
        // SAFETY: connected cluster, NUL-terminated pool name, out-pointer to a field.
        let r =
            unsafe { ffi::rados_ioctx_create(backend.cluster, pool.as_ptr(), &mut backend.ioctx) };
        if r < 0 {
            backend.ioctx = std::ptr::null_mut();
            return Err(fail("opening the pool", r));
        }
        if let Some(n) = &nspace {
            // SAFETY: valid ioctx, NUL-terminated namespace.
            unsafe { ffi::rados_ioctx_set_namespace(backend.ioctx, n.as_ptr()) };
        }
        backend.open_image(&spec, &image_name, block_size)
    }

    /// Opens the image on `self.ioctx` and reads what the backend needs of it.
    fn open_image(
        self,
        spec: &str,
        image_name: &CString,
        block_size: u32,
    ) -> Result<Self, BackendError> {
        let spec = spec.to_owned();
        let fail = |step: &'static str, r: c_int| BackendError::Rbd {
            spec: spec.clone(),
            step,
            source: io::Error::from_raw_os_error(-r),
        };
        let mut backend = self;
        // SAFETY: valid ioctx, NUL-terminated image name, out-pointer to a field, no snapshot.
        let r = unsafe {
            ffi::rbd_open(
                backend.ioctx,
                image_name.as_ptr(),
                &mut backend.image,
                std::ptr::null(),
            )
        };
        if r < 0 {
            backend.image = std::ptr::null_mut();
            return Err(fail("opening the image", r));
        }
        let size = backend.read_size().map_err(|source| BackendError::Rbd {
            spec: spec.clone(),
            step: "reading the image size",
            source,
        })?;
        let capacity = size & !(u64::from(block_size) - 1);
        if capacity == 0 {
            return Err(BackendError::RbdTooSmall {
                spec,
                size,
                block_size,
            });
        }
        backend.capacity.store(capacity, Ordering::Release);

        let watch = Box::new(HeaderWatch::default());
        let mut handle = 0u64;
        // SAFETY: open image; the callback argument is the boxed `HeaderWatch`, kept in
        // `backend.watch` until `rbd_update_unwatch` in `Drop`.
        let r = unsafe {
            ffi::rbd_update_watch(
                backend.image,
                &mut handle,
                on_header_update,
                &*watch as *const HeaderWatch as *mut c_void,
            )
        };
        if r < 0 {
            // Still correct without it: every periodic check then re-reads the size.
            tracing::warn!(image = %spec, errno = -r, "rbd_update_watch failed; polling the image size");
        } else {
            backend.watch = Some((handle, watch));
        }
        backend.cache = match backend.config_value("rbd_cache") {
            Some(v) => v != "false",
            None => {
                tracing::warn!(image = %spec, "cannot read the image's rbd_cache setting; reporting a volatile write cache");
                true
            }
        };
        tracing::debug!(image = %spec, size, capacity, cache = backend.cache, "opened RBD image");
        Ok(backend)
    }

    /// The image's effective value of librbd option `name` (ceph.conf, monitor
    /// configuration, pool or image override, as librbd applies them), or `None` when it
    /// cannot be read.
    fn config_value(&self, name: &str) -> Option<String> {
        let mut count: c_int = 0;
        // SAFETY: open image; with a count of 0 librbd only reports how many options there
        // are (-ERANGE) and writes nothing through the null array.
        let r = unsafe { ffi::rbd_config_image_list(self.image, std::ptr::null_mut(), &mut count) };
        if r != -libc::ERANGE || count <= 0 {
            return None;
        }
        let mut options: Vec<ffi::rbd_config_option_t> = (0..count)
            .map(|_| ffi::rbd_config_option_t {
                name: std::ptr::null_mut(),
                value: std::ptr::null_mut(),
                source: 0,
            })
            .collect();
        // SAFETY: `options` has room for `count` entries, which librbd fills (allocating
        // their strings) and updates `count` to the number written.
        let r = unsafe { ffi::rbd_config_image_list(self.image, options.as_mut_ptr(), &mut count) };
        if r < 0 {
            return None;
        }
        let filled = usize::try_from(count).unwrap_or(0).min(options.len());
        let value = options[..filled].iter().find_map(|o| {
            // SAFETY: librbd filled `name` and `value` with NUL-terminated strings, which
            // live until the cleanup call below.
            let (n, v) = unsafe {
                (
                    std::ffi::CStr::from_ptr(o.name),
                    std::ffi::CStr::from_ptr(o.value),
                )
            };
            (n.to_bytes() == name.as_bytes()).then(|| v.to_string_lossy().into_owned())
        });
        // SAFETY: the entries librbd filled, with the count it reported.
        unsafe { ffi::rbd_config_image_list_cleanup(options.as_mut_ptr(), count) };
        value
    }

    fn read_size(&self) -> io::Result<u64> {
        let mut size = 0u64;
        // SAFETY: open image handle, out-pointer to a local.
        errno_result(unsafe { ffi::rbd_get_size(self.image, &mut size) })?;
        Ok(size)
    }

    /// Zeroes `[offset, offset + len)`: whole RADOS objects are deallocated, partial ones
    /// zero-filled (librbd's write-zeroes without the thick-provision flag).
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(offset, len, self.capacity())?;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZERO_CHUNK);
            // SAFETY: open image handle; no buffers involved.
            let r = unsafe { ffi::rbd_write_zeroes(self.image, offset + done, n as usize, 0, 0) };
            if r < 0 {
                return Err(io::Error::from_raw_os_error(-r as i32));
            }
            done += n;
        }
        Ok(())
    }
}

/// One NVMe command in librbd's hands: one or two aio completions (FUA: write + flush) that
/// together deliver one result to the reactor.
struct Command {
    tag: u64,
    sink: Arc<ExternalCompletions>,
    /// The result reported when every part succeeded: the byte count for reads and writes
    /// (what io_uring would report), 0 for a flush.
    success: i32,
    /// Reads: librbd's return value must be exactly this many bytes.
    expect_bytes: Option<isize>,
    parts_left: AtomicU32,
    /// First failure (-errno) among the parts; 0 = none.
    error: AtomicI32,
}

impl Command {
    /// Accounts one part's outcome; the last part delivers the command's result.
    fn part_done(&self, result: i32) {
        if result < 0 {
            let _ = self
                .error
                .compare_exchange(0, result, Ordering::AcqRel, Ordering::Acquire);
        }
        if self.parts_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let error = self.error.load(Ordering::Acquire);
            self.sink
                .complete(self.tag, if error < 0 { error } else { self.success });
        }
    }
}

/// librbd's aio callback (runs on a librbd thread).
unsafe extern "C" fn on_aio_complete(c: ffi::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `c` is the completion librbd is reporting; it is released exactly once, here.
    let ret = unsafe {
        let ret = ffi::rbd_aio_get_return_value(c);
        ffi::rbd_aio_release(c);
        ret
    };
    // SAFETY: `arg` is one `Arc<Command>` reference leaked with `Arc::into_raw` for this
    // completion in `submit_part`; librbd calls back exactly once per completion.
    let command = unsafe { Arc::from_raw(arg as *const Command) };
    if ret == -(libc::ESHUTDOWN as isize) {
        // Fenced: the gateway group blocklisted this client; the OSDs refused the op.
        if FENCED_OPS.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::error!("RBD operation refused: this gateway's RADOS client is blocklisted (fenced); nothing more reaches the image");
        }
    }
    let result = match command.expect_bytes {
        _ if ret < 0 => ret.max(i32::MIN as isize) as i32,
        Some(n) if ret != n => {
            tracing::error!(ret, expected = n, "short RBD read");
            -libc::EIO
        }
        _ => 0,
    };
    command.part_done(result);
}

/// Which librbd call a part is.
#[derive(Clone, Copy)]
enum Part {
    Read {
        offset: u64,
        buf: *mut u8,
        len: usize,
    },
    Write {
        offset: u64,
        buf: *const u8,
        len: usize,
    },
    Flush,
    Zeroes {
        offset: u64,
        len: usize,
    },
}

impl RbdBackend {
    /// Hands `parts` of one command to librbd, in order; their completions together deliver
    /// `success` (or the first error) for `tag`.
    fn submit_parts(
        &self,
        tag: u64,
        sink: &Arc<ExternalCompletions>,
        parts: &[Part],
        success: i32,
        expect_bytes: Option<isize>,
    ) -> Started {
        let command = Arc::new(Command {
            tag,
            sink: Arc::clone(sink),
            success,
            expect_bytes,
            parts_left: AtomicU32::new(parts.len() as u32),
            error: AtomicI32::new(0),
        });
        sink.begin();
        for (i, &part) in parts.iter().enumerate() {
            if let Err(r) = self.submit_part(&command, part) {
                if i == 0 {
                    // Nothing reached librbd: fail the command now, nothing to wait for.
                    sink.abandon();
                    return Started::Done(Err(io::Error::from_raw_os_error(-r)));
                }
                // Earlier parts are in flight: this one and every later one count as failed,
                // and the last completion to arrive delivers the error.
                for _ in i..parts.len() {
                    command.part_done(r);
                }
                break;
            }
        }
        Started::Submitted
    }

    /// Hands one part of `command` to librbd. On a synchronous refusal no callback will come:
    /// the part is accounted here with the error (so a FUA flush that cannot be queued still
    /// fails the command once its write completes).
    fn submit_part(&self, command: &Arc<Command>, part: Part) -> Result<(), i32> {
        let arg = Arc::into_raw(Arc::clone(command)) as *mut c_void;
        let mut c: ffi::rbd_completion_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the callback and its argument stay valid until the
        // callback runs (the argument is a leaked Arc reference).
        let r = unsafe { ffi::rbd_aio_create_completion(arg, on_aio_complete, &mut c) };
        if r < 0 {
            // SAFETY: reclaims the reference leaked just above; librbd never saw it.
            drop(unsafe { Arc::from_raw(arg as *const Command) });
            return Err(r);
        }
        // SAFETY: the buffers are the transport's per-command buffer, which stays allocated and
        // untouched until this command's completion has been reaped (backend contract; the reactor
        // counts the op in `ExternalCompletions::pending` until then). Lengths are the
        // buffer's own.
        let r = unsafe {
            match part {
                Part::Read { offset, buf, len } => {
                    ffi::rbd_aio_read(self.image, offset, len, buf.cast::<c_char>(), c)
                }
                Part::Write { offset, buf, len } => {
                    ffi::rbd_aio_write(self.image, offset, len, buf.cast::<c_char>(), c)
                }
                Part::Flush => ffi::rbd_aio_flush(self.image, c),
                Part::Zeroes { offset, len } => {
                    ffi::rbd_aio_write_zeroes(self.image, offset, len, c, 0, 0)
                }
            }
        };
        if r < 0 {
            // SAFETY: librbd refused the op, so it will not call back: release the completion
            // and reclaim the reference given to it.
            unsafe {
                ffi::rbd_aio_release(c);
                drop(Arc::from_raw(arg as *const Command));
            }
            return Err(r);
        }
        Ok(())
    }
}

impl RbdBackend {
    fn run_sync(&self, request: BackendRequest, buf: &mut [u8]) -> io::Result<()> {
        let len = buf.len();
        let expect = |r: isize| match r {
            r if r < 0 => Err(io::Error::from_raw_os_error(-r as i32)),
            r if r as usize != len => Err(io::Error::from_raw_os_error(libc::EIO)),
            _ => Ok(()),
        };
        match request {
            BackendRequest::Read { offset } => {
                check_range(offset, len as u64, self.capacity())?;
                // SAFETY: open image; `buf` is exclusively borrowed for the call's duration.
                expect(unsafe { ffi::rbd_read(self.image, offset, len, buf.as_mut_ptr().cast()) })
            }
            BackendRequest::Write { offset, fua } => {
                check_range(offset, len as u64, self.capacity())?;
                // SAFETY: open image; `buf` is borrowed for the call's duration.
                expect(unsafe { ffi::rbd_write(self.image, offset, len, buf.as_ptr().cast()) })?;
                if fua {
                    // SAFETY: open image.
                    errno_result(unsafe { ffi::rbd_flush(self.image) })?;
                }
                Ok(())
            }
            // SAFETY: open image.
            BackendRequest::Flush => errno_result(unsafe { ffi::rbd_flush(self.image) }),
        }
    }
}

impl Backend for RbdBackend {
    fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Acquire)
    }

    fn kind(&self) -> &'static str {
        "rbd"
    }

    /// `rbd_aio_write_zeroes` for both (see the module comment): zeroes guaranteed, whole
    /// objects deallocated. Its limits are librbd's business (it splits by object). A
    /// volatile cache when librbd's write-back cache is on (`rbd_cache`, the default):
    /// writes complete from client memory until `rbd_aio_flush`. Off, a write completes when
    /// the OSDs have it on stable storage.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            volatile_cache: self.cache,
            ..Capabilities::ZEROING
        }
    }

    fn start(
        &self,
        request: BackendRequest,
        buf: &mut [u8],
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Started {
        if buf.len() > i32::MAX as usize {
            return Started::Done(Err(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let Some(sink) = io.external() else {
            // A submitter without a completion channel (the core's Compare reads through
            // one): do it synchronously with librbd's blocking calls.
            return Started::Done(self.run_sync(request, buf));
        };
        let len = buf.len();
        // At most two parts: the data op, then (FUA) a flush ordered after it.
        let (parts, count, success, expect_bytes) = match request {
            BackendRequest::Read { offset } => {
                if let Err(e) = check_range(offset, len as u64, self.capacity()) {
                    return Started::Done(Err(e));
                }
                let read = Part::Read {
                    offset,
                    buf: buf.as_mut_ptr(),
                    len,
                };
                ([read, Part::Flush], 1, len as i32, Some(len as isize))
            }
            BackendRequest::Write { offset, fua } => {
                if let Err(e) = check_range(offset, len as u64, self.capacity()) {
                    return Started::Done(Err(e));
                }
                let write = Part::Write {
                    offset,
                    buf: buf.as_ptr(),
                    len,
                };
                (
                    [write, Part::Flush],
                    if fua { 2 } else { 1 },
                    len as i32,
                    None,
                )
            }
            BackendRequest::Flush => ([Part::Flush, Part::Flush], 1, 0, None),
        };
        let parts = &parts[..count];
        let sink = Arc::clone(sink);
        self.submit_parts(tag, &sink, parts, success, expect_bytes)
    }

    /// Deallocate and Write Zeroes both as `rbd_aio_write_zeroes` (see the module comment),
    /// every range in pieces of at most [`ZERO_CHUNK`], one completion for all of them.
    fn start_zeroes(
        &self,
        ranges: &[(u64, u64)],
        _what: Zeroing,
        tag: u64,
        io: &mut dyn IoSubmit,
    ) -> Started {
        for &(offset, len) in ranges {
            if let Err(e) = check_range(offset, len, self.capacity()) {
                return Started::Done(Err(e));
            }
        }
        // Without a completion channel (tests, tools): synchronously, as `start` does.
        let Some(sink) = io.external().map(Arc::clone) else {
            return Started::Done(ranges.iter().try_for_each(|&(o, l)| self.zero_range(o, l)));
        };
        let mut parts = Vec::new();
        for &(offset, len) in ranges {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(ZERO_CHUNK);
                parts.push(Part::Zeroes {
                    offset: offset + done,
                    len: n as usize,
                });
                done += n;
            }
        }
        if parts.is_empty() {
            return Started::Done(Ok(()));
        }
        self.submit_parts(tag, &sink, &parts, 0, None)
    }

    fn refresh_capacity(&self) -> Option<u64> {
        if let Some((_, watch)) = &self.watch {
            if !watch.changed.swap(false, Ordering::AcqRel) {
                return None;
            }
        }
        let size = match self.read_size() {
            Ok(size) => size,
            Err(e) => {
                tracing::warn!(image = %self.spec, error = %e, "cannot read the RBD image size");
                return None;
            }
        };
        let capacity = size & !(u64::from(self.block_size) - 1);
        let old = self.capacity.swap(capacity, Ordering::AcqRel);
        (capacity != old).then(|| {
            tracing::info!(image = %self.spec, old, new = capacity, "RBD image resized");
            capacity
        })
    }
}

impl Drop for RbdBackend {
    fn drop(&mut self) {
        // Order: stop callbacks into `watch`, close the image (librbd waits for its in-flight
        // aio), then the pool and cluster handles.
        if let Some((handle, _watch)) = &self.watch {
            // SAFETY: open image, a handle returned by rbd_update_watch.
            unsafe { ffi::rbd_update_unwatch(self.image, *handle) };
        }
        if !self.image.is_null() {
            // SAFETY: open image, closed once.
            unsafe { ffi::rbd_close(self.image) };
        }
        if !self.ioctx.is_null() && self.shared.is_none() {
            // SAFETY: created ioctx, destroyed once, after its image is closed (a shared
            // client's ioctx is destroyed by its `rados::IoCtx` when the field drops, after
            // this).
            unsafe { ffi::rados_ioctx_destroy(self.ioctx) };
        }
        if !self.cluster.is_null() {
            // SAFETY: created cluster handle, shut down once, after its ioctx.
            unsafe { ffi::rados_shutdown(self.cluster) };
        }
    }
}

#[cfg(test)]
mod tests;
