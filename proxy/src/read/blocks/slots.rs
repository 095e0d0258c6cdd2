//! The fetch budget (`upstream_concurrency`), in which the block a response starts with goes
//! before the blocks responses open ahead of the one they send.
//!
//! A response opens up to `read_window` blocks ahead of the one it sends, so a few large cold
//! reads can hold every slot and queue more: a new reader's first block would then wait (the
//! semaphore is fair, first come first served) behind all the blocks they asked for ahead,
//! although none of their readers is waiting for those yet. Blocks opened ahead (and read-ahead,
//! and the further pieces of a cold range) may hold at most three quarters of the slots; the
//! quarter left is for the blocks readers wait for first. Both kinds wait in order among
//! themselves, so no reader is starved: the blocks ahead always have their three quarters.

use tokio::sync::{Semaphore, SemaphorePermit};

/// Whether a fetch is for a block a reader waits for first, or one opened ahead of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// The first block of a response (or a block nobody reads through a response: a warm-up's,
    /// a peer's): any free slot.
    First,
    /// A block opened ahead of the one a response sends, read ahead across requests, or a
    /// further piece of a cold range: only within [`Slots::ahead`]'s share.
    Ahead,
}

/// A fetch budget of `n` slots, at most `n - n / 4` of them for [`Turn::Ahead`].
pub(super) struct Slots {
    all: Semaphore,
    ahead: Semaphore,
}

/// One slot of a [`Slots`], held until its fetch's body is complete.
pub(super) struct Slot<'a> {
    _all: SemaphorePermit<'a>,
    _ahead: Option<SemaphorePermit<'a>>,
}

impl Slots {
    pub(super) fn new(n: usize) -> Self {
        Self {
            all: Semaphore::new(n),
            ahead: Semaphore::new(n - n / 4),
        }
    }

    /// A slot for a fetch taking `turn`, waiting in order for one; `None` if the budget was
    /// closed (never, in practice).
    pub(super) async fn acquire(&self, turn: Turn) -> Option<Slot<'_>> {
        // The share first: a fetch ahead waiting for it holds nothing a first block needs.
        let ahead = match turn {
            Turn::Ahead => Some(self.ahead.acquire().await.ok()?),
            Turn::First => None,
        };
        Some(Slot {
            _all: self.all.acquire().await.ok()?,
            _ahead: ahead,
        })
    }

    /// A slot for a fetch taking `turn` if one is free now.
    pub(super) fn try_acquire(&self, turn: Turn) -> Option<Slot<'_>> {
        let ahead = match turn {
            Turn::Ahead => Some(self.ahead.try_acquire().ok()?),
            Turn::First => None,
        };
        Some(Slot {
            _all: self.all.try_acquire().ok()?,
            _ahead: ahead,
        })
    }

    /// Slots free now.
    #[cfg(test)]
    pub(super) fn available(&self) -> usize {
        self.all.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn blocks_ahead_leave_a_quarter_of_the_slots_to_first_blocks() {
        let slots = Slots::new(8);
        let ahead: Vec<_> = (0..6)
            .map(|_| slots.try_acquire(Turn::Ahead).expect("six of eight"))
            .collect();
        assert!(slots.try_acquire(Turn::Ahead).is_none(), "not a seventh");
        // One waiting ahead does not queue in front of a first block.
        let mut waiting = Box::pin(slots.acquire(Turn::Ahead));
        assert!((&mut waiting).now_or_never().is_none());
        let first = slots.acquire(Turn::First).now_or_never().flatten();
        let second = slots.try_acquire(Turn::First);
        assert!(
            first.is_some() && second.is_some(),
            "the other two are first blocks'"
        );
        assert!(slots.try_acquire(Turn::First).is_none(), "eight in all");
        drop(first);
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "a first block's slot freed is not taken ahead beyond the share"
        );
        drop(ahead);
        assert!(waiting.now_or_never().flatten().is_some());
    }

    #[test]
    fn one_slot_is_everyones() {
        let slots = Slots::new(1);
        assert!(slots.try_acquire(Turn::Ahead).is_some());
        assert!(slots.try_acquire(Turn::First).is_some());
    }
}
