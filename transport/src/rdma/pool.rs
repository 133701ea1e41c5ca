//! Pinned, pre-registered buffer pools for the RDMA data path.
//!
//! Every buffer the HCA touches comes from a pool that is mapped, locked and registered with
//! `ibv_reg_mr` once, when the first connection on a device appears — never per I/O
//! (interop notes: buffers allocated on demand under memory pressure made large I/O fail in
//! other targets). A pool is a fixed number of equal buffers; running out is back-pressure
//! (the command waits), never an error sent to the host.
//!
//! The accounting (`SlabAccounting`) is separate from the memory and from the registration so
//! that it is testable without an RDMA device.

use std::cell::RefCell;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::rc::Rc;

use nix::sys::mman::{self, MapFlags, ProtFlags};
use storage::fixedbuf::{BufferOwner, BufferUnit};
use thiserror::Error;

use super::verbs::{MemoryRegion, ProtectionDomain, VerbsError};

/// Keyed SGL data blocks carry a 24-bit length (NVMe Base 2.0 §4.3.2.1.4, Figure 120), so no
/// single RDMA transfer — and no data buffer — is larger than this.
pub const MAX_BUFFER_SIZE: usize = (1 << 24) - 1;
/// Upper bound for one pool's mapping; keeps a bad parameter from pinning all of RAM.
pub const MAX_POOL_BYTES: usize = 4 << 30;
/// Upper bound on buffers per pool (the accounting keeps one word per buffer).
pub const MAX_BUFFERS: usize = 1 << 20;
const PAGE_SIZE: usize = 4096;

#[derive(Debug, Error)]
pub enum PoolError {
    #[error("pool parameter {what} = {value} is out of range")]
    InvalidGeometry { what: &'static str, value: usize },
    #[error("pool of {bytes} bytes exceeds the {max} byte limit")]
    TooLarge { bytes: usize, max: usize },
    #[error("mapping pool memory failed")]
    Map(#[source] nix::Error),
    #[error("locking pool memory failed (RLIMIT_MEMLOCK too low?)")]
    Lock(#[source] nix::Error),
    #[error("registering pool memory failed")]
    Register(#[source] VerbsError),
}

/// Misuse of the accounting; a bug in the caller, reported rather than panicking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum AccountingError {
    #[error("buffer index {0} is out of range")]
    OutOfRange(u32),
    #[error("buffer index {0} released while not in use")]
    NotInUse(u32),
}

/// Free-list accounting for `capacity` equal buffers.
#[derive(Debug)]
pub struct SlabAccounting {
    free: Vec<u32>,
    in_use: Vec<bool>,
}

impl SlabAccounting {
    pub fn new(capacity: u32) -> Self {
        // Lowest indices first, so a lightly loaded pool keeps touching the same pages.
        Self {
            free: (0..capacity).rev().collect(),
            in_use: vec![false; capacity as usize],
        }
    }

    pub fn capacity(&self) -> usize {
        self.in_use.len()
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }

    pub fn alloc(&mut self) -> Option<u32> {
        let idx = self.free.pop()?;
        self.in_use[idx as usize] = true;
        Some(idx)
    }

    /// All `n` or none: a connection either gets its whole receive ring or is refused.
    pub fn alloc_many(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        Some((0..n).filter_map(|_| self.alloc()).collect())
    }

    pub fn release(&mut self, idx: u32) -> Result<(), AccountingError> {
        match self.in_use.get_mut(idx as usize) {
            None => Err(AccountingError::OutOfRange(idx)),
            Some(false) => Err(AccountingError::NotInUse(idx)),
            Some(used) => {
                *used = false;
                self.free.push(idx);
                Ok(())
            }
        }
    }
}

/// Shape of one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolGeometry {
    pub buffer_size: usize,
    /// Alignment of each buffer (power of two ≤ 4096). Data buffers use 4096 (O_DIRECT and
    /// dispatch contract); capsules and responses only need cache-line alignment.
    pub align: usize,
    pub count: usize,
}

impl PoolGeometry {
    /// Distance between buffers: the size rounded up to the alignment.
    pub fn stride(&self) -> usize {
        self.buffer_size.div_ceil(self.align) * self.align
    }

    /// Checks every parameter and returns the mapping size (page multiple).
    pub fn mapping_len(&self) -> Result<usize, PoolError> {
        if self.buffer_size == 0 || self.buffer_size > MAX_BUFFER_SIZE {
            return Err(PoolError::InvalidGeometry {
                what: "buffer_size",
                value: self.buffer_size,
            });
        }
        if !self.align.is_power_of_two() || self.align > PAGE_SIZE {
            return Err(PoolError::InvalidGeometry {
                what: "align",
                value: self.align,
            });
        }
        if self.count == 0 || self.count > MAX_BUFFERS {
            return Err(PoolError::InvalidGeometry {
                what: "count",
                value: self.count,
            });
        }
        let bytes = self
            .stride()
            .checked_mul(self.count)
            .and_then(|b| b.checked_next_multiple_of(PAGE_SIZE))
            .filter(|&b| b <= MAX_POOL_BYTES)
            .ok_or(PoolError::TooLarge {
                bytes: self.stride().saturating_mul(self.count),
                max: MAX_POOL_BYTES,
            })?;
        Ok(bytes)
    }
}

/// Anonymous, page-aligned, mlocked memory. Locking up front means the pages exist and stay
/// resident before the HCA is told about them, so the data path never faults.
#[derive(Debug)]
pub struct PinnedRegion {
    ptr: NonNull<u8>,
    len: usize,
}

impl PinnedRegion {
    pub fn new(len: usize) -> Result<Self, PoolError> {
        let nz = NonZeroUsize::new(len).ok_or(PoolError::InvalidGeometry {
            what: "mapping length",
            value: 0,
        })?;
        // SAFETY: a fresh private anonymous mapping aliases no existing Rust object.
        let ptr = unsafe {
            mman::mmap_anonymous(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .map_err(PoolError::Map)?;
        let region = Self {
            ptr: ptr.cast(),
            len,
        };
        // SAFETY: the range is exactly the mapping created above and still mapped.
        unsafe { mman::mlock(ptr, len) }.map_err(PoolError::Lock)?;
        Ok(region)
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `new` and is unmapped only here; no buffer lease
        // outlives the region (leases hold an `Rc` to the pool that owns it).
        if let Err(e) = unsafe { mman::munmap(self.ptr.cast(), self.len) } {
            tracing::warn!(error = %e, "munmap of RDMA pool failed");
        }
    }
}

struct PoolShared {
    // Field order is drop order: deregister before unmapping.
    mr: Option<MemoryRegion>,
    /// The identity under which io_uring rings may register the buffers (fixed buffers).
    owner: BufferOwner,
    region: PinnedRegion,
    geometry: PoolGeometry,
    accounting: RefCell<SlabAccounting>,
}

/// A pool of equal buffers in one pinned region, optionally registered with a PD.
/// Single-threaded (`Rc`): a pool belongs to one reactor.
#[derive(Clone)]
pub struct BufferPool {
    shared: Rc<PoolShared>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("geometry", &self.shared.geometry)
            .field("available", &self.available())
            .finish()
    }
}

impl BufferPool {
    /// Maps and locks the memory; no device involved (tests use this directly).
    pub fn unregistered(geometry: PoolGeometry) -> Result<Self, PoolError> {
        let region = PinnedRegion::new(geometry.mapping_len()?)?;
        Ok(Self {
            shared: Rc::new(PoolShared {
                mr: None,
                owner: BufferOwner::new(),
                accounting: RefCell::new(SlabAccounting::new(geometry.count as u32)),
                region,
                geometry,
            }),
        })
    }

    /// Maps, locks and registers the memory with `pd` for local access only: the host never
    /// gets an rkey to target memory; the target moves data with RDMA READ/WRITE into the
    /// host's keyed buffers (NVMe RDMA 1.0b §2.2).
    pub fn registered(
        geometry: PoolGeometry,
        pd: &Rc<ProtectionDomain>,
    ) -> Result<Self, PoolError> {
        Self::register_with(geometry, |addr, len| {
            MemoryRegion::register_local(pd, addr, len)
        })
    }

    fn register_with(
        geometry: PoolGeometry,
        register: impl FnOnce(*mut u8, usize) -> Result<MemoryRegion, VerbsError>,
    ) -> Result<Self, PoolError> {
        let region = PinnedRegion::new(geometry.mapping_len()?)?;
        let mr = register(region.as_ptr(), region.len()).map_err(PoolError::Register)?;
        Ok(Self {
            shared: Rc::new(PoolShared {
                mr: Some(mr),
                owner: BufferOwner::new(),
                accounting: RefCell::new(SlabAccounting::new(geometry.count as u32)),
                region,
                geometry,
            }),
        })
    }

    /// Maps, locks and registers the memory with `pd` for remote read and write as well: the
    /// host side's data buffers, whose rkey goes into keyed SGL data blocks so that the
    /// target can RDMA WRITE read data into them and RDMA READ write data from them.
    pub fn registered_remote(
        geometry: PoolGeometry,
        pd: &Rc<ProtectionDomain>,
    ) -> Result<Self, PoolError> {
        Self::register_with(geometry, |addr, len| {
            MemoryRegion::register_remote(pd, addr, len)
        })
    }

    pub fn geometry(&self) -> PoolGeometry {
        self.shared.geometry
    }

    pub fn available(&self) -> usize {
        self.shared.accounting.borrow().available()
    }

    pub fn lkey(&self) -> u32 {
        self.shared.mr.as_ref().map_or(0, |mr| mr.lkey())
    }

    pub fn take(&self) -> Option<PoolBuffer> {
        let index = self.shared.accounting.borrow_mut().alloc()?;
        Some(PoolBuffer {
            shared: Rc::clone(&self.shared),
            index,
        })
    }

    pub fn take_many(&self, n: usize) -> Option<Vec<PoolBuffer>> {
        let indices = self.shared.accounting.borrow_mut().alloc_many(n)?;
        Some(
            indices
                .into_iter()
                .map(|index| PoolBuffer {
                    shared: Rc::clone(&self.shared),
                    index,
                })
                .collect(),
        )
    }
}

/// Exclusive lease on one pool buffer; returned to the pool on drop. Holding the lease keeps
/// the whole pool (memory and registration) alive, so a buffer still in flight with io_uring
/// after its connection died stays valid.
pub struct PoolBuffer {
    shared: Rc<PoolShared>,
    index: u32,
}

impl std::fmt::Debug for PoolBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolBuffer")
            .field("index", &self.index)
            .field("len", &self.len())
            .finish()
    }
}

impl PoolBuffer {
    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn len(&self) -> usize {
        self.shared.geometry.buffer_size
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        let offset = self.index as usize * self.shared.geometry.stride();
        // `offset + len ≤ mapping_len` by construction of the geometry and the accounting.
        self.shared.region.as_ptr().wrapping_add(offset)
    }

    /// This buffer as one an io_uring ring may register: backend ops on it can then be
    /// issued as fixed-buffer I/O (the pages are pinned already; the ring adds its own pin).
    pub fn unit(&self) -> BufferUnit {
        BufferUnit {
            owner: self.shared.owner.id(),
            index: self.index,
            base: self.as_ptr(),
            // Buffers are at most MAX_BUFFER_SIZE (24 bits).
            len: self.len() as u32,
        }
    }

    /// Address for an `ibv_sge`.
    pub fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }

    pub fn lkey(&self) -> u32 {
        self.shared.mr.as_ref().map_or(0, |mr| mr.lkey())
    }

    /// The remote key of the pool's registration (0 when unregistered; meaningless to a
    /// peer unless the pool is `registered_remote`).
    pub fn rkey(&self) -> u32 {
        self.shared.mr.as_ref().map_or(0, |mr| mr.rkey())
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the accounting hands each index to one lease only, the range lies inside the
        // live mapping (kept alive by `shared`), and the mapping was zero-filled at creation so
        // every byte is initialised.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only live view of the buffer.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }
}

impl Drop for PoolBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.shared.accounting.borrow_mut().release(self.index) {
            tracing::error!(error = %e, "RDMA pool accounting inconsistency");
        }
    }
}

/// Sizes of the per-device pools (from the configuration; see `RdmaParams`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolParams {
    /// In-capsule data bytes accepted after the 64-byte SQE.
    pub in_capsule_data_size: u32,
    /// MDTS in bytes: the size of each data buffer.
    pub max_data_transfer: u32,
    /// Receive capsule buffers shared by all connections on the device (sum of queue depths).
    pub capsule_buffers: u32,
    /// Response buffers (each connection takes two per queue entry).
    pub response_buffers: u32,
    /// Data buffers of `max_data_transfer` bytes; commands wait when all are in use.
    pub data_buffers: u32,
}

impl PoolParams {
    pub fn capsule_geometry(&self) -> PoolGeometry {
        PoolGeometry {
            buffer_size: nvme::wire::Sqe::SIZE + self.in_capsule_data_size as usize,
            align: 64,
            count: self.capsule_buffers as usize,
        }
    }

    pub fn response_geometry(&self) -> PoolGeometry {
        PoolGeometry {
            buffer_size: nvme::wire::Cqe::SIZE,
            align: 16,
            count: self.response_buffers as usize,
        }
    }

    pub fn data_geometry(&self) -> PoolGeometry {
        PoolGeometry {
            buffer_size: self.max_data_transfer as usize,
            align: PAGE_SIZE,
            count: self.data_buffers as usize,
        }
    }

    /// Checks all three geometries without mapping anything.
    pub fn validate(&self) -> Result<(), PoolError> {
        // In-capsule data is copied into a data buffer before execution.
        if self.in_capsule_data_size > self.max_data_transfer {
            return Err(PoolError::InvalidGeometry {
                what: "in_capsule_data_size (above max_data_transfer)",
                value: self.in_capsule_data_size as usize,
            });
        }
        self.capsule_geometry().mapping_len()?;
        self.response_geometry().mapping_len()?;
        self.data_geometry().mapping_len()?;
        Ok(())
    }
}

/// The three pools of one device, all registered with the device's PD.
#[derive(Debug, Clone)]
pub struct DevicePools {
    pub capsules: BufferPool,
    pub responses: BufferPool,
    pub data: BufferPool,
}

impl DevicePools {
    pub fn registered(params: &PoolParams, pd: &Rc<ProtectionDomain>) -> Result<Self, PoolError> {
        params.validate()?;
        Ok(Self {
            capsules: BufferPool::registered(params.capsule_geometry(), pd)?,
            responses: BufferPool::registered(params.response_geometry(), pd)?,
            data: BufferPool::registered(params.data_geometry(), pd)?,
        })
    }

    /// Same shapes, no device: for the sans-IO tests of the connection logic.
    pub fn unregistered(params: &PoolParams) -> Result<Self, PoolError> {
        params.validate()?;
        Ok(Self {
            capsules: BufferPool::unregistered(params.capsule_geometry())?,
            responses: BufferPool::unregistered(params.response_geometry())?,
            data: BufferPool::unregistered(params.data_geometry())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounting_hands_out_each_index_once_and_detects_misuse() {
        let mut acc = SlabAccounting::new(3);
        let a = acc.alloc().unwrap();
        let b = acc.alloc().unwrap();
        let c = acc.alloc().unwrap();
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(acc.alloc(), None);
        assert_eq!(acc.release(1), Ok(()));
        assert_eq!(acc.release(1), Err(AccountingError::NotInUse(1)));
        assert_eq!(acc.release(7), Err(AccountingError::OutOfRange(7)));
        assert_eq!(acc.alloc(), Some(1));
        assert_eq!(acc.available(), 0);
    }

    #[test]
    fn alloc_many_is_all_or_nothing() {
        let mut acc = SlabAccounting::new(4);
        assert!(acc.alloc_many(5).is_none());
        assert_eq!(acc.available(), 4);
        assert_eq!(acc.alloc_many(3).unwrap().len(), 3);
        assert!(acc.alloc_many(2).is_none());
        assert_eq!(acc.available(), 1);
    }

    #[test]
    fn geometry_bounds_every_parameter() {
        let ok = PoolGeometry {
            buffer_size: 16,
            align: 16,
            count: 10,
        };
        assert_eq!(ok.mapping_len().unwrap(), 4096);
        for bad in [
            PoolGeometry {
                buffer_size: 0,
                ..ok
            },
            PoolGeometry {
                buffer_size: MAX_BUFFER_SIZE + 1,
                ..ok
            },
            PoolGeometry { align: 24, ..ok },
            PoolGeometry { align: 8192, ..ok },
            PoolGeometry { count: 0, ..ok },
            PoolGeometry {
                count: MAX_BUFFERS + 1,
                ..ok
            },
        ] {
            assert!(matches!(
                bad.mapping_len(),
                Err(PoolError::InvalidGeometry { .. })
            ));
        }
        let huge = PoolGeometry {
            buffer_size: MAX_BUFFER_SIZE,
            align: 4096,
            count: 1024,
        };
        assert!(matches!(
            huge.mapping_len(),
            Err(PoolError::TooLarge { .. })
        ));
    }

    #[test]
    fn data_buffers_are_page_aligned_and_disjoint() {
        let pool = BufferPool::unregistered(PoolGeometry {
            buffer_size: 5000,
            align: 4096,
            count: 3,
        })
        .unwrap();
        let mut bufs = pool.take_many(3).unwrap();
        assert!(pool.take().is_none(), "exhaustion reports None");
        for b in &bufs {
            assert_eq!(b.addr() % 4096, 0);
            assert_eq!(b.len(), 5000);
        }
        assert_eq!(bufs[1].addr() - bufs[0].addr(), 8192);
        for (i, b) in bufs.iter_mut().enumerate() {
            b.as_mut_slice().fill(i as u8 + 1);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.as_slice().iter().all(|&x| x == i as u8 + 1));
        }
        drop(bufs.pop());
        assert_eq!(pool.available(), 1);
        let again = pool.take().unwrap();
        assert_eq!(again.index(), 2);
    }

    #[test]
    fn lease_keeps_pool_memory_alive() {
        let pool = BufferPool::unregistered(PoolGeometry {
            buffer_size: 64,
            align: 64,
            count: 2,
        })
        .unwrap();
        let mut lease = pool.take().unwrap();
        drop(pool);
        lease.as_mut_slice()[63] = 0xaa;
        assert_eq!(lease.as_slice()[63], 0xaa);
        assert_eq!(lease.lkey(), 0, "unregistered pools have no key");
    }

    #[test]
    fn params_shapes_follow_the_configuration() {
        let p = PoolParams {
            in_capsule_data_size: 8192,
            max_data_transfer: 1 << 20,
            capsule_buffers: 256,
            response_buffers: 512,
            data_buffers: 8,
        };
        assert_eq!(p.capsule_geometry().buffer_size, 64 + 8192);
        assert_eq!(p.response_geometry().stride(), 16);
        assert_eq!(p.data_geometry().stride(), 1 << 20);
        assert!(p.validate().is_ok());
        let too_much_in_capsule = PoolParams {
            in_capsule_data_size: 2 << 20,
            ..p
        };
        assert!(matches!(
            too_much_in_capsule.validate(),
            Err(PoolError::InvalidGeometry { .. })
        ));
        let pools = DevicePools::unregistered(&p).unwrap();
        assert_eq!(pools.capsules.available(), 256);
        assert_eq!(pools.data.available(), 8);
    }
}
