use super::*;
use crate::aligned::AlignedBuf;
use crate::test_support::{flush, read_at, write_at, zero};
use crate::testing::pattern;
use crate::uring::UringEngine;

fn roundtrip(block_size: u32) {
    let bs = block_size as u64;
    let ram = RamBackend::new(64 * 4096, block_size).unwrap();
    assert_eq!(ram.capacity(), 64 * 4096);
    let mut io = UringEngine::new(8).unwrap();

    // Write a pattern spanning several pages at an unaligned-to-page block offset.
    let mut wbuf = AlignedBuf::new(5 * 4096);
    wbuf.copy_from_slice(&pattern(5 * 4096, 7));
    write_at(&ram, 3 * bs, false, &mut wbuf, &mut io).unwrap();
    let mut rbuf = AlignedBuf::new(5 * 4096);
    read_at(&ram, 3 * bs, &mut rbuf, &mut io).unwrap();
    assert_eq!(&rbuf[..], &wbuf[..]);

    // FUA write and flush complete inline and are visible.
    let mut fbuf = AlignedBuf::new(block_size as usize);
    fbuf.copy_from_slice(&pattern(block_size as usize, 9));
    write_at(&ram, 0, true, &mut fbuf, &mut io).unwrap();
    flush(&ram, &mut io).unwrap();
    let mut rbuf = AlignedBuf::new(block_size as usize);
    read_at(&ram, 0, &mut rbuf, &mut io).unwrap();
    assert_eq!(&rbuf[..], &fbuf[..]);
    assert_eq!(io.in_flight(), 0, "RAM must not use the ring");

    // Deallocate a range with unaligned edges inside the written pattern: exactly that range
    // reads as zero, its neighbours keep their data.
    let dealloc_off = 3 * bs + bs;
    let dealloc_len = 4096 * 3 + bs; // crosses page boundaries with partial pages at both ends
    zero(&ram, dealloc_off, dealloc_len, Zeroing::Deallocate, &mut io).unwrap();
    let mut rbuf = AlignedBuf::new(5 * 4096);
    read_at(&ram, 3 * bs, &mut rbuf, &mut io).unwrap();
    let rel = (dealloc_off - 3 * bs) as usize;
    let rel_end = rel + dealloc_len as usize;
    assert_eq!(&rbuf[..rel], &wbuf[..rel]);
    assert!(rbuf[rel..rel_end].iter().all(|&b| b == 0));
    assert_eq!(&rbuf[rel_end..], &wbuf[rel_end..]);

    // Write Zeroes on a single block inside a page (no whole page involved).
    write_at(&ram, 3 * bs, false, &mut wbuf, &mut io).unwrap();
    zero(
        &ram,
        4 * bs,
        bs,
        Zeroing::WriteZeroes { deallocate: false },
        &mut io,
    )
    .unwrap();
    read_at(&ram, 3 * bs, &mut rbuf, &mut io).unwrap();
    let (a, b) = (bs as usize, 2 * bs as usize);
    assert_eq!(&rbuf[..a], &wbuf[..a]);
    assert!(rbuf[a..b].iter().all(|&x| x == 0));
    assert_eq!(&rbuf[b..], &wbuf[b..]);
}

#[test]
fn ram_roundtrip_512() {
    roundtrip(512);
}

#[test]
fn ram_roundtrip_4096() {
    roundtrip(4096);
}

#[test]
fn ram_lends_reads_that_outlive_the_backend() {
    // A lent read is the namespace's bytes in place: it follows later writes (NVMe lets
    // an overlapping read return them), is range-checked like `start`, and keeps the
    // memory mapped after the namespace is gone (a transport may still be sending it).
    let ram = RamBackend::new(64 * 1024, 512).unwrap();
    let mut io = UringEngine::new(2).unwrap();
    let mut buf = AlignedBuf::new(8192);
    buf.copy_from_slice(&pattern(8192, 4));
    write_at(&ram, 4096, false, &mut buf, &mut io).unwrap();
    let mut lent = ram.lend(4096, 8192).unwrap();
    assert!(lent.as_bytes() == &buf[..]);
    buf.copy_from_slice(&pattern(8192, 5));
    write_at(&ram, 4096, false, &mut buf, &mut io).unwrap();
    assert!(lent.as_bytes() == &buf[..]);
    lent.truncate(512);
    assert_eq!((lent.len(), lent.is_empty()), (512, false));
    assert!(ram.lend(60 * 1024, 8192).is_none());
    assert!(ram.lend(u64::MAX - 10, 20).is_none());
    drop(ram);
    assert!(lent.as_bytes() == &pattern(8192, 5)[..512]);
}

#[test]
fn ram_rejects_bad_sizes() {
    assert!(matches!(
        RamBackend::new(0, 512),
        Err(BackendError::RamSize { .. })
    ));
    assert!(matches!(
        RamBackend::new(4096 + 512, 4096),
        Err(BackendError::RamSize { .. })
    ));
    assert!(RamBackend::new(4096 + 512, 512).is_ok());
}

#[test]
fn ram_out_of_range_is_an_error_not_a_panic() {
    let ram = RamBackend::new(8192, 512).unwrap();
    let mut io = UringEngine::new(4).unwrap();
    let mut buf = AlignedBuf::new(1024);
    let err = read_at(&ram, 8192 - 512, &mut buf, &mut io);
    assert_eq!(err.unwrap_err().raw_os_error(), Some(libc::EINVAL));
    let err = write_at(&ram, u64::MAX - 100, false, &mut buf, &mut io);
    assert_eq!(err.unwrap_err().raw_os_error(), Some(libc::EINVAL));
    assert!(zero(&ram, 4096, 8192, Zeroing::Deallocate, &mut io).is_err());
    assert!(zero(
        &ram,
        u64::MAX,
        2,
        Zeroing::WriteZeroes { deallocate: false },
        &mut io
    )
    .is_err());
}

#[test]
fn ram_is_sparse() {
    // 64 GiB of address space must not need 64 GiB of memory (MAP_NORESERVE); only the pages
    // written are resident.
    let ram = RamBackend::new(64 << 30, 4096).unwrap();
    let mut io = UringEngine::new(4).unwrap();
    let mut buf = AlignedBuf::new(4096);
    buf.copy_from_slice(&pattern(4096, 1));
    write_at(&ram, 63 << 30, false, &mut buf, &mut io).unwrap();
    let mut rbuf = AlignedBuf::new(4096);
    read_at(&ram, 63 << 30, &mut rbuf, &mut io).unwrap();
    assert_eq!(&rbuf[..], &buf[..]);
    read_at(&ram, 1 << 30, &mut rbuf, &mut io).unwrap();
    assert!(rbuf.iter().all(|&b| b == 0));
}

/// Resident pages among the `pages` pages starting at byte `offset` of the mapping.
fn resident_pages(ram: &RamBackend, offset: usize, pages: usize) -> usize {
    let mut vec = vec![0u8; pages];
    // SAFETY: the range is inside the mapping and page-aligned; `vec` has one byte per page.
    let rc = unsafe {
        libc::mincore(
            ram.mem.base.as_ptr().add(offset).cast(),
            pages * ram.page_size,
            vec.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
    vec.iter().filter(|&&v| v & 1 != 0).count()
}

#[test]
fn ram_deallocate_gives_memory_back() {
    let ram = RamBackend::new(64 * 4096, 512).unwrap();
    let page = ram.page_size;
    let mut io = UringEngine::new(4).unwrap();
    assert_eq!(
        resident_pages(&ram, 0, 16),
        0,
        "nothing is committed up front"
    );
    let mut buf = AlignedBuf::new(16 * page);
    buf.copy_from_slice(&pattern(16 * page, 3));
    write_at(&ram, 0, false, &mut buf, &mut io).unwrap();
    assert_eq!(resident_pages(&ram, 0, 16), 16);
    // Pages 2..=13 are wholly inside the range and are dropped; pages 1 and 14 are only
    // partly inside, so they stay (with their covered part zeroed).
    zero(
        &ram,
        page as u64 + 512,
        13 * page as u64,
        Zeroing::Deallocate,
        &mut io,
    )
    .unwrap();
    assert_eq!(resident_pages(&ram, 0, 16), 4);
    assert_eq!(resident_pages(&ram, 2 * page, 12), 0);
}

#[test]
fn ram_concurrent_threads() {
    // Disjoint ranges written from several threads at once must all land intact.
    let ram = std::sync::Arc::new(RamBackend::new(1 << 20, 4096).unwrap());
    let handles: Vec<_> = (0..4u8)
        .map(|t| {
            let ram = ram.clone();
            std::thread::spawn(move || {
                let mut io = UringEngine::new(4).unwrap();
                let mut buf = AlignedBuf::new(64 * 1024);
                for i in 0..16u64 {
                    buf.copy_from_slice(&pattern(64 * 1024, t as u64 * 100 + i));
                    let offset = u64::from(t) * 256 * 1024 + (i % 4) * 64 * 1024;
                    write_at(&*ram, offset, false, &mut buf, &mut io).unwrap();
                    let mut rbuf = AlignedBuf::new(64 * 1024);
                    read_at(&*ram, offset, &mut rbuf, &mut io).unwrap();
                    assert_eq!(&rbuf[..], &buf[..]);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
