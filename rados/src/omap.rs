//! One object's omap as a versioned key/value record: read every key with the object's
//! version in one read operation, and replace every key in one write operation that applies
//! only if the object is still at the version read (compare-and-set; a gateway group's shared
//! reservation state is kept this way).
//!
//! The version comes from `rados_get_last_version`, which librados keeps per I/O context:
//! callers that share an [`IoCtx`] between threads serialise these calls.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uchar};

use super::{check, cstr, ffi, Error, IoCtx, Result};

/// Keys fetched per omap read round (librados returns a "more" flag beyond it).
const PAGE: u64 = 1024;

/// What [`IoCtx::omap_replace`] expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No object yet: create it (`-EEXIST` if another writer created it meanwhile).
    Absent,
    /// The object at this version (`-ERANGE` / `-EOVERFLOW` if it moved on).
    Version(u64),
}

impl Error {
    /// A compare-and-set lost to another writer (the object is not at the version or state
    /// expected): read again and retry.
    pub fn is_stale(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::ERANGE | libc::EOVERFLOW | libc::EEXIST | libc::ECANCELED)
        )
    }
}

/// Frees a read operation on every path.
struct ReadOp(ffi::rados_read_op_t);

impl Drop for ReadOp {
    fn drop(&mut self) {
        // SAFETY: created by rados_create_read_op, released once.
        unsafe { ffi::rados_release_read_op(self.0) };
    }
}

/// Frees a write operation on every path.
struct WriteOp(ffi::rados_write_op_t);

impl Drop for WriteOp {
    fn drop(&mut self) {
        // SAFETY: created by rados_create_write_op, released once.
        unsafe { ffi::rados_release_write_op(self.0) };
    }
}

/// Ends an omap iterator on every path.
struct Iter(ffi::rados_omap_iter_t);

impl Drop for Iter {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: an iterator librados handed out, ended once.
            unsafe { ffi::rados_omap_get_end(self.0) };
        }
    }
}

impl IoCtx {
    /// Every omap key/value of `oid` and the object's version; an absent object is an empty
    /// map at version 0. Keys are read in pages; a page after the first asserts the version
    /// of the first, so the whole map is one version's (`-ERANGE` otherwise: read again).
    pub fn omap_get_all(&self, oid: &str) -> Result<(BTreeMap<String, Vec<u8>>, u64)> {
        let o = cstr("object name", oid)?;
        let mut map = BTreeMap::new();
        let mut version = 0u64;
        let mut after = cstr("omap key", "")?;
        loop {
            // SAFETY: creates an operation released by ReadOp's drop.
            let op = ReadOp(unsafe { ffi::rados_create_read_op() });
            if version != 0 {
                // SAFETY: valid op.
                unsafe { ffi::rados_read_op_assert_version(op.0, version) };
            }
            let mut iter = Iter(std::ptr::null_mut());
            let (mut more, mut prval): (c_uchar, c_int) = (0, 0);
            // SAFETY: valid op; `after` and the out-pointers outlive the operate call below
            // (librados fills them during it); a null filter prefix means none.
            unsafe {
                ffi::rados_read_op_omap_get_vals2(
                    op.0,
                    after.as_ptr(),
                    std::ptr::null(),
                    PAGE,
                    &mut iter.0,
                    &mut more,
                    &mut prval,
                )
            };
            // SAFETY: valid op and ioctx, NUL-terminated name.
            let r = unsafe {
                ffi::rados_read_op_operate(
                    op.0,
                    self.handle,
                    o.as_ptr(),
                    ffi::LIBRADOS_OPERATION_NOFLAG,
                )
            };
            if r == -libc::ENOENT && version == 0 {
                return Ok((BTreeMap::new(), 0));
            }
            check("reading the omap", r)?;
            check("reading the omap", prval)?;
            if version == 0 {
                version = self.last_version();
            }
            let mut last = None;
            loop {
                let (mut k, mut v): (*mut c_char, *mut c_char) =
                    (std::ptr::null_mut(), std::ptr::null_mut());
                let (mut klen, mut vlen) = (0usize, 0usize);
                // SAFETY: a live iterator; the out-pointers are locals.
                let r = unsafe {
                    ffi::rados_omap_get_next2(iter.0, &mut k, &mut v, &mut klen, &mut vlen)
                };
                check("reading the omap", r)?;
                if k.is_null() {
                    break;
                }
                // SAFETY: librados returns `klen` key bytes and `vlen` value bytes, valid
                // until the next get_next2 on this iterator; both are copied at once.
                let (key, val) = unsafe {
                    (
                        std::slice::from_raw_parts(k as *const u8, klen).to_vec(),
                        if vlen == 0 {
                            Vec::new()
                        } else {
                            std::slice::from_raw_parts(v as *const u8, vlen).to_vec()
                        },
                    )
                };
                let key = String::from_utf8(key).map_err(|_| Error::Malformed {
                    op: "reading the omap",
                    detail: "a key that is not UTF-8".into(),
                })?;
                last = Some(key.clone());
                map.insert(key, val);
            }
            match last {
                Some(key) if more != 0 => after = cstr("omap key", &key)?,
                _ => return Ok((map, version)),
            }
        }
    }

    /// Replaces the omap of `oid` by `entries` (every other key removed) if the object is as
    /// `expect`ed, in one write operation; the object's new version. A lost race fails with
    /// an error whose [`Error::is_stale`] is true.
    pub fn omap_replace(
        &self,
        oid: &str,
        expect: Expect,
        entries: &BTreeMap<String, Vec<u8>>,
    ) -> Result<u64> {
        let o = cstr("object name", oid)?;
        // SAFETY: creates an operation released by WriteOp's drop.
        let op = WriteOp(unsafe { ffi::rados_create_write_op() });
        match expect {
            // SAFETY: valid op; a null category is the default.
            Expect::Absent => unsafe {
                ffi::rados_write_op_create(op.0, ffi::LIBRADOS_CREATE_EXCLUSIVE, std::ptr::null())
            },
            // SAFETY: valid op.
            Expect::Version(v) => unsafe { ffi::rados_write_op_assert_version(op.0, v) },
        }
        // SAFETY: valid op.
        unsafe { ffi::rados_write_op_omap_clear(op.0) };
        let keys: Vec<&[u8]> = entries.keys().map(|k| k.as_bytes()).collect();
        let key_ptrs: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr().cast()).collect();
        let key_lens: Vec<usize> = keys.iter().map(|k| k.len()).collect();
        let val_ptrs: Vec<*const c_char> = entries.values().map(|v| v.as_ptr().cast()).collect();
        let val_lens: Vec<usize> = entries.values().map(Vec::len).collect();
        if !entries.is_empty() {
            // SAFETY: valid op; each array has `entries.len()` elements pointing into
            // `entries`, which outlives the operate call below (librados copies at operate).
            unsafe {
                ffi::rados_write_op_omap_set2(
                    op.0,
                    key_ptrs.as_ptr(),
                    val_ptrs.as_ptr(),
                    key_lens.as_ptr(),
                    val_lens.as_ptr(),
                    entries.len(),
                )
            };
        }
        // SAFETY: valid op and ioctx, NUL-terminated name; a null mtime means "now".
        let r = unsafe {
            ffi::rados_write_op_operate(
                op.0,
                self.handle,
                o.as_ptr(),
                std::ptr::null_mut(),
                ffi::LIBRADOS_OPERATION_NOFLAG,
            )
        };
        check("replacing the omap", r)?;
        Ok(self.last_version())
    }

    /// Creates `oid` empty unless it exists (a watch needs the object).
    pub fn create_if_absent(&self, oid: &str) -> Result<()> {
        let o = cstr("object name", oid)?;
        // SAFETY: creates an operation released by WriteOp's drop.
        let op = WriteOp(unsafe { ffi::rados_create_write_op() });
        // SAFETY: valid op; null category.
        unsafe {
            ffi::rados_write_op_create(op.0, ffi::LIBRADOS_CREATE_IDEMPOTENT, std::ptr::null())
        };
        // SAFETY: valid op and ioctx, NUL-terminated name.
        let r = unsafe {
            ffi::rados_write_op_operate(
                op.0,
                self.handle,
                o.as_ptr(),
                std::ptr::null_mut(),
                ffi::LIBRADOS_OPERATION_NOFLAG,
            )
        };
        check("creating the object", r).map(drop)
    }
}
