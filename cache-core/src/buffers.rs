//! Large buffers reused instead of allocated: page-aligned (as O_DIRECT requires), and
//! returned to a bounded pool when the last [`Bytes`] made of one is dropped.
//!
//! A fresh multi-megabyte allocation is mapped, faulted in and zeroed by the kernel page by
//! page; on a cold read that streams blocks into a full memory tier, that was about a sixth of
//! Larder's CPU (docs/benchmarks.md, "Cold fills into reused buffers"). Buffers of a block's
//! length come back when the memory tier evicts a block, when a disk write completes and when
//! a disk hit's bytes are dropped, and the next fill, write or read of that length takes one.
//!
//! The pool's bound is the program's to set ([`set_pool_limit`]; [`DEFAULT_POOL_LIMIT`] until
//! then): it should hold what the reads in flight at once hold, or every read past it pays for
//! fresh memory again.
//!
//! A pooled buffer's bytes can also be lent to the kernel ([`lend_into_pipe`]): its pages go
//! into a pipe by reference (`vmsplice`), and from there to a socket (`splice`) without being
//! copied; the kernel keeps them until the peer has them, which may be long after the last
//! [`Bytes`] is gone. Reusing such a buffer in place would change bytes still being sent, so a
//! buffer that lent any gives the pages it lent back to the kernel (`MADV_DONTNEED`) before it
//! is pooled or freed: the pages in flight keep their bytes, and the buffer's next user gets
//! fresh zeroed ones (faulted in again, the cost of the loan).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

/// The alignment of every [`AlignedBuf`]: the page, as O_DIRECT needs on every device.
pub const ALIGN: usize = 4096;

/// `chunks` end to end as one buffer. Large ones are built in a reused buffer (see the module
/// documentation); every byte of it is overwritten.
pub fn concat(chunks: &[Bytes]) -> Bytes {
    match chunks {
        [] => Bytes::new(),
        [one] => one.clone(),
        many => {
            let len: usize = many.iter().map(Bytes::len).sum();
            if len < RECYCLE_MIN {
                let mut buf = BytesMut::with_capacity(len);
                for c in many {
                    buf.extend_from_slice(c);
                }
                return buf.freeze();
            }
            let mut buf = AlignedBuf::reused(len);
            let mut at = 0;
            for c in many {
                buf.as_mut_slice()[at..at + c.len()].copy_from_slice(c);
                at += c.len();
            }
            buf.freeze(0, len)
        }
    }
}

pub use assembly::Assembly;

/// A value assembled in one buffer as it arrives ([`Assembly`]). The buffer's bytes are written
/// once each, in order, by the one `Assembly`, and only those already written are ever read:
/// this module alone reaches them, so that rule holds whatever the rest of the crate does.
#[allow(unsafe_code)]
mod assembly {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::{AlignedBuf, Recycle, RECYCLE_MIN};

    /// A large value assembled in one pooled buffer as its chunks arrive, each chunk copied in
    /// once and handed on as a view of the buffer ([`Assembly::append`]), and the whole value a
    /// view of it too once every byte came ([`Assembly::finish`]): no join at the end.
    ///
    /// Joining a value's chunks into one buffer after the last one came
    /// ([`super::concat`]) was the one pass over a cold block that only Larder makes (a copy
    /// of all 8 MiB, out of memory the caches no longer hold), and the chunks it joined were
    /// the upstream client's read buffers, held until then, so the client read every block into
    /// fresh memory. Copied as they come, the bytes are still in the CPU's caches, and each read
    /// buffer is free for the next read as soon as its bytes are copied.
    pub struct Assembly {
        buf: Arc<Assembled>,
        /// Bytes written, from the first: never written again, and the only ones views show.
        written: usize,
    }

    impl Assembly {
        /// An empty assembly of a `len`-byte value, in a reused buffer (see the module
        /// documentation); `None` for values too small to pool, which [`super::concat`] joins
        /// as cheaply.
        pub fn new(len: usize) -> Option<Self> {
            (len >= RECYCLE_MIN).then(|| Self {
                buf: Arc::new(Assembled::new(AlignedBuf::reused(len))),
                written: 0,
            })
        }

        /// Copy `chunk` in after the bytes before it, and return them as a view of the buffer;
        /// `None`, and nothing written, when the value has no room left for them.
        pub fn append(&mut self, chunk: &[u8]) -> Option<Bytes> {
            let from = self.written;
            let to = from
                .checked_add(chunk.len())
                .filter(|&to| to <= self.buf.len)?;
            // SAFETY: `from..to` lies inside the `len` bytes at `at`, which the `Vec` holds for
            // as long as the buffer lives. Nothing was written there yet, so no view covers it
            // (views cover only bytes written before `from`), and `chunk`, borrowed, is not
            // inside it.
            unsafe {
                std::ptr::copy_nonoverlapping(chunk.as_ptr(), self.buf.at.add(from), chunk.len())
            };
            self.written = to;
            Some(self.buf.view(from, to))
        }

        /// The whole value, once every byte of it was appended; otherwise `None` (its views
        /// stay valid either way).
        pub fn finish(self) -> Option<Bytes> {
            (self.written == self.buf.len).then(|| self.buf.view(0, self.written))
        }
    }

    struct Assembled {
        /// The pooled `Vec`, which goes back to the pool (its loan settled) when the last view
        /// and the assembly are dropped. Never borrowed while they live: bytes are reached
        /// through `at` only.
        _vec: Recycle,
        /// The value's first byte, page-aligned, inside the `Vec`.
        at: *mut u8,
        len: usize,
    }

    // SAFETY: the buffer's bytes are written only by `Assembly::append` (which takes
    // `&mut Assembly`, and there is one `Assembly` per buffer), only where nothing was written
    // before, and read only where written before: no byte is ever read and written at once,
    // from any thread.
    unsafe impl Send for Assembled {}
    unsafe impl Sync for Assembled {}

    impl Assembled {
        fn new(buf: AlignedBuf) -> Self {
            let (mut vec, start, len) = buf.take_parts();
            // `as_mut_ptr` makes no reference to the slice: the pointer stays valid while the
            // `Vec` is moved (its heap buffer does not move) and is never grown.
            let at = vec.as_mut_ptr().wrapping_add(start);
            Self {
                _vec: Recycle::new(vec, len),
                at,
                len,
            }
        }

        /// Bytes `from..to`, already written, as [`Bytes`] that keep the buffer alive.
        fn view(self: &Arc<Self>, from: usize, to: usize) -> Bytes {
            Bytes::from_owner(View {
                buf: self.clone(),
                from,
                to,
            })
        }
    }

    struct View {
        buf: Arc<Assembled>,
        from: usize,
        to: usize,
    }

    impl AsRef<[u8]> for View {
        fn as_ref(&self) -> &[u8] {
            // SAFETY: a view is made only of bytes already written (`Assembly` makes them of
            // what it has written), which are never written again, inside a buffer the `Arc`
            // keeps alive.
            unsafe { std::slice::from_raw_parts(self.buf.at.add(self.from), self.to - self.from) }
        }
    }
}

/// A page-aligned buffer, as O_DIRECT requires, built without `unsafe`: an over-allocated
/// `Vec` and the aligned window inside it. Large ones go back to a small pool when dropped (or
/// when the [`Bytes`] made of them are), so the next buffer of that length reuses memory
/// already mapped and zeroed once, instead of zeroing and faulting in fresh pages.
#[derive(Debug)]
pub struct AlignedBuf {
    vec: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes starting on a page boundary.
    pub fn zeroed(len: usize) -> Self {
        Self::over(vec![0u8; len + ALIGN], len)
    }

    /// `len` bytes starting on a page boundary, of unspecified contents (a recycled buffer's
    /// old bytes, or zeros): for a caller that overwrites every one of them (a read that fills
    /// the buffer, an entry encoded with its padding, a block's chunks copied end to end).
    pub fn reused(len: usize) -> Self {
        match RECYCLED.take(len + ALIGN) {
            Some(vec) => Self::over(vec, len),
            None => Self::zeroed(len),
        }
    }

    fn over(vec: Vec<u8>, len: usize) -> Self {
        let addr = vec.as_ptr() as usize;
        let start = (ALIGN - addr % ALIGN) % ALIGN;
        Self { vec, start, len }
    }

    /// The aligned bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.vec[self.start..self.start + self.len]
    }

    /// The aligned bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.vec[self.start..self.start + self.len]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes `[from, to)` of the buffer as shared [`Bytes`], without a copy; the buffer
    /// goes back to the pool when the last of them is dropped.
    pub fn freeze(mut self, from: usize, to: usize) -> Bytes {
        let (start, len) = (self.start, self.len);
        Bytes::from_owner(Recycle::new(std::mem::take(&mut self.vec), len))
            .slice(start + from..start + to)
    }

    #[cfg(target_os = "linux")]
    pub(crate) fn into_parts(self) -> (Vec<u8>, usize, usize) {
        self.take_parts()
    }

    fn take_parts(mut self) -> (Vec<u8>, usize, usize) {
        (std::mem::take(&mut self.vec), self.start, self.len)
    }

    #[cfg(target_os = "linux")]
    pub(crate) fn from_parts(vec: Vec<u8>, start: usize, len: usize) -> Self {
        Self { vec, start, len }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        RECYCLED.put(std::mem::take(&mut self.vec));
    }
}

/// A buffer's `Vec` inside [`Bytes`]: returned to the pool when the last `Bytes` goes. While it
/// lives, a pooled one is in [`LOANS`], so its bytes can be lent ([`lend_into_pipe`]); the pages
/// it lent are given back to the kernel before the `Vec` is pooled or freed.
struct Recycle(Vec<u8>);

impl Recycle {
    /// `vec`, an [`AlignedBuf`]'s, made for a value of `len` bytes.
    fn new(vec: Vec<u8>, len: usize) -> Self {
        if vec.len() >= RECYCLE_MIN {
            let at = vec.as_ptr() as usize;
            LOANS.lock().insert(
                at,
                Loan {
                    end: at + vec.len(),
                    made_for: len,
                    lent: None,
                    reads: 0,
                },
            );
        }
        Self(vec)
    }
}

impl AsRef<[u8]> for Recycle {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Recycle {
    fn drop(&mut self) {
        let mut vec = std::mem::take(&mut self.0);
        if vec.len() >= RECYCLE_MIN {
            let loan = LOANS.lock().remove(&(vec.as_ptr() as usize));
            if let Some(Loan {
                lent: Some((from, to)),
                ..
            }) = loan
            {
                if !pages::give_back(&mut vec, from, to) {
                    // The pages could not be detached, so the bytes in flight would change
                    // with the next use: this buffer is never used again.
                    std::mem::forget(vec);
                    RECYCLED.stranded.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                RECYCLED.given_back.fetch_add(1, Ordering::Relaxed);
            }
        }
        RECYCLED.put(vec);
    }
}

/// The live pooled buffers inside [`Bytes`], by the address of their `Vec`: the only memory
/// whose bytes may be lent, because its reuse is known to go through [`Recycle`]'s drop.
static LOANS: Mutex<BTreeMap<usize, Loan>> = Mutex::new(BTreeMap::new());

struct Loan {
    /// One past the `Vec`'s last byte.
    end: usize,
    /// The length of the value the buffer was made for (its `AlignedBuf`'s).
    made_for: usize,
    /// The addresses lent so far, first to one past the last.
    lent: Option<(usize, usize)>,
    /// Reads of its bytes counted by [`read_again`]: lent from [`LEND_AFTER_READS`] on.
    reads: u32,
}

/// Memory hits a buffer's bytes take before they are lent ([`read_again`]). A loan costs the
/// buffer its pages when it is next reused: given back to the kernel and faulted in afresh,
/// measured at about 0.6 ms per MiB on this project's 2-core VM, where a hit's copy into the
/// socket costs about a fifth of that. Lending every block read again from memory took 1 MiB
/// disk hits (each block promoted to memory, read there by up to three other clients, then
/// evicted) from 287 to 421 ms of CPU per 1,000 (docs/benchmarks.md); a block read this often
/// is hot, and each further hit saves a copy.
pub const LEND_AFTER_READS: u32 = 16;

/// Count a read of `bytes` (a memory hit): once a pooled buffer's bytes were read
/// [`LEND_AFTER_READS`] times, they may be lent.
pub fn read_again(bytes: &[u8]) {
    if bytes.len() < RECYCLE_MIN {
        return;
    }
    let at = bytes.as_ptr() as usize;
    if let Some((_, loan)) = LOANS.lock().range_mut(..=at).next_back() {
        if at < loan.end {
            loan.reads = loan.reads.saturating_add(1);
        }
    }
}

/// Lend the leading bytes of `bytes` to `pipe` by reference (`vmsplice`, non-blocking): at most
/// what the pipe has room for, and only bytes of a pooled buffer still held in [`Bytes`] (a
/// large one this module made) read [`LEND_AFTER_READS`] times, whole pages of it. Returns how
/// many went in: 0 when `bytes` is not such memory, and the caller writes them the usual way.
///
/// The pipe holds the pages, not a copy: whatever the pipe is spliced to gets the bytes as
/// they are when it reads them. The buffer never changes while it is held, and when the last
/// `Bytes` of it goes, the pages it lent are detached before the buffer is used again.
pub fn lend_into_pipe(pipe: impl std::os::fd::AsFd, bytes: &[u8]) -> std::io::Result<usize> {
    let at = bytes.as_ptr() as usize;
    let mut loans = LOANS.lock();
    let Some((loan, len)) = loan_of(&mut loans, bytes) else {
        return Ok(0);
    };
    // Recorded before the pages go, under the lock that the buffer's drop takes first: the
    // buffer cannot be pooled between the two (`bytes` borrows it anyway).
    let (from, to) = loan
        .lent
        .map_or((at, at + len), |(f, t)| (f.min(at), t.max(at + len)));
    loan.lent = Some((from, to));
    drop(loans);
    let lent = pages::lend(pipe.as_fd(), &bytes[..len])?;
    RECYCLED
        .lent_bytes
        .fetch_add(lent as u64, Ordering::Relaxed);
    Ok(lent)
}

/// How many leading bytes of `bytes` [`lend_into_pipe`] would lend, pipe room aside, where the
/// buffer they lie in was made for a value of at most `most` bytes (none otherwise; `usize::MAX`
/// takes any): a caller may lend the bytes of small values and copy those of large ones.
pub fn lendable(bytes: &[u8], most: usize) -> usize {
    loan_of(&mut LOANS.lock(), bytes)
        .filter(|(loan, _)| loan.made_for <= most)
        .map_or(0, |(_, len)| len)
}

/// The loan of the live pooled buffer `bytes` starts in, if it was read again, and how many of
/// them lie in its whole pages (a page shared with another allocation could change under the
/// pipe).
fn loan_of<'a>(
    loans: &'a mut BTreeMap<usize, Loan>,
    bytes: &[u8],
) -> Option<(&'a mut Loan, usize)> {
    let at = bytes.as_ptr() as usize;
    let (&start, loan) = loans.range_mut(..=at).next_back()?;
    let (first, last) = (start.next_multiple_of(ALIGN), loan.end / ALIGN * ALIGN);
    (loan.reads >= LEND_AFTER_READS && (first..last).contains(&at))
        .then(|| (loan, bytes.len().min(last - at)))
}

/// The two system calls behind a loan: the only `unsafe` in the workspace.
#[allow(unsafe_code)]
mod pages {
    use std::os::fd::BorrowedFd;

    use rustix::mm::{madvise, Advice};
    use rustix::pipe::{vmsplice, IoSliceRaw, SpliceFlags};

    use super::ALIGN;

    /// `vmsplice` of `bytes` into `pipe`, non-blocking.
    pub(super) fn lend(pipe: BorrowedFd<'_>, bytes: &[u8]) -> std::io::Result<usize> {
        let slice = [IoSliceRaw::from_slice(bytes)];
        // SAFETY: `vmsplice` without SPLICE_F_GIFT takes references to the pages of `bytes`,
        // which the pipe keeps after this returns; rustix marks it unsafe because the memory
        // may then change under the pipe. `lend_into_pipe` passes only whole pages of a pooled
        // buffer held in `Bytes` (never written while held) and has recorded them in the
        // buffer's loan, so its drop detaches those pages (`give_back`) before anything can
        // write to that memory again.
        Ok(unsafe { vmsplice(pipe, &slice, SpliceFlags::NONBLOCK) }?)
    }

    /// Detach the pages of `vec` that cover `from..to` (addresses inside it) with
    /// `MADV_DONTNEED`: the kernel keeps the old pages for whoever still holds them (a pipe, a
    /// socket) and maps fresh zeroed ones here. False if the kernel refused.
    pub(super) fn give_back(vec: &mut [u8], from: usize, to: usize) -> bool {
        let base = vec.as_mut_ptr() as usize;
        let lo = (from / ALIGN * ALIGN).max(base.next_multiple_of(ALIGN));
        let hi = to
            .next_multiple_of(ALIGN)
            .min((base + vec.len()) / ALIGN * ALIGN);
        if hi <= lo {
            return true;
        }
        // SAFETY: `lo..hi` is whole pages inside `vec`, which this function borrows mutably
        // (no other reference to it exists); they are private anonymous memory from the
        // allocator, whose contents MADV_DONTNEED replaces with zeros on the next touch, as a
        // write of zeros would. Every `u8` is valid, and a pooled buffer's contents are
        // unspecified to its next user (`AlignedBuf::reused`).
        unsafe { madvise(lo as *mut std::ffi::c_void, hi - lo, Advice::LinuxDontNeed) }.is_ok()
    }
}

/// Buffers smaller than this are not pooled: zeroing them costs less than the pool's lock.
const RECYCLE_MIN: usize = 64 * 1024;
/// Most bytes the pool holds until [`set_pool_limit`] says otherwise: sixteen 1 MiB reads, or
/// seven 8 MiB blocks (each is a few KiB longer than the block, so not eight).
pub const DEFAULT_POOL_LIMIT: usize = 64 << 20;

/// Bound the bytes the pool holds (idle buffers waiting to be reused), giving back at once
/// what is over. A program sets it once at start, from what it lets its reads hold at once.
pub fn set_pool_limit(bytes: usize) {
    RECYCLED.set_limit(bytes);
}

/// What the pool holds and how often it had nothing to give.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes of idle buffers held.
    pub held_bytes: u64,
    /// The most it may hold ([`set_pool_limit`]).
    pub limit_bytes: u64,
    /// Buffers of a pooled size allocated fresh since start, the pool holding none of that
    /// length: each one zeroed and faulted in.
    pub fresh: u64,
    /// Buffers whose pages were lent ([`lend_into_pipe`]) and given back to the kernel before
    /// the buffer's reuse: each one's next user faults in fresh pages where they were.
    pub given_back: u64,
    /// Buffers whose lent pages the kernel would not take back, left allocated and never
    /// reused (not expected to happen).
    pub stranded: u64,
    /// Bytes lent into pipes ([`lend_into_pipe`]): sent without a copy.
    pub lent_bytes: u64,
}

/// A snapshot of the pool.
pub fn pool_stats() -> PoolStats {
    RECYCLED.stats()
}

/// Free buffers by exact length: reads, writes and fills repeat a few lengths (whole blocks of
/// one size, their 1 MiB pieces, disk entries of one block), so an exact match is the common
/// case and no buffer is handed out larger than asked (the memory tier may keep it, counting
/// only what it asked for).
static RECYCLED: Recycler = Recycler::new(DEFAULT_POOL_LIMIT);

struct Recycler {
    free: Mutex<Free>,
    limit: AtomicUsize,
    fresh: AtomicU64,
    given_back: AtomicU64,
    stranded: AtomicU64,
    lent_bytes: AtomicU64,
}

/// Free buffers, newest last, and their total length (at most the pool's limit).
struct Free {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl Free {
    fn remove(&mut self, at: usize) -> Vec<u8> {
        let vec = self.bufs.swap_remove(at);
        self.bytes -= vec.len();
        vec
    }
}

impl Recycler {
    const fn new(limit: usize) -> Self {
        Self {
            free: Mutex::new(Free {
                bufs: Vec::new(),
                bytes: 0,
            }),
            limit: AtomicUsize::new(limit),
            fresh: AtomicU64::new(0),
            given_back: AtomicU64::new(0),
            stranded: AtomicU64::new(0),
            lent_bytes: AtomicU64::new(0),
        }
    }

    fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::Relaxed);
        let mut free = self.free.lock();
        while free.bytes > bytes {
            let at = free.bufs.len() - 1;
            drop(free.remove(at));
        }
    }

    fn stats(&self) -> PoolStats {
        PoolStats {
            held_bytes: self.free.lock().bytes as u64,
            limit_bytes: self.limit.load(Ordering::Relaxed) as u64,
            fresh: self.fresh.load(Ordering::Relaxed),
            given_back: self.given_back.load(Ordering::Relaxed),
            stranded: self.stranded.load(Ordering::Relaxed),
            lent_bytes: self.lent_bytes.load(Ordering::Relaxed),
        }
    }

    /// A free buffer of exactly `len` bytes; `None` (counted, for a pooled length) if the pool
    /// holds none, and the caller allocates one.
    fn take(&self, len: usize) -> Option<Vec<u8>> {
        if len < RECYCLE_MIN {
            return None;
        }
        let mut free = self.free.lock();
        let Some(at) = free.bufs.iter().rposition(|v| v.len() == len) else {
            drop(free);
            self.fresh.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        Some(free.remove(at))
    }

    fn put(&self, vec: Vec<u8>) {
        let limit = self.limit.load(Ordering::Relaxed);
        if vec.len() < RECYCLE_MIN || vec.len() > limit {
            return;
        }
        let mut free = self.free.lock();
        // Full: make room by dropping buffers of other lengths, so the pool follows the lengths
        // being read now; with none to drop, this one goes.
        while free.bytes + vec.len() > limit {
            match free.bufs.iter().position(|v| v.len() != vec.len()) {
                Some(at) => drop(free.remove(at)),
                None => return,
            }
        }
        free.bytes += vec.len();
        free.bufs.push(vec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [ALIGN, 3 * ALIGN, 1 << 20] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.len(), len);
        }
    }

    #[test]
    fn a_read_buffer_comes_back_to_the_pool_when_its_bytes_are_dropped() {
        // A length no other test uses, so the pool (shared by the tests) hands this one back.
        let len = 3 * RECYCLE_MIN + 7 * ALIGN;
        let mut buf = AlignedBuf::reused(len);
        buf.as_mut_slice().fill(3);
        let at = buf.as_slice().as_ptr();
        let bytes = buf.freeze(ALIGN, 2 * ALIGN);
        let other = AlignedBuf::reused(len);
        assert_ne!(other.as_slice().as_ptr(), at, "still in use by the bytes");
        drop(other);
        drop(bytes);
        let again = AlignedBuf::reused(len);
        assert_eq!(again.as_slice().as_ptr() as usize % ALIGN, 0);
        assert!(
            again.as_slice().as_ptr() == at || RECYCLED.take(len + ALIGN).is_some(),
            "a freed buffer of this length is pooled"
        );
        // Small ones are not pooled.
        drop(AlignedBuf::reused(ALIGN));
        assert!(RECYCLED.take(2 * ALIGN).is_none());
    }

    #[test]
    fn the_pool_holds_what_its_limit_allows_and_gives_back_the_rest_when_it_falls() {
        // A pool of its own: the global one is shared by the tests running beside this one.
        let pool = Recycler::new(3 * RECYCLE_MIN);
        for _ in 0..4 {
            pool.put(vec![0u8; RECYCLE_MIN]);
        }
        assert_eq!(
            pool.stats().held_bytes,
            3 * RECYCLE_MIN as u64,
            "the fourth went"
        );
        pool.set_limit(8 * RECYCLE_MIN);
        for _ in 0..4 {
            pool.put(vec![0u8; RECYCLE_MIN]);
        }
        assert_eq!(pool.stats().held_bytes, 7 * RECYCLE_MIN as u64);
        pool.set_limit(2 * RECYCLE_MIN);
        assert_eq!(pool.stats().held_bytes, 2 * RECYCLE_MIN as u64);
        assert_eq!(pool.stats().limit_bytes, 2 * RECYCLE_MIN as u64);
        assert!(pool.take(RECYCLE_MIN).is_some());
        // A buffer larger than the whole limit is never kept.
        pool.put(vec![0u8; 3 * RECYCLE_MIN]);
        assert_eq!(pool.stats().held_bytes, RECYCLE_MIN as u64);
    }

    #[test]
    fn a_buffer_the_pool_cannot_give_is_counted_fresh() {
        let pool = Recycler::new(4 * RECYCLE_MIN);
        assert!(pool.take(RECYCLE_MIN).is_none());
        assert_eq!(pool.stats().fresh, 1);
        pool.put(vec![0u8; RECYCLE_MIN]);
        assert!(pool.take(RECYCLE_MIN).is_some());
        assert_eq!(pool.stats().fresh, 1, "a buffer given is not fresh");
        // Small ones are not the pool's: neither taken nor counted.
        assert!(pool.take(ALIGN).is_none());
        assert_eq!(pool.stats().fresh, 1);
    }

    fn read_often(bytes: &[u8], times: u32) {
        for _ in 0..times {
            read_again(bytes);
        }
    }

    /// Read `len` bytes out of a pipe.
    #[cfg(target_os = "linux")]
    fn drain(pipe: &std::os::fd::OwnedFd, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        let mut at = 0;
        while at < len {
            at += rustix::io::read(pipe, &mut out[at..]).expect("read the pipe");
        }
        out
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn lent_bytes_keep_their_value_when_their_buffer_is_reused() {
        // A length no other test uses, so the pool hands this buffer back to this test.
        let len = 2 * RECYCLE_MIN + 5 * ALIGN;
        let (read, write) = rustix::pipe::pipe().expect("pipe");
        let mut buf = AlignedBuf::reused(len);
        buf.as_mut_slice().fill(0xA1);
        let at = buf.as_slice().as_ptr() as usize;
        let bytes = buf.freeze(0, len);
        read_often(&bytes[ALIGN..], LEND_AFTER_READS - 1);
        assert_eq!(
            lend_into_pipe(&write, &bytes).expect("vmsplice"),
            0,
            "not read enough"
        );
        read_often(&bytes[ALIGN..], 1);
        let before = pool_stats().lent_bytes;
        let lent = lend_into_pipe(&write, &bytes[ALIGN..]).expect("vmsplice");
        assert!(
            pool_stats().lent_bytes >= before + lent as u64,
            "lent bytes counted"
        );
        assert!(lent > 0, "a pooled buffer's whole pages are lent");
        drop(bytes);
        let covered = LOANS
            .lock()
            .range(..=at)
            .next_back()
            .is_some_and(|(_, l)| l.end > at);
        assert!(!covered, "no loan outlives its buffer");
        // The same memory, reused and overwritten while the pipe still holds what was lent.
        let mut again = AlignedBuf::reused(len);
        assert_eq!(
            again.as_slice().as_ptr() as usize,
            at,
            "the pool gave the buffer back"
        );
        again.as_mut_slice().fill(0x5E);
        assert!(
            drain(&read, lent).iter().all(|&b| b == 0xA1),
            "the pipe holds the bytes lent, not what the buffer holds now"
        );
        assert!(again.as_slice().iter().all(|&b| b == 0x5E));
        assert!(pool_stats().given_back >= 1, "counted");
    }

    #[test]
    fn only_whole_pages_of_live_pooled_buffers_are_lent() {
        // Memory the pool does not own is never lent: its owner may reuse it in place.
        let plain = Bytes::from(vec![7u8; 4 * RECYCLE_MIN]);
        read_often(&plain, LEND_AFTER_READS);
        assert_eq!(lendable(&plain, usize::MAX), 0);
        let small = AlignedBuf::reused(RECYCLE_MIN / 2).freeze(0, RECYCLE_MIN / 2);
        read_often(&small, LEND_AFTER_READS);
        assert_eq!(
            lendable(&small, usize::MAX),
            0,
            "buffers too small for the pool"
        );
        // A length that ends inside a page: everything up to its last whole page.
        let len = 3 * RECYCLE_MIN + 100;
        let bytes = AlignedBuf::reused(len).freeze(0, len);
        assert_eq!(lendable(&bytes, usize::MAX), 0, "not read yet");
        read_often(&bytes, LEND_AFTER_READS);
        let whole = lendable(&bytes, usize::MAX);
        assert!(whole >= 3 * RECYCLE_MIN && whole <= len, "{whole}");
        assert_eq!(lendable(&bytes[ALIGN..], usize::MAX), whole - ALIGN);
        assert_eq!(
            lendable(&bytes[..ALIGN], usize::MAX),
            ALIGN,
            "no further than asked"
        );
        // Only of buffers made for values up to the length asked, wherever the bytes lie in one.
        assert_eq!(lendable(&bytes, len), whole);
        assert_eq!(lendable(&bytes[ALIGN..2 * ALIGN], len), ALIGN);
        assert_eq!(lendable(&bytes, len - 1), 0, "made for a larger value");
        assert_eq!(
            lendable(&bytes[..ALIGN], len - 1),
            0,
            "a small slice of it too"
        );
    }

    #[test]
    fn an_assembly_hands_out_what_it_wrote_and_then_the_whole_value_without_a_copy() {
        // A length no other test uses, so the pool hands this test's buffer back to it.
        let len = 4 * RECYCLE_MIN + 9 * ALIGN + 5;
        let whole: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        // A recycled buffer of this length full of other bytes: the assembly must write all.
        let mut old = AlignedBuf::reused(len);
        old.as_mut_slice().fill(0xEE);
        drop(old);
        let mut assembly = Assembly::new(len).expect("large enough to pool");
        let mut views = Vec::new();
        for chunk in whole.chunks(65_537) {
            let view = assembly.append(chunk).expect("room for it");
            assert_eq!(&view[..], chunk, "a view is the chunk's bytes");
            views.push(view);
        }
        assert!(assembly.append(b"x").is_none(), "no room past the value");
        let at = views[0].as_ptr();
        for pair in views.windows(2) {
            assert_eq!(
                pair[0].as_ptr().wrapping_add(pair[0].len()),
                pair[1].as_ptr()
            );
        }
        let value = assembly.finish().expect("every byte came");
        assert_eq!(&value[..], &whole[..]);
        assert_eq!(
            value.as_ptr(),
            at,
            "the value is the buffer its chunks were copied into"
        );
        assert_eq!(
            at as usize % ALIGN,
            0,
            "page-aligned, as the disk tier's writes need"
        );
        // Pooled again once the value and every view are gone.
        drop(views);
        drop(value);
        let again = AlignedBuf::reused(len);
        assert!(
            again.as_slice().as_ptr() == at || RECYCLED.take(len + ALIGN).is_some(),
            "the buffer went back to the pool"
        );
    }

    #[test]
    fn an_assembly_short_of_its_length_is_no_value_and_small_ones_are_not_made() {
        let len = 2 * RECYCLE_MIN + 3;
        let mut assembly = Assembly::new(len).expect("large enough to pool");
        let view = assembly.append(&vec![7u8; len - 1]).expect("room");
        assert!(
            assembly.append(&[1, 2]).is_none(),
            "a chunk longer than the room left"
        );
        assert!(assembly.finish().is_none(), "one byte never came");
        assert!(view.iter().all(|&b| b == 7), "its views stay valid");
        assert!(Assembly::new(RECYCLE_MIN - 1).is_none());
    }

    #[test]
    fn concat_joins_chunks_in_order_into_a_reused_buffer_when_large() {
        // Lengths no other test uses, so this test's buffers are its own.
        for len in [5000, 5 * RECYCLE_MIN + 3 * ALIGN + 17] {
            let whole: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let chunks: Vec<Bytes> = whole.chunks(7919).map(Bytes::copy_from_slice).collect();
            // A recycled buffer of this length full of other bytes: concat must overwrite all.
            let mut old = AlignedBuf::reused(len);
            old.as_mut_slice().fill(0xEE);
            drop(old);
            let joined = concat(&chunks);
            assert_eq!(&joined[..], &whole[..]);
        }
        assert!(concat(&[]).is_empty());
        let one = Bytes::from_static(b"one");
        assert_eq!(
            concat(std::slice::from_ref(&one)).as_ptr(),
            one.as_ptr(),
            "no copy"
        );
    }
}
