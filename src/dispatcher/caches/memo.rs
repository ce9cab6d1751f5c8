//! A class's last placement verdict, and what it depended on.

use std::sync::Arc;

/// What a class's last placement verdict depended on, beyond the workers it was judged
/// against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemoKey {
    /// The queue's workers: bumped when one changed state or as a whole (connected, stale
    /// copies gone, new inventory). A node of one gaining room does not bump it: see
    /// [`ClassMemo::looked`].
    pub(crate) queue_epoch: u64,
    pub(crate) queues: u64,
    /// When messages are written, or the queue is `StrictFIFO`: which room is kept for
    /// starving Jobs. A worker's reason says when room there is kept for another Job; and
    /// room kept can turn a worker's misfit that stays into one that may pass, so that a Job
    /// every worker could never hold (NeverFits, which lets the rest of a StrictFIFO queue
    /// through) reads as one that waits (which holds it back). Other decisions do not depend
    /// on it: room kept takes room off, which no misfit needs to hear of, and room let go is
    /// room gained.
    pub(crate) kept: u64,
    /// When messages are written: whether the class's first Job starved (its message says
    /// so). A starving Job is judged afresh whenever room may be kept for it.
    pub(crate) starving: bool,
}

/// Why a class of pending Jobs fits no worker (never kept for a starving Job's class).
#[derive(Debug, Clone)]
pub(crate) struct ClassMemo {
    pub(crate) key: MemoKey,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    /// The queue's workers that could take Jobs then (by position in the queue's list).
    pub(crate) usable: Arc<[usize]>,
    /// The workers it was judged against (by position in the queue's list), with their
    /// capacity epochs then (`None` when not in the inventory). A node gaining room bumps
    /// its worker's epoch, not the queue's: the memo stands while these stay as they were.
    pub(crate) looked: Arc<[(usize, Option<u64>)]>,
}
