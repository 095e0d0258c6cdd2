//! Single-flight fetches whose waiters stream the bytes as they arrive.
//!
//! The first caller to [`SingleFlight::join`] a key becomes the leader and gets a
//! [`FlightWriter`]; everyone who joins the same key before the writer is dropped gets a
//! [`FlightReader`] on the same flight. Readers see every chunk as soon as the writer pushes it,
//! so a reader of a cold block gets its first byte when the upstream delivers it, not when the
//! block is complete.
//!
//! The writer is meant to be driven by a task of its own (not by the leader's client request),
//! so a client that disconnects does not cancel the fetch for the others. Whatever happens to
//! the writer — finished, failed, or dropped half-way by a panic or cancellation — every reader
//! gets an outcome: nobody waits forever. A failed flight leaves the map at once, so the next
//! caller becomes a new leader.
//!
//! Memory is bounded by what one flight fetches (a block): the chunks live in the flight until
//! the last reader is done with it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::buffers::Assembly;

/// The error readers see when the writer was dropped without finishing (its task was cancelled
/// or panicked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the fetch was abandoned before it completed")]
pub struct Abandoned;

/// A table of flights in progress, keyed by `K`, failing with `E`.
pub struct SingleFlight<K, E> {
    flights: Arc<Mutex<HashMap<K, Arc<Flight<E>>>>>,
}

impl<K, E> Clone for SingleFlight<K, E> {
    fn clone(&self) -> Self {
        Self {
            flights: self.flights.clone(),
        }
    }
}

impl<K, E> Default for SingleFlight<K, E> {
    fn default() -> Self {
        Self {
            flights: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

struct Flight<E> {
    state: Mutex<State<E>>,
    progress: Notify,
}

struct State<E> {
    chunks: Vec<Bytes>,
    outcome: Option<Result<(), Failure<E>>>,
    /// Readers that took the first chunk: who read the value as it was fetched, not who merely
    /// joined (a read-ahead's leader and a caller that only checks for a flight read nothing).
    readers: u32,
}

// `Drop` cannot require `E: From<Abandoned>` without putting the bound on the struct, so an
// abandoned flight is recorded as such and readers turn it into an `E`.
enum Failure<E> {
    Error(E),
    Abandoned,
}

/// What [`SingleFlight::join`] gives a caller.
pub enum Joined<K: Hash + Eq + Clone, E: Clone + From<Abandoned>> {
    /// No flight was running for the key: the caller must drive `writer` (in a task of its own)
    /// and may read its own flight through `reader`.
    Leader {
        /// Feeds the flight.
        writer: FlightWriter<K, E>,
        /// Reads the flight like any follower.
        reader: FlightReader<E>,
    },
    /// A flight was already running; this reader sees all of its bytes from the first.
    Follower(FlightReader<E>),
}

impl<K, E> SingleFlight<K, E>
where
    K: Hash + Eq + Clone,
    E: Clone + From<Abandoned>,
{
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Join the flight for `key`, starting one if none is running.
    pub fn join(&self, key: K) -> Joined<K, E> {
        let mut flights = self.flights.lock();
        if let Some(flight) = flights.get(&key) {
            return Joined::Follower(FlightReader {
                flight: flight.clone(),
                next: 0,
            });
        }
        let flight = Arc::new(Flight {
            state: Mutex::new(State {
                chunks: Vec::new(),
                outcome: None,
                readers: 0,
            }),
            progress: Notify::new(),
        });
        flights.insert(key.clone(), flight.clone());
        Joined::Leader {
            writer: FlightWriter {
                key,
                flight: flight.clone(),
                flights: self.flights.clone(),
                assembly: Mutex::new(None),
            },
            reader: FlightReader { flight, next: 0 },
        }
    }

    /// Whether a flight for `key` is in progress.
    pub fn contains(&self, key: &K) -> bool {
        self.flights.lock().contains_key(key)
    }

    /// Number of flights in progress.
    pub fn in_flight(&self) -> usize {
        self.flights.lock().len()
    }
}

/// The leader's handle on a flight. Dropping it ends the flight: a flight not finished by then
/// fails with [`Abandoned`].
pub struct FlightWriter<K: Hash + Eq, E> {
    key: K,
    flight: Arc<Flight<E>>,
    flights: Arc<Mutex<HashMap<K, Arc<Flight<E>>>>>,
    /// The value being assembled as it arrives ([`FlightWriter::assemble`]): touched only by the
    /// writer, so its lock is never contended, and the copy into it is made outside the
    /// flight's lock, which readers take.
    /// (Boxed: only block fetches assemble, and a flight's handle is moved about.)
    assembly: Mutex<Option<Box<Assembling>>>,
}

/// A value being assembled. Its first chunk is handed to the readers as it came, and copied in
/// when the second comes (or at the finish): the reader it wakes, the first byte of a cold read,
/// need not wait for its copy (docs/benchmarks.md, "A cold read's first chunk handed on before
/// its copy"). Every later chunk is copied in as it comes, while it is in the CPU's caches.
struct Assembling {
    assembly: Assembly,
    /// A chunk was pushed.
    begun: bool,
    /// The first chunk, until it is copied in.
    first: Option<Bytes>,
}

impl<K: Hash + Eq, E: Clone> FlightWriter<K, E> {
    /// Hand `chunk` to every reader. While the value is being assembled
    /// ([`FlightWriter::assemble`]), they get a copy of it in the assembly (the first chunk:
    /// once the second is pushed), and `chunk` itself is let go once they are done with it; a
    /// chunk past the length announced ends the assembly, and the value is joined at the end as
    /// if there had been none.
    pub fn push(&self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        let mut assembling = self.assembly.lock();
        let chunk = match assembling.as_deref_mut() {
            Some(a) if !a.begun => {
                a.begun = true;
                a.first = Some(chunk.clone());
                chunk
            }
            Some(_) => {
                self.copy_first(&mut assembling);
                match assembling.as_mut().map(|a| a.assembly.append(&chunk)) {
                    Some(Some(copy)) => copy,
                    Some(None) => {
                        *assembling = None;
                        chunk
                    }
                    None => chunk,
                }
            }
            None => chunk,
        };
        self.flight.state.lock().chunks.push(chunk);
        self.flight.progress.notify_waiters();
    }

    /// Copy the first chunk, handed on as it came, into the assembly, and put the copy in its
    /// place among the flight's chunks; or end the assembly if it does not fit.
    fn copy_first(&self, assembling: &mut Option<Box<Assembling>>) {
        let Some(first) = assembling.as_mut().and_then(|a| a.first.take()) else {
            return;
        };
        match assembling.as_mut().and_then(|a| a.assembly.append(&first)) {
            Some(copy) => self.flight.state.lock().chunks[0] = copy,
            None => *assembling = None,
        }
    }

    /// Assemble the value, announced as `len` bytes, in one buffer as its chunks are pushed, so
    /// that [`FlightWriter::finish`] need not join them ([`Assembly`]). Only from the first
    /// chunk, and only once: nothing happens once a chunk was pushed or an assembly begun. Only
    /// for values large enough to pool.
    pub fn assemble(&self, len: usize) {
        let mut assembling = self.assembly.lock();
        if assembling.is_none() && self.flight.state.lock().chunks.is_empty() {
            *assembling = Assembly::new(len).map(|assembly| {
                Box::new(Assembling {
                    assembly,
                    begun: false,
                    first: None,
                })
            });
        }
    }

    /// Another reader of this flight, seeing every chunk from the first.
    pub fn reader(&self) -> FlightReader<E> {
        FlightReader {
            flight: self.flight.clone(),
            next: 0,
        }
    }

    /// How many readers have read the flight so far (took its first chunk): more than one, and
    /// the value was wanted again while it was fetched, as a herd's block is.
    pub fn readers(&self) -> u32 {
        self.flight.state.lock().readers
    }

    /// Complete the flight without building its bytes into one buffer: for a value that is
    /// not cached, whose readers have the chunks.
    pub fn end(&mut self) {
        self.flight.state.lock().outcome = Some(Ok(()));
        self.flight.progress.notify_waiters();
    }

    /// Complete the flight and return all its bytes as one buffer, ready to be cached.
    ///
    /// The flight stays joinable (as a finished flight) until the writer is dropped, so the
    /// leader can insert the bytes into the cache first and drop the writer after: a caller
    /// arriving in between finds the finished flight instead of starting a second fetch.
    pub fn finish(&mut self) -> Bytes {
        let assembled = {
            let mut assembling = self.assembly.lock();
            self.copy_first(&mut assembling);
            assembling.take().and_then(|a| a.assembly.finish())
        };
        // The chunks are joined outside the lock and after the readers are woken: joining a
        // large value is a copy of all of it (milliseconds for 8 MiB), and a reader taking
        // its last chunks meanwhile would otherwise wait on the lock, its worker thread with it.
        let chunks = {
            let mut state = self.flight.state.lock();
            state.outcome = Some(Ok(()));
            match assembled {
                Some(_) => Vec::new(),
                None => state.chunks.clone(),
            }
        };
        self.flight.progress.notify_waiters();
        assembled.unwrap_or_else(|| crate::buffers::concat(&chunks))
    }

    /// Fail the flight: every reader gets `error`, and the next caller starts a new flight.
    pub fn fail(self, error: E) {
        self.flight
            .state
            .lock()
            .outcome
            .get_or_insert(Err(Failure::Error(error)));
        // Drop removes the entry and wakes the readers.
    }
}

impl<K: Hash + Eq, E> Drop for FlightWriter<K, E> {
    fn drop(&mut self) {
        {
            let mut flights = self.flights.lock();
            if flights
                .get(&self.key)
                .is_some_and(|f| Arc::ptr_eq(f, &self.flight))
            {
                flights.remove(&self.key);
            }
        }
        let mut state = self.flight.state.lock();
        if state.outcome.is_none() {
            state.outcome = Some(Err(Failure::Abandoned));
        }
        drop(state);
        self.flight.progress.notify_waiters();
    }
}

/// A reader of one flight. Each reader sees every chunk, in order, from the first.
pub struct FlightReader<E> {
    flight: Arc<Flight<E>>,
    next: usize,
}

impl<E: Clone + From<Abandoned>> FlightReader<E> {
    /// The next chunk, `None` once the flight finished and every chunk was read, or the flight's
    /// error.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, E>> {
        loop {
            let notified = self.flight.progress.notified();
            tokio::pin!(notified);
            // Register before looking, so a push between the look and the await is not missed.
            notified.as_mut().enable();
            {
                let mut state = self.flight.state.lock();
                if let Some(chunk) = state.chunks.get(self.next).cloned() {
                    if self.next == 0 {
                        state.readers = state.readers.saturating_add(1);
                    }
                    self.next += 1;
                    return Some(Ok(chunk));
                }
                match &state.outcome {
                    Some(Ok(())) => return None,
                    Some(Err(Failure::Error(e))) => return Some(Err(e.clone())),
                    Some(Err(Failure::Abandoned)) => return Some(Err(Abandoned.into())),
                    None => {}
                }
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum TestError {
        Upstream(&'static str),
        Abandoned,
    }
    impl From<Abandoned> for TestError {
        fn from(_: Abandoned) -> Self {
            TestError::Abandoned
        }
    }

    type Table = SingleFlight<&'static str, TestError>;

    async fn read_all(mut reader: FlightReader<TestError>) -> Result<Vec<u8>, TestError> {
        let mut out = Vec::new();
        while let Some(chunk) = reader.next_chunk().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    /// Join `key`, and if leading, run `fetch` in a task of its own, like the proxy does.
    fn join_and_fetch<F>(
        table: &Table,
        key: &'static str,
        fetches: Arc<AtomicUsize>,
        fetch: F,
    ) -> FlightReader<TestError>
    where
        F: FnOnce(FlightWriter<&'static str, TestError>) -> tokio::task::JoinHandle<()>,
    {
        match table.join(key) {
            Joined::Leader { writer, reader } => {
                fetches.fetch_add(1, Ordering::SeqCst);
                drop(fetch(writer));
                reader
            }
            Joined::Follower(reader) => reader,
        }
    }

    #[tokio::test]
    async fn many_waiters_share_one_fetch() {
        let table = Table::new();
        let fetches = Arc::new(AtomicUsize::new(0));
        let mut readers = Vec::new();
        for _ in 0..64 {
            readers.push(join_and_fetch(&table, "k", fetches.clone(), |mut w| {
                tokio::spawn(async move {
                    for i in 0..10u8 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        w.push(Bytes::from(vec![i; 100]));
                    }
                    let all = w.finish();
                    assert_eq!(all.len(), 1000);
                })
            }));
        }
        let expected: Vec<u8> = (0..10u8).flat_map(|i| vec![i; 100]).collect();
        for r in readers {
            assert_eq!(read_all(r).await.unwrap(), expected);
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        assert_eq!(table.in_flight(), 0);
    }

    #[tokio::test]
    async fn waiters_get_bytes_before_the_fetch_completes() {
        let table = Table::new();
        let Joined::Leader { mut writer, .. } = table.join("k") else {
            panic!("expected leader")
        };
        let Joined::Follower(mut follower) = table.join("k") else {
            panic!("expected follower")
        };
        writer.push(Bytes::from_static(b"first"));
        let first = tokio::time::timeout(Duration::from_secs(5), follower.next_chunk()).await;
        assert_eq!(
            first.unwrap().unwrap().unwrap(),
            Bytes::from_static(b"first")
        );
        // The fetch is still running: the next read waits.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), follower.next_chunk())
                .await
                .is_err()
        );
        writer.push(Bytes::from_static(b"second"));
        assert_eq!(writer.finish(), Bytes::from_static(b"firstsecond"));
        drop(writer);
        assert_eq!(
            follower.next_chunk().await.unwrap().unwrap(),
            Bytes::from_static(b"second")
        );
        assert!(follower.next_chunk().await.is_none());
    }

    #[tokio::test]
    async fn leader_disconnect_does_not_stop_the_fetch() {
        let table = Table::new();
        let fetches = Arc::new(AtomicUsize::new(0));
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let leader_reader = join_and_fetch(&table, "k", fetches.clone(), |mut w| {
            tokio::spawn(async move {
                w.push(Bytes::from_static(b"abc"));
                let _ = go_rx.await;
                w.push(Bytes::from_static(b"def"));
                w.finish();
            })
        });
        let follower = join_and_fetch(&table, "k", fetches.clone(), |_| {
            unreachable!("second fetch")
        });
        // The leader's client goes away mid-flight.
        drop(leader_reader);
        go_tx.send(()).unwrap();
        assert_eq!(read_all(follower).await.unwrap(), b"abcdef");
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn failure_reaches_every_waiter_and_the_next_caller_leads() {
        let table = Table::new();
        let Joined::Leader { writer, reader } = table.join("k") else {
            panic!("expected leader")
        };
        let followers: Vec<_> = (0..8)
            .map(|_| match table.join("k") {
                Joined::Follower(r) => r,
                Joined::Leader { .. } => panic!("expected follower"),
            })
            .collect();
        writer.push(Bytes::from_static(b"partial"));
        writer.fail(TestError::Upstream("503"));
        assert_eq!(read_all(reader).await, Err(TestError::Upstream("503")));
        for f in followers {
            assert_eq!(read_all(f).await, Err(TestError::Upstream("503")));
        }
        assert!(matches!(table.join("k"), Joined::Leader { .. }));
    }

    #[tokio::test]
    async fn a_dropped_writer_never_leaves_waiters_hanging() {
        let table = Table::new();
        let fetches = Arc::new(AtomicUsize::new(0));
        let reader = join_and_fetch(&table, "k", fetches.clone(), |w| {
            tokio::spawn(async move {
                w.push(Bytes::from_static(b"x"));
                panic!("fetch task dies");
            })
        });
        let follower = join_and_fetch(&table, "k", fetches.clone(), |_| unreachable!());
        let outcome = tokio::time::timeout(Duration::from_secs(5), read_all(follower))
            .await
            .unwrap();
        assert_eq!(outcome, Err(TestError::Abandoned));
        assert_eq!(read_all(reader).await, Err(TestError::Abandoned));
        assert_eq!(table.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_finished_flight_stays_joinable_until_the_writer_is_dropped() {
        let table = Table::new();
        let Joined::Leader { mut writer, .. } = table.join("k") else {
            panic!("expected leader")
        };
        writer.push(Bytes::from_static(b"done"));
        writer.finish();
        let Joined::Follower(late) = table.join("k") else {
            panic!("expected follower")
        };
        drop(writer);
        assert_eq!(read_all(late).await.unwrap(), b"done");
        assert!(matches!(table.join("k"), Joined::Leader { .. }));
    }

    #[tokio::test]
    async fn an_ended_flight_reaches_every_reader_and_another_reader_sees_it_all() {
        let table = Table::new();
        let Joined::Leader { mut writer, reader } = table.join("k") else {
            panic!("expected leader")
        };
        writer.push(Bytes::from_static(b"ab"));
        // A reader made after the first chunk still sees it.
        let second = writer.reader();
        writer.push(Bytes::from_static(b"cd"));
        writer.end();
        drop(writer);
        assert_eq!(read_all(reader).await.unwrap(), b"abcd");
        assert_eq!(read_all(second).await.unwrap(), b"abcd");
        assert_eq!(table.in_flight(), 0);
    }

    fn chunked(len: usize, step: usize) -> (Vec<u8>, Vec<Bytes>) {
        let whole: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
        let chunks = whole.chunks(step).map(Bytes::copy_from_slice).collect();
        (whole, chunks)
    }

    /// The leader of a new flight assembling `len` bytes, its reader, and those bytes, whole and
    /// in chunks of `step`.
    fn assembling(
        len: usize,
        step: usize,
    ) -> (
        FlightWriter<u32, TestError>,
        FlightReader<TestError>,
        Vec<u8>,
        Vec<Bytes>,
    ) {
        let flights: SingleFlight<u32, TestError> = SingleFlight::new();
        let Joined::Leader { writer, reader } = flights.join(1) else {
            panic!("first caller leads");
        };
        writer.assemble(len);
        let (whole, chunks) = chunked(len, step);
        (writer, reader, whole, chunks)
    }

    #[tokio::test]
    async fn an_assembled_flight_finishes_with_the_buffer_its_readers_read() {
        let len = 300_007;
        let (mut writer, mut reader, whole, chunks) = assembling(len, 40_000);
        for c in &chunks {
            writer.push(c.clone());
        }
        let mut read = Vec::new();
        let first = reader
            .next_chunk()
            .await
            .expect("a chunk")
            .expect("no error");
        read.extend_from_slice(&first);
        assert_ne!(first.as_ptr(), chunks[0].as_ptr(), "readers get the copy");
        let value = writer.finish();
        while let Some(c) = reader.next_chunk().await {
            read.extend_from_slice(&c.expect("no error"));
        }
        assert_eq!(read, whole);
        assert_eq!(&value[..], &whole[..]);
        assert_eq!(
            value.as_ptr(),
            first.as_ptr(),
            "not joined: the value is the buffer the chunks were copied into"
        );
    }

    #[tokio::test]
    async fn an_assembly_hands_on_its_first_chunk_as_it_came_and_later_readers_its_copy() {
        let len = 100_000;
        let (mut writer, mut reader, whole, chunks) = assembling(len, 40_000);
        writer.push(chunks[0].clone());
        let first = reader
            .next_chunk()
            .await
            .expect("a chunk")
            .expect("no error");
        assert_eq!(
            first.as_ptr(),
            chunks[0].as_ptr(),
            "handed on before its copy"
        );
        writer.push(chunks[1].clone());
        let second = reader
            .next_chunk()
            .await
            .expect("a chunk")
            .expect("no error");
        assert_eq!(second, chunks[1]);
        assert_ne!(
            second.as_ptr(),
            chunks[1].as_ptr(),
            "every later chunk is copied in as it comes"
        );
        let mut late = writer.reader();
        let copied = late.next_chunk().await.expect("a chunk").expect("no error");
        assert_eq!(copied, chunks[0]);
        assert_ne!(
            copied.as_ptr(),
            chunks[0].as_ptr(),
            "copied in once the second came"
        );
        writer.push(chunks[2].clone());
        let value = writer.finish();
        assert_eq!(&value[..], &whole[..]);
        assert_eq!(value.as_ptr(), copied.as_ptr(), "not joined");
        for (mut r, mut read) in [(reader, [first, second].concat()), (late, copied.to_vec())] {
            while let Some(c) = r.next_chunk().await {
                read.extend_from_slice(&c.expect("no error"));
            }
            assert_eq!(read, whole);
        }
    }

    #[tokio::test]
    async fn a_flight_whose_bytes_do_not_match_its_assembly_is_joined_as_before() {
        let len = 200_003;
        let (whole, chunks) = chunked(len, 30_000);
        // Announced shorter than what came: the assembly ends, the value is joined.
        let flights: SingleFlight<u32, TestError> = SingleFlight::new();
        let Joined::Leader { mut writer, .. } = flights.join(1) else {
            panic!("first caller leads");
        };
        writer.assemble(len - 1);
        for c in &chunks {
            writer.push(c.clone());
        }
        assert_eq!(&writer.finish()[..], &whole[..]);
        // Asked after the first chunk: nothing is assembled, the value is joined.
        let Joined::Leader { mut writer, .. } = flights.join(2) else {
            panic!("first caller leads");
        };
        writer.push(chunks[0].clone());
        writer.assemble(len);
        for c in &chunks[1..] {
            writer.push(c.clone());
        }
        assert_eq!(&writer.finish()[..], &whole[..]);
        // Fewer bytes than announced: joined from what came.
        let Joined::Leader { mut writer, .. } = flights.join(3) else {
            panic!("first caller leads");
        };
        writer.assemble(len + 10);
        for c in &chunks {
            writer.push(c.clone());
        }
        assert_eq!(&writer.finish()[..], &whole[..]);
    }

    #[tokio::test]
    async fn a_flight_counts_the_readers_that_read_it_not_those_that_only_joined() {
        let table = Table::new();
        let Joined::Leader {
            mut writer,
            reader: leader,
        } = table.join("k")
        else {
            panic!("first caller leads");
        };
        let Joined::Follower(mut follower) = table.join("k") else {
            panic!("second caller follows");
        };
        // Joined and gone without reading (a caller that only checked for a flight).
        let Joined::Follower(idle) = table.join("k") else {
            panic!("third caller follows");
        };
        drop(idle);
        assert_eq!(writer.readers(), 0);
        writer.push(Bytes::from_static(b"ab"));
        writer.push(Bytes::from_static(b"cd"));
        follower.next_chunk().await.unwrap().unwrap();
        follower.next_chunk().await.unwrap().unwrap();
        // Counted once, on its first chunk.
        assert_eq!(writer.readers(), 1);
        // The leader's own reader counts when it reads, as any other.
        let leader = tokio::spawn(read_all(leader));
        writer.finish();
        assert_eq!(leader.await.unwrap().unwrap(), b"abcd");
        assert_eq!(writer.readers(), 2);
    }
}
