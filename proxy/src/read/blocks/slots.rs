//! The fetch budget (`upstream_concurrency`) and the responses' buffer (`response_buffer`), in
//! which the block a response starts with goes before the blocks responses open ahead of the
//! one they send.
//!
//! A response opens up to `read_window` blocks ahead of the one it sends, so a few large cold
//! reads can hold every slot and queue more. With one first-come-first-served queue, a new
//! reader's first block waited behind all the blocks they asked for ahead, although none of
//! their readers was waiting for those yet: half a second and more (docs/benchmarks.md, "A new
//! reader's first byte under load"). Two rules now:
//! - a freed slot goes to a waiting first block before a waiting block ahead (except every
//!   [`AHEAD_EVERY`]th while both wait, so a stream of first blocks cannot starve the others);
//! - blocks ahead hold at most seven eighths of the slots, so that a new reader usually finds
//!   one free instead of waiting for the next to be freed. A larger share kept back cost large
//!   reads their parallelism when no new reader came (a quarter made them about 20 % slower
//!   where the budget, not the network, was the limit); priority alone left new readers
//!   waiting for the next block to finish, 230 to 385 ms at the benchmark's p50.
//!
//! The responses' buffer is the same queue with weights: a block takes one unit per KiB, so
//! a new reader's first block does not wait behind the blocks some fourteen large reads hold
//! open ahead of the ones they send either. Blocks further ahead than their response's next
//! take only room to spare ([`Slots::acquire_spare`]: at most half, in a queue of their own
//! served while nobody else waits), and take their turn with the others only once they are
//! next: otherwise readers that take their bytes slowly hold the buffer, and the next blocks
//! of every other response queue behind theirs. Within a turn, waiters are served in the order
//! they came. Across turns they are not, so a response asks room for a block only once the
//! block before has its own (`BlockStore::read_as`): room is given back when a block is sent,
//! and a later block holding room its response's next block waits for would never be.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

/// Whether a fetch is for a block a reader waits for first, or one opened ahead of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// The first block of a response, or a block another replica asked for (which may be
    /// its reader's first).
    First,
    /// A block opened ahead of the one a response sends, read ahead across requests, warmed,
    /// or a further piece of a cold range.
    Ahead,
}

/// While both kinds wait, one freed slot in this many goes to a block ahead.
const AHEAD_EVERY: u32 = 4;

/// A budget of `n` units, handed out in order within each [`Turn`], first blocks first, at
/// most `n - n / 8` of them to blocks ahead. A handle: clones share one budget.
#[derive(Clone)]
pub(super) struct Slots {
    state: Arc<parking_lot::Mutex<State>>,
}

/// One waiter: the sending half of its wake-up, and the units it waits for.
struct Waiter {
    woken: oneshot::Sender<()>,
    units: usize,
}

struct State {
    free: usize,
    /// Units blocks ahead hold, and the most they may.
    ahead_held: usize,
    ahead_most: usize,
    /// Units blocks further ahead than their response's next one hold as room to spare (a part
    /// of `ahead_held`), and the most they may.
    spare_held: usize,
    spare_most: usize,
    /// Who waits, by [`Turn`]. A waiter that gives up closes its wake-up, and is then dropped
    /// from here (and skipped if its turn came).
    first: VecDeque<Waiter>,
    ahead: VecDeque<Waiter>,
    /// Blocks further ahead waiting for room to spare, served only while nobody else waits.
    spare: VecDeque<Waiter>,
    /// Hand-outs to first blocks in a row while blocks ahead waited.
    firsts_in_a_row: u32,
}

/// `units` of a [`Slots`], held until dropped (a fetch: until its body is complete; a block
/// in the responses' buffer: until its slice has been sent).
pub(super) struct Slot {
    slots: Slots,
    turn: Turn,
    units: usize,
    /// Taken as room to spare ([`Slots::acquire_spare`]).
    spare: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.release(self.turn, self.units, self.spare);
    }
}

impl State {
    /// Whether `units` taking `turn` may be had now.
    fn may_take(&self, turn: Turn, units: usize) -> bool {
        // Blocks ahead may always take room when they hold none: a block larger than their
        // share (a buffer of one block) would otherwise never get it.
        self.free >= units
            && (turn == Turn::First
                || self.ahead_held == 0
                || self.ahead_held + units <= self.ahead_most)
    }

    /// Whether `units` of room to spare may be had now, waiters aside.
    fn may_spare(&self, units: usize) -> bool {
        self.spare_held + units <= self.spare_most && self.may_take(Turn::Ahead, units)
    }

    fn take(&mut self, turn: Turn, units: usize) {
        self.free -= units;
        if turn == Turn::Ahead {
            self.ahead_held += units;
        }
    }

    fn queue(&mut self, turn: Turn) -> &mut VecDeque<Waiter> {
        match turn {
            Turn::First => &mut self.first,
            Turn::Ahead => &mut self.ahead,
        }
    }

    /// Whether the first waiter of `turn` (if any) fits now.
    fn head_fits(&self, turn: Turn) -> bool {
        let queue = match turn {
            Turn::First => &self.first,
            Turn::Ahead => &self.ahead,
        };
        queue.front().is_some_and(|w| self.may_take(turn, w.units))
    }

    /// Free units to the waiters whose turn it is: first blocks and blocks ahead, and room to
    /// spare once neither waits.
    fn hand_out(&mut self) {
        self.hand_out_turns();
        while self.first.is_empty() && self.ahead.is_empty() {
            if !self.spare.front().is_some_and(|w| self.may_spare(w.units)) {
                return;
            }
            let Some(waiter) = self.spare.pop_front() else {
                return;
            };
            if waiter.woken.send(()).is_ok() {
                self.take(Turn::Ahead, waiter.units);
                self.spare_held += waiter.units;
            }
        }
    }

    /// Free units to first blocks and blocks ahead, each in its turn.
    fn hand_out_turns(&mut self) {
        loop {
            let first = self.head_fits(Turn::First);
            // A first block waiting for more room than is free holds the blocks ahead back
            // too: were they let past, a stream of them could keep it waiting for good.
            let ahead = self.head_fits(Turn::Ahead) && (first || self.first.is_empty());
            let turn = match (first, ahead) {
                (true, true) if self.firsts_in_a_row + 1 >= AHEAD_EVERY => Turn::Ahead,
                (true, _) => Turn::First,
                (false, true) => Turn::Ahead,
                (false, false) => return,
            };
            match turn {
                Turn::First => self.firsts_in_a_row += u32::from(ahead),
                Turn::Ahead => self.firsts_in_a_row = 0,
            }
            let Some(waiter) = self.queue(turn).pop_front() else {
                return;
            };
            // Handed over, unless that waiter gave up: then the next.
            if waiter.woken.send(()).is_ok() {
                self.take(turn, waiter.units);
            }
        }
    }
}

impl Slots {
    pub(super) fn new(n: usize) -> Self {
        Self {
            state: Arc::new(parking_lot::Mutex::new(State {
                free: n,
                ahead_held: 0,
                ahead_most: n - n / 8,
                spare_held: 0,
                spare_most: n / 2,
                first: VecDeque::new(),
                ahead: VecDeque::new(),
                spare: VecDeque::new(),
                firsts_in_a_row: 0,
            })),
        }
    }

    /// A slot for a fetch taking `turn`, waiting for one if none is free.
    pub(super) async fn acquire(&self, turn: Turn) -> Slot {
        self.acquire_units(turn, 1).await
    }

    /// `units` taking `turn`, waiting for them if they are not free.
    pub(super) async fn acquire_units(&self, turn: Turn, units: usize) -> Slot {
        let woken = {
            let mut state = self.state.lock();
            if let Some(slot) = self.take_now(&mut state, turn, units) {
                return slot;
            }
            let (tx, rx) = oneshot::channel();
            state.queue(turn).push_back(Waiter { woken: tx, units });
            rx
        };
        Wait {
            slots: self.clone(),
            turn,
            units,
            spare: false,
            woken: Some(woken),
        }
        .await
    }

    /// A slot for a fetch taking `turn` if it may have one now.
    pub(super) fn try_acquire(&self, turn: Turn) -> Option<Slot> {
        self.try_acquire_units(turn, 1)
    }

    /// `units` taking `turn` if they may be had now.
    pub(super) fn try_acquire_units(&self, turn: Turn, units: usize) -> Option<Slot> {
        self.take_now(&mut self.state.lock(), turn, units)
    }

    /// `units` for a block further ahead than its response's next one, only as room the budget
    /// can spare: such blocks hold at most half of it in all, and get it only while nobody
    /// else waits. They are sent last of those their responses hold, and slow readers hold
    /// them longest. Waiters for room to spare are served in the order they came, so a
    /// response that gives some back cannot take it again before others waiting for it.
    pub(super) async fn acquire_spare(&self, units: usize) -> Slot {
        let woken = {
            let mut state = self.state.lock();
            if let Some(slot) = self.spare_now(&mut state, units) {
                return slot;
            }
            let (tx, rx) = oneshot::channel();
            state.spare.push_back(Waiter { woken: tx, units });
            rx
        };
        Wait {
            slots: self.clone(),
            turn: Turn::Ahead,
            units,
            spare: true,
            woken: Some(woken),
        }
        .await
    }

    /// [`Slots::acquire_spare`] if the room may be had now.
    #[cfg(test)]
    fn try_acquire_spare(&self, units: usize) -> Option<Slot> {
        self.spare_now(&mut self.state.lock(), units)
    }

    fn spare_now(&self, state: &mut State, units: usize) -> Option<Slot> {
        let waiting = !state.first.is_empty() || !state.ahead.is_empty() || !state.spare.is_empty();
        if waiting || !state.may_spare(units) {
            return None;
        }
        state.take(Turn::Ahead, units);
        state.spare_held += units;
        Some(Slot {
            slots: self.clone(),
            turn: Turn::Ahead,
            units,
            spare: true,
        })
    }

    /// `units` taking `turn` now, unless they are not free or someone waits whose turn comes
    /// first: anyone of the same turn (who came earlier), or, for a block ahead, a first block.
    fn take_now(&self, state: &mut State, turn: Turn, units: usize) -> Option<Slot> {
        let waiting = match turn {
            Turn::First => !state.first.is_empty(),
            Turn::Ahead => !state.first.is_empty() || !state.ahead.is_empty(),
        };
        if waiting || !state.may_take(turn, units) {
            return None;
        }
        state.take(turn, units);
        Some(Slot {
            slots: self.clone(),
            turn,
            units,
            spare: false,
        })
    }

    /// `units` taking `turn`, given back: to the next waiters whose turn it is, or free.
    fn release(&self, turn: Turn, units: usize, spare: bool) {
        let mut state = self.state.lock();
        state.free += units;
        if turn == Turn::Ahead {
            state.ahead_held -= units;
        }
        if spare {
            state.spare_held -= units;
        }
        state.hand_out();
    }

    /// Units free now.
    pub(super) fn available(&self) -> usize {
        self.state.lock().free
    }
}

/// A wait for units, woken when [`Slots::release`] hands them over.
struct Wait {
    slots: Slots,
    turn: Turn,
    units: usize,
    spare: bool,
    woken: Option<oneshot::Receiver<()>>,
}

impl Future for Wait {
    type Output = Slot;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Slot> {
        let Some(woken) = self.woken.as_mut() else {
            unreachable!("polled after it was ready");
        };
        match Pin::new(woken).poll(cx) {
            Poll::Pending => Poll::Pending,
            // The sender is only dropped by sending, or with the budget itself, which outlives
            // its waiters: either way the units are this waiter's.
            Poll::Ready(_) => {
                self.woken = None;
                Poll::Ready(Slot {
                    slots: self.slots.clone(),
                    turn: self.turn,
                    units: self.units,
                    spare: self.spare,
                })
            }
        }
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        let Some(mut woken) = self.woken.take() else {
            return;
        };
        // Given up (the task waiting was dropped): nothing may be handed here from now on, and
        // what was handed already goes on to the next waiters.
        woken.close();
        if woken.try_recv().is_ok() {
            self.slots.release(self.turn, self.units, self.spare);
        }
        let mut state = self.slots.state.lock();
        state.first.retain(|w| !w.woken.is_closed());
        state.ahead.retain(|w| !w.woken.is_closed());
        state.spare.retain(|w| !w.woken.is_closed());
        // A waiter gone from the head of its queue may have held back others that fit now.
        state.hand_out();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn blocks_ahead_leave_an_eighth_of_the_slots_to_first_blocks() {
        let slots = Slots::new(8);
        let ahead: Vec<_> = (0..7)
            .map(|_| slots.try_acquire(Turn::Ahead).expect("seven of eight"))
            .collect();
        assert!(slots.try_acquire(Turn::Ahead).is_none(), "not the eighth");
        let mut waiting = Box::pin(slots.acquire(Turn::Ahead));
        assert!((&mut waiting).now_or_never().is_none());
        let first = slots.acquire(Turn::First).now_or_never();
        assert!(first.is_some(), "a first block finds it free");
        drop(first);
        assert!((&mut waiting).now_or_never().is_none(), "still kept back");
        drop(ahead);
        let got = waiting.now_or_never();
        assert!(got.is_some());
        assert_eq!(slots.available(), 7);
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_a_first_block_before_blocks_ahead_waiting_longer() {
        let slots = Slots::new(2);
        let held = [
            slots.try_acquire(Turn::First).unwrap(),
            slots.try_acquire(Turn::First).unwrap(),
        ];
        assert!(slots.try_acquire(Turn::First).is_none());
        let mut ahead = Box::pin(slots.acquire(Turn::Ahead));
        assert!((&mut ahead).now_or_never().is_none());
        let mut first = Box::pin(slots.acquire(Turn::First));
        assert!((&mut first).now_or_never().is_none());
        let [one, two] = held;
        drop(one);
        assert!(
            (&mut ahead).now_or_never().is_none(),
            "the first block's turn"
        );
        let first = first.now_or_never().expect("handed the freed slot");
        drop(two);
        let ahead = ahead.now_or_never().expect("then the block ahead");
        drop((first, ahead));
        assert_eq!(slots.available(), 2);
    }

    #[tokio::test]
    async fn blocks_ahead_get_one_slot_in_four_while_first_blocks_keep_coming() {
        let slots = Slots::new(1);
        let mut held = slots.try_acquire(Turn::First);
        let mut ahead = Box::pin(slots.acquire(Turn::Ahead));
        assert!((&mut ahead).now_or_never().is_none());
        for round in 0..3 {
            let mut first = Box::pin(slots.acquire(Turn::First));
            assert!((&mut first).now_or_never().is_none());
            drop(held.take());
            assert!((&mut ahead).now_or_never().is_none(), "round {round}");
            held = Some(first.now_or_never().expect("the first block's"));
        }
        let mut first = Box::pin(slots.acquire(Turn::First));
        drop(held.take());
        let ahead = ahead.now_or_never().expect("the fourth goes ahead");
        assert!((&mut first).now_or_never().is_none());
        drop(ahead);
        assert!(first.now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_first_block_waiting_for_more_room_than_is_free_holds_blocks_ahead_back() {
        let units = Slots::new(16);
        let held = units.try_acquire_units(Turn::First, 10).unwrap();
        let mut first = Box::pin(units.acquire_units(Turn::First, 8));
        assert!((&mut first).now_or_never().is_none(), "6 free");
        // Room for it, but it would take what the first block waits for.
        assert!(units.try_acquire_units(Turn::Ahead, 4).is_none());
        let mut ahead = Box::pin(units.acquire_units(Turn::Ahead, 4));
        assert!((&mut ahead).now_or_never().is_none());
        // Nor may a smaller block ahead pass the one waiting before it.
        assert!(units.try_acquire_units(Turn::Ahead, 1).is_none());
        drop(held);
        let first = first.now_or_never().expect("the first block's turn");
        let ahead = ahead
            .now_or_never()
            .expect("then, with 8 free, the block ahead");
        assert_eq!(units.available(), 4);
        drop((first, ahead));
        assert_eq!(units.available(), 16);
    }

    #[tokio::test]
    async fn a_block_ahead_larger_than_their_share_gets_room_when_they_hold_none() {
        // A buffer of one block: seven eighths of it would never hold a whole block.
        let units = Slots::new(8);
        let one = units.try_acquire_units(Turn::Ahead, 8).expect("all of it");
        assert!(units.try_acquire_units(Turn::Ahead, 1).is_none());
        drop(one);
        let part = units.try_acquire_units(Turn::Ahead, 4).unwrap();
        assert!(
            units.try_acquire_units(Turn::Ahead, 4).is_none(),
            "past their share"
        );
        assert!(units.try_acquire_units(Turn::First, 4).is_some());
        drop(part);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_passes_its_slot_on() {
        let slots = Slots::new(1);
        let held = slots.try_acquire(Turn::First).unwrap();
        let mut gone = Box::pin(slots.acquire(Turn::First));
        assert!((&mut gone).now_or_never().is_none());
        let mut next = Box::pin(slots.acquire(Turn::Ahead));
        assert!((&mut next).now_or_never().is_none());
        // Handed to a waiter that is dropped before it looks: it goes on to the next.
        drop(held);
        drop(gone);
        let next = next.now_or_never().expect("passed on");
        drop(next);
        assert_eq!(slots.available(), 1);
        // Dropped while waiting: nothing is handed to it.
        let held = slots.try_acquire(Turn::First).unwrap();
        let mut gone = Box::pin(slots.acquire(Turn::First));
        assert!((&mut gone).now_or_never().is_none());
        drop(gone);
        drop(held);
        assert_eq!(slots.available(), 1);
    }

    #[tokio::test]
    async fn room_to_spare_is_at_most_half_and_none_while_anyone_waits() {
        let units = Slots::new(16);
        let spare: Vec<_> = (0..2)
            .map(|_| units.try_acquire_spare(4).expect("within half"))
            .collect();
        assert!(units.try_acquire_spare(1).is_none(), "past half");
        let next = units
            .try_acquire_units(Turn::Ahead, 4)
            .expect("a next block still may");
        drop(spare);
        assert!(units.try_acquire_spare(8).is_some(), "given back");
        // Nothing is spare while anyone waits, however much is free.
        let mut waiting = Box::pin(units.acquire_units(Turn::First, 14));
        assert!((&mut waiting).now_or_never().is_none());
        assert!(
            units.try_acquire_spare(1).is_none(),
            "the waiter came first"
        );
        drop(waiting);
        assert!(units.try_acquire_spare(4).is_some());
        drop(next);
    }

    #[tokio::test]
    async fn room_to_spare_given_back_goes_to_who_waited_for_it_first() {
        let units = Slots::new(8);
        let held = units.try_acquire_spare(4).unwrap();
        let mut waiting = Box::pin(units.acquire_spare(2));
        assert!((&mut waiting).now_or_never().is_none(), "past half");
        drop(held);
        // Handed over on release: the one who gave it back cannot take it again first.
        assert!(units.try_acquire_spare(4).is_none());
        let got = waiting.now_or_never().expect("handed over");
        assert!(got.spare);
        assert!(units.try_acquire_spare(2).is_some());
        drop(got);
        assert_eq!(units.available(), 8);
        // A waiter for room to spare that gives up passes it on, and leaves the queue.
        let held = units.try_acquire_spare(4).unwrap();
        let mut gone = Box::pin(units.acquire_spare(4));
        assert!((&mut gone).now_or_never().is_none());
        drop(held);
        drop(gone);
        assert!(
            units.try_acquire_spare(4).is_some(),
            "not held by the waiter that went"
        );
        assert_eq!(units.available(), 8);
    }
}
