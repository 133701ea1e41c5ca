//! The librados C API subset nvmfd's gateway groups use, declared by hand from Debian 12's
//! `rados/librados.h` (librados 2, Ceph 16 Pacific). Every function here exists with this
//! signature since Ceph 15; `rados_blocklist_add` is Pacific's name (the deprecated
//! `rados_blacklist_add` alias is declared too for completeness, but nothing calls it).
//! All handles are opaque pointers.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uchar, c_void};

pub type rados_t = *mut c_void;
pub type rados_ioctx_t = *mut c_void;
pub type rados_write_op_t = *mut c_void;
pub type rados_read_op_t = *mut c_void;
pub type rados_omap_iter_t = *mut c_void;

/// `rados_watchcb2_t`: a notify arrived on a watched object.
pub type rados_watchcb2_t = unsafe extern "C" fn(
    arg: *mut c_void,
    notify_id: u64,
    handle: u64,
    notifier_id: u64,
    data: *mut c_void,
    data_len: usize,
);
/// `rados_watcherrcb_t`: the watch was lost (disconnect, blocklist, timeout).
pub type rados_watcherrcb_t = unsafe extern "C" fn(pre: *mut c_void, cookie: u64, err: c_int);

/// `LIBRADOS_LOCK_FLAG_RENEW` (= `MAY_RENEW`): lock, or renew a lock already held with the
/// same cookie.
pub const LIBRADOS_LOCK_FLAG_RENEW: u8 = 1 << 0;
/// `LIBRADOS_LOCK_FLAG_MUST_RENEW`: renew only; fail with -ENOENT if the lock is not held.
pub const LIBRADOS_LOCK_FLAG_MUST_RENEW: u8 = 1 << 1;
/// `rados_write_op_create` modes.
pub const LIBRADOS_CREATE_EXCLUSIVE: c_int = 1;
pub const LIBRADOS_CREATE_IDEMPOTENT: c_int = 0;
/// `rados_*_op_operate` flags.
pub const LIBRADOS_OPERATION_NOFLAG: c_int = 0;

/// `struct timeval` as librados takes it for lock durations.
pub type timeval = libc::timeval;

#[link(name = "rados")]
extern "C" {
    // Cluster handle.
    pub fn rados_create(cluster: *mut rados_t, id: *const c_char) -> c_int;
    pub fn rados_create2(
        cluster: *mut rados_t,
        clustername: *const c_char,
        name: *const c_char,
        flags: u64,
    ) -> c_int;
    pub fn rados_conf_read_file(cluster: rados_t, path: *const c_char) -> c_int;
    pub fn rados_conf_parse_env(cluster: rados_t, var: *const c_char) -> c_int;
    pub fn rados_conf_set(cluster: rados_t, option: *const c_char, value: *const c_char) -> c_int;
    pub fn rados_connect(cluster: rados_t) -> c_int;
    pub fn rados_shutdown(cluster: rados_t);
    pub fn rados_getaddrs(cluster: rados_t, addrs: *mut *mut c_char) -> c_int;
    pub fn rados_get_instance_id(cluster: rados_t) -> u64;
    pub fn rados_wait_for_latest_osdmap(cluster: rados_t) -> c_int;
    pub fn rados_blocklist_add(
        cluster: rados_t,
        client_address: *mut c_char,
        expire_seconds: u32,
    ) -> c_int;
    pub fn rados_blacklist_add(
        cluster: rados_t,
        client_address: *mut c_char,
        expire_seconds: u32,
    ) -> c_int;
    pub fn rados_buffer_free(buf: *mut c_char);

    // I/O context.
    pub fn rados_ioctx_create(
        cluster: rados_t,
        pool_name: *const c_char,
        ioctx: *mut rados_ioctx_t,
    ) -> c_int;
    pub fn rados_ioctx_set_namespace(io: rados_ioctx_t, nspace: *const c_char);
    pub fn rados_ioctx_destroy(io: rados_ioctx_t);
    pub fn rados_get_last_version(io: rados_ioctx_t) -> u64;
    pub fn rados_stat(
        io: rados_ioctx_t,
        o: *const c_char,
        psize: *mut u64,
        pmtime: *mut libc::time_t,
    ) -> c_int;
    pub fn rados_write_full(
        io: rados_ioctx_t,
        oid: *const c_char,
        buf: *const c_char,
        len: usize,
    ) -> c_int;
    pub fn rados_read(
        io: rados_ioctx_t,
        oid: *const c_char,
        buf: *mut c_char,
        len: usize,
        off: u64,
    ) -> c_int;
    pub fn rados_remove(io: rados_ioctx_t, oid: *const c_char) -> c_int;

    // Advisory locks (cls_lock).
    pub fn rados_lock_exclusive(
        io: rados_ioctx_t,
        oid: *const c_char,
        name: *const c_char,
        cookie: *const c_char,
        desc: *const c_char,
        duration: *mut timeval,
        flags: u8,
    ) -> c_int;
    pub fn rados_unlock(
        io: rados_ioctx_t,
        oid: *const c_char,
        name: *const c_char,
        cookie: *const c_char,
    ) -> c_int;
    pub fn rados_list_lockers(
        io: rados_ioctx_t,
        oid: *const c_char,
        name: *const c_char,
        exclusive: *mut c_int,
        tag: *mut c_char,
        tag_len: *mut usize,
        clients: *mut c_char,
        clients_len: *mut usize,
        cookies: *mut c_char,
        cookies_len: *mut usize,
        addrs: *mut c_char,
        addrs_len: *mut usize,
    ) -> isize;
    pub fn rados_break_lock(
        io: rados_ioctx_t,
        oid: *const c_char,
        name: *const c_char,
        client: *const c_char,
        cookie: *const c_char,
    ) -> c_int;

    // Watch / notify.
    pub fn rados_watch2(
        io: rados_ioctx_t,
        o: *const c_char,
        cookie: *mut u64,
        watchcb: rados_watchcb2_t,
        watcherrcb: rados_watcherrcb_t,
        arg: *mut c_void,
    ) -> c_int;
    pub fn rados_watch_check(io: rados_ioctx_t, cookie: u64) -> c_int;
    pub fn rados_unwatch2(io: rados_ioctx_t, cookie: u64) -> c_int;
    pub fn rados_notify2(
        io: rados_ioctx_t,
        o: *const c_char,
        buf: *const c_char,
        buf_len: c_int,
        timeout_ms: u64,
        reply_buffer: *mut *mut c_char,
        reply_buffer_len: *mut usize,
    ) -> c_int;
    pub fn rados_notify_ack(
        io: rados_ioctx_t,
        o: *const c_char,
        notify_id: u64,
        cookie: u64,
        buf: *const c_char,
        buf_len: c_int,
    ) -> c_int;
    pub fn rados_watch_flush(cluster: rados_t) -> c_int;

    // Compound write operations.
    pub fn rados_create_write_op() -> rados_write_op_t;
    pub fn rados_release_write_op(write_op: rados_write_op_t);
    pub fn rados_write_op_create(
        write_op: rados_write_op_t,
        exclusive: c_int,
        category: *const c_char,
    );
    pub fn rados_write_op_assert_version(write_op: rados_write_op_t, ver: u64);
    pub fn rados_write_op_assert_exists(write_op: rados_write_op_t);
    pub fn rados_write_op_omap_set(
        write_op: rados_write_op_t,
        keys: *const *const c_char,
        vals: *const *const c_char,
        lens: *const usize,
        num: usize,
    );
    pub fn rados_write_op_omap_set2(
        write_op: rados_write_op_t,
        keys: *const *const c_char,
        vals: *const *const c_char,
        key_lens: *const usize,
        val_lens: *const usize,
        num: usize,
    );
    pub fn rados_write_op_omap_rm_keys(
        write_op: rados_write_op_t,
        keys: *const *const c_char,
        keys_len: usize,
    );
    pub fn rados_write_op_omap_rm_keys2(
        write_op: rados_write_op_t,
        keys: *const *const c_char,
        key_lens: *const usize,
        keys_len: usize,
    );
    pub fn rados_write_op_omap_clear(write_op: rados_write_op_t);
    pub fn rados_write_op_operate(
        write_op: rados_write_op_t,
        io: rados_ioctx_t,
        oid: *const c_char,
        mtime: *mut libc::time_t,
        flags: c_int,
    ) -> c_int;

    // Compound read operations.
    pub fn rados_create_read_op() -> rados_read_op_t;
    pub fn rados_release_read_op(read_op: rados_read_op_t);
    pub fn rados_read_op_assert_version(read_op: rados_read_op_t, ver: u64);
    pub fn rados_read_op_assert_exists(read_op: rados_read_op_t);
    pub fn rados_read_op_omap_get_vals2(
        read_op: rados_read_op_t,
        start_after: *const c_char,
        filter_prefix: *const c_char,
        max_return: u64,
        iter: *mut rados_omap_iter_t,
        pmore: *mut c_uchar,
        prval: *mut c_int,
    );
    pub fn rados_read_op_omap_get_vals_by_keys2(
        read_op: rados_read_op_t,
        keys: *const *const c_char,
        num_keys: usize,
        key_lens: *const usize,
        iter: *mut rados_omap_iter_t,
        prval: *mut c_int,
    );
    pub fn rados_read_op_operate(
        read_op: rados_read_op_t,
        io: rados_ioctx_t,
        oid: *const c_char,
        flags: c_int,
    ) -> c_int;
    pub fn rados_omap_get_next2(
        iter: rados_omap_iter_t,
        key: *mut *mut c_char,
        val: *mut *mut c_char,
        key_len: *mut usize,
        val_len: *mut usize,
    ) -> c_int;
    pub fn rados_omap_iter_size(iter: rados_omap_iter_t) -> u32;
    pub fn rados_omap_get_end(iter: rados_omap_iter_t);
}

#[link(name = "rados")]
extern "C" {
    pub fn rados_lock_shared(
        io: rados_ioctx_t,
        oid: *const c_char,
        name: *const c_char,
        cookie: *const c_char,
        tag: *const c_char,
        desc: *const c_char,
        duration: *mut timeval,
        flags: u8,
    ) -> c_int;
}
