//! The fetch budget (`upstream_concurrency`), in which the block a response starts with goes
//! before the blocks responses open ahead of the one they send.
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

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
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

/// A fetch budget of `n` slots, handed out in order within each [`Turn`], first blocks first,
/// at most `n - n / 8` of them to blocks ahead.
pub(super) struct Slots {
    state: parking_lot::Mutex<State>,
}

struct State {
    free: usize,
    /// Slots blocks ahead hold, and the most they may.
    ahead_held: usize,
    ahead_most: usize,
    /// Who waits, by [`Turn`]: the sending half of each waiter's wake-up. A waiter that gives
    /// up closes its own, which is then dropped from here (and skipped if its turn came).
    first: VecDeque<oneshot::Sender<()>>,
    ahead: VecDeque<oneshot::Sender<()>>,
    /// Slots handed to first blocks in a row while blocks ahead waited.
    firsts_in_a_row: u32,
}

/// One slot of a [`Slots`], held until its fetch's body is complete.
pub(super) struct Slot<'a> {
    slots: &'a Slots,
    turn: Turn,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.slots.release(self.turn);
    }
}

impl State {
    /// Whether a fetch taking `turn` may have a free slot now.
    fn may_take(&self, turn: Turn) -> bool {
        self.free > 0 && (turn == Turn::First || self.ahead_held < self.ahead_most)
    }

    fn take(&mut self, turn: Turn) {
        self.free -= 1;
        if turn == Turn::Ahead {
            self.ahead_held += 1;
        }
    }

    /// Free slots to the waiters whose turn it is.
    fn hand_out(&mut self) {
        loop {
            let first = !self.first.is_empty() && self.may_take(Turn::First);
            let ahead = !self.ahead.is_empty() && self.may_take(Turn::Ahead);
            let turn = match (first, ahead) {
                (true, true) if self.firsts_in_a_row + 1 >= AHEAD_EVERY => Turn::Ahead,
                (true, _) => Turn::First,
                (false, true) => Turn::Ahead,
                (false, false) => return,
            };
            let waiter = match turn {
                Turn::First => {
                    self.firsts_in_a_row += u32::from(ahead);
                    self.first.pop_front()
                }
                Turn::Ahead => {
                    self.firsts_in_a_row = 0;
                    self.ahead.pop_front()
                }
            };
            // Handed over, unless that waiter gave up: then the next.
            if waiter.is_some_and(|w| w.send(()).is_ok()) {
                self.take(turn);
            }
        }
    }
}

impl Slots {
    pub(super) fn new(n: usize) -> Self {
        Self {
            state: parking_lot::Mutex::new(State {
                free: n,
                ahead_held: 0,
                ahead_most: n - n / 8,
                first: VecDeque::new(),
                ahead: VecDeque::new(),
                firsts_in_a_row: 0,
            }),
        }
    }

    /// A slot for a fetch taking `turn`, waiting for one if none is free.
    pub(super) async fn acquire(&self, turn: Turn) -> Slot<'_> {
        let woken = {
            let mut state = self.state.lock();
            // A slot this fetch may take is only free while nobody of its turn waits: a freed
            // slot goes to a waiter first.
            if state.may_take(turn) {
                state.take(turn);
                return Slot { slots: self, turn };
            }
            let (tx, rx) = oneshot::channel();
            match turn {
                Turn::First => state.first.push_back(tx),
                Turn::Ahead => state.ahead.push_back(tx),
            }
            rx
        };
        Wait {
            slots: self,
            turn,
            woken: Some(woken),
        }
        .await
    }

    /// A slot for a fetch taking `turn` if it may have one now.
    pub(super) fn try_acquire(&self, turn: Turn) -> Option<Slot<'_>> {
        let mut state = self.state.lock();
        if !state.may_take(turn) {
            return None;
        }
        state.take(turn);
        Some(Slot { slots: self, turn })
    }

    /// A slot a fetch taking `turn` held, given back: to the next waiter whose turn it is, or
    /// free.
    fn release(&self, turn: Turn) {
        let mut state = self.state.lock();
        state.free += 1;
        if turn == Turn::Ahead {
            state.ahead_held -= 1;
        }
        state.hand_out();
    }

    /// Slots free now.
    #[cfg(test)]
    pub(super) fn available(&self) -> usize {
        self.state.lock().free
    }
}

/// A wait for a slot, woken when [`Slots::release`] hands it one.
struct Wait<'a> {
    slots: &'a Slots,
    turn: Turn,
    woken: Option<oneshot::Receiver<()>>,
}

impl<'a> Future for Wait<'a> {
    type Output = Slot<'a>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Slot<'a>> {
        let Some(woken) = self.woken.as_mut() else {
            unreachable!("polled after it was ready");
        };
        match Pin::new(woken).poll(cx) {
            Poll::Pending => Poll::Pending,
            // The sender is only dropped by sending, or with the budget itself, which outlives
            // its waiters: either way the slot is this waiter's.
            Poll::Ready(_) => {
                self.woken = None;
                Poll::Ready(Slot {
                    slots: self.slots,
                    turn: self.turn,
                })
            }
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let Some(mut woken) = self.woken.take() else {
            return;
        };
        // Given up (the task waiting was dropped): no slot may be handed here from now on,
        // and one handed already goes on to the next waiter.
        woken.close();
        if woken.try_recv().is_ok() {
            self.slots.release(self.turn);
        }
        let mut state = self.slots.state.lock();
        state.first.retain(|w| !w.is_closed());
        state.ahead.retain(|w| !w.is_closed());
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
}
