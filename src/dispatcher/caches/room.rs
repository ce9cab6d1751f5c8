//! Which nodes of a worker changed since a memo was made, and the room per pod shape kept
//! from node to node.

use foldhash::HashMap;

/// The log of a worker's nodes whose room changed, either way (see [`Changes::touches`]),
/// for what is counted node by node to be brought up to date.
#[derive(Debug, Clone, Default)]
pub(crate) struct Changes {
    /// Every node whose room changed, in order: positions
    /// `touched_from..touched_from + touched.len()`.
    touched: Vec<usize>,
    touched_from: u64,
}

/// How long a worker's log of touched nodes grows before its older half is dropped (a
/// reader that had not caught up counts every node again).
const TOUCH_LOG: usize = 1 << 16;

impl Changes {
    /// The whole worker may have changed.
    pub(super) fn whole_worker_changed(&mut self) {
        // Past every position handed out: whoever counted before counts everything.
        self.touched_from += self.touched.len() as u64 + 1;
        self.touched.clear();
    }

    /// Node `index`'s room changed, either way.
    pub(super) fn touch(&mut self, index: usize) {
        if self.touched.len() >= TOUCH_LOG {
            let half = TOUCH_LOG / 2;
            self.touched.drain(..half);
            self.touched_from += half as u64;
        }
        self.touched.push(index);
    }

    /// The nodes touched since position `since` of the log, and the position after them.
    pub(super) fn touches(&self, since: u64) -> Option<(&[usize], u64)> {
        let skip = usize::try_from(since.checked_sub(self.touched_from)?).ok()?;
        Some((self.touched.get(skip..)?, self.end()))
    }

    /// Where the log ends now.
    pub(super) fn end(&self) -> u64 {
        self.touched_from + self.touched.len() as u64
    }
}

/// An upper bound on how many pods of one shape a worker's nodes can take at once, kept
/// across passes and brought up to date node by node (see [`Changes::touches`]): each
/// node's count, up to `cap` (gangs of at most `cap` pods compare the same against the sum
/// as against uncapped counts). It is found on the inventory's nodes, without the
/// placements held for dispatched Jobs: those only take room, so a gang that does not fit
/// in it fits nowhere in the worker as a pass sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShapeRoom {
    /// The worker's touch log position the counts are up to date with.
    pub(crate) pos: u64,
    pub(crate) cap: usize,
    pub(crate) counts: Vec<u32>,
    pub(crate) total: usize,
    pub(crate) freeness: NodeFreeness,
}

/// How free each node of a worker is for pods of one shape (see
/// [`freeness`](crate::dispatcher::oracle::view::freeness)), found on the inventory's nodes
/// and brought up to date from the touch log as [`ShapeRoom`]'s counts are: the order in
/// which room is kept is found without reading every node again.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeFreeness {
    /// The worker's touch log position `of` is up to date with.
    pub(crate) pos: u64,
    /// By node index.
    pub(crate) of: Vec<i64>,
}

/// [`ShapeRoom`]s by worker, then shape key.
pub(crate) type ShapeRooms = HashMap<String, HashMap<u64, ShapeRoom>>;
