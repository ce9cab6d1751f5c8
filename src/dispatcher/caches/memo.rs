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
    /// Whether the class's first Job was starving (a worker is kept for it as it drains).
    pub(crate) starving: bool,
}

/// Why a class of pending Jobs fits no worker, and what it held for itself.
#[derive(Debug, Clone)]
pub(crate) struct ClassMemo {
    pub(crate) key: MemoKey,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    /// The worker kept for it, when it starves.
    pub(crate) reserve: Option<String>,
    /// Whether its quota is held for it.
    pub(crate) holds_quota: bool,
    /// The queue's workers it could use then (by position in the queue's list): workers kept
    /// for Jobs ranked before it are not among them.
    pub(crate) usable: Arc<[usize]>,
    /// The workers it was judged against (by position in the queue's list), with their
    /// capacity epochs then (`None` when not in the inventory). A node gaining room bumps
    /// its worker's epoch, not the queue's: the memo stands while these stay as they were.
    pub(crate) looked: Arc<[(usize, Option<u64>)]>,
}
