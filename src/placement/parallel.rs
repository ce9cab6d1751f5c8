//! Splitting independent judgements across the cores, for the calls big enough to gain from
//! it (a thread costs tens of microseconds to start or wake; a small call stays on its own
//! thread).

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// `f` over `items` in order, the slice cut into one contiguous part per core when there are
/// at least `min_per_thread` items for each; results come back in the order of `items`.
pub(crate) fn map_chunks<T: Sync, R: Send>(
    items: &[T],
    min_per_thread: usize,
    f: impl Fn(&[T]) -> Vec<R> + Sync,
) -> Vec<R> {
    let threads = cores().min(items.len() / min_per_thread.max(1)).max(1);
    if threads == 1 {
        return f(items);
    }
    let per = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|scope| {
        let mut parts = items.chunks(per);
        let first = parts.next().unwrap_or_default();
        let rest: Vec<_> = parts.map(|p| scope.spawn(move || f(p))).collect();
        let mut out = f(first);
        for handle in rest {
            match handle.join() {
                Ok(v) => out.extend(v),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

/// Blocks `0..count` of a task, handed out one at a time to whichever thread asks first.
pub(crate) struct Blocks {
    next: AtomicUsize,
    count: usize,
}

impl Blocks {
    /// The next block nobody has taken yet.
    pub(crate) fn take(&self) -> Option<usize> {
        // AcqRel: whoever finds the blocks gone also sees what the taker of the last one did
        // before taking it (in `share_blocks`: saying it is running).
        let block = self.next.fetch_add(1, Ordering::AcqRel);
        (block < self.count).then_some(block)
    }

    fn all_taken(&self) -> bool {
        self.next.load(Ordering::Acquire) >= self.count
    }

    fn take_all(&self) {
        self.next.fetch_max(self.count, Ordering::AcqRel);
    }
}

/// A task shared by its caller and helper threads, and where the helpers are with it.
struct Sharing<F, R> {
    work: F,
    blocks: Blocks,
    helpers: Mutex<Helping<R>>,
    returned: Condvar,
}

struct Helping<R> {
    /// Helpers that started on the task and have not returned yet.
    running: usize,
    results: Vec<R>,
    panic: Option<Box<dyn Any + Send>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<F: Fn(&Blocks) -> R, R> Sharing<F, R> {
    /// One helper's part: none when it starts after the blocks are all taken.
    fn help(&self) {
        if self.blocks.all_taken() {
            return;
        }
        lock(&self.helpers).running += 1;
        let out = catch_unwind(AssertUnwindSafe(|| (self.work)(&self.blocks)));
        let mut helping = lock(&self.helpers);
        helping.running -= 1;
        match out {
            Ok(r) => helping.results.push(r),
            Err(panic) => {
                self.blocks.take_all();
                helping.panic.get_or_insert(panic);
            }
        }
        self.returned.notify_all();
    }
}

/// Leaves no block for the helpers once the caller stops, returning or unwinding.
struct TakeAllOnDrop<'a>(&'a Blocks);

impl Drop for TakeAllOnDrop<'_> {
    fn drop(&mut self) {
        self.0.take_all();
    }
}

/// `work` on the calling thread and on up to `helpers` of the process's helper threads at
/// once, each call taking blocks `0..blocks` with [`Blocks::take`] until none are left;
/// returns what each call that took a part returned, the caller's first.
///
/// The helper threads live as long as the process, so a call costs a wake-up instead of a
/// thread start, and a helper that has just slept gets a core sooner than a new thread (on a
/// busy machine, the scheduler let a new thread wait for milliseconds). The caller never
/// waits for a helper that has not started: it takes the blocks nobody else gets to, and
/// waits only for helpers that are running. A panic in a helper is resumed on the caller.
pub(crate) fn share_blocks<F, R>(blocks: usize, helpers: usize, work: F) -> Vec<R>
where
    F: Fn(&Blocks) -> R + Send + Sync + 'static,
    R: Send + 'static,
{
    let sharing = Arc::new(Sharing {
        work,
        blocks: Blocks {
            next: AtomicUsize::new(0),
            count: blocks,
        },
        helpers: Mutex::new(Helping {
            running: 0,
            results: Vec::new(),
            panic: None,
        }),
        returned: Condvar::new(),
    });
    let pool = HelperPool::get();
    for _ in 0..helpers.min(pool.threads).min(blocks.saturating_sub(1)) {
        let sharing = sharing.clone();
        pool.run(Box::new(move || sharing.help()));
    }
    let mine = {
        let _stop = TakeAllOnDrop(&sharing.blocks);
        (sharing.work)(&sharing.blocks)
    };
    let mut helping = lock(&sharing.helpers);
    while helping.running > 0 {
        helping = sharing
            .returned
            .wait(helping)
            .unwrap_or_else(|p| p.into_inner());
    }
    if let Some(panic) = helping.panic.take() {
        drop(helping);
        resume_unwind(panic);
    }
    let mut out = Vec::with_capacity(1 + helping.results.len());
    out.push(mine);
    out.append(&mut helping.results);
    out
}

type Job = Box<dyn FnOnce() + Send>;

/// Jobs waiting for a helper thread.
#[derive(Default)]
struct Jobs {
    queue: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

impl Jobs {
    /// A helper thread's life: the jobs in turn, waiting for the next.
    fn serve(&self) {
        loop {
            let mut queue = lock(&self.queue);
            let job = loop {
                match queue.pop_front() {
                    Some(job) => break job,
                    None => queue = self.ready.wait(queue).unwrap_or_else(|p| p.into_inner()),
                }
            };
            drop(queue);
            job();
        }
    }
}

/// Threads started once, one per core but the caller's, that run jobs in turn.
struct HelperPool {
    jobs: Arc<Jobs>,
    /// How many threads started (none when the machine has one core, or none could start:
    /// then callers do all the work themselves).
    threads: usize,
}

impl HelperPool {
    fn get() -> &'static HelperPool {
        static POOL: OnceLock<HelperPool> = OnceLock::new();
        POOL.get_or_init(|| {
            let jobs = Arc::new(Jobs::default());
            let threads = (1..cores())
                .filter(|i| {
                    let jobs = jobs.clone();
                    std::thread::Builder::new()
                        .name(format!("switchyard-helper-{i}"))
                        .spawn(move || jobs.serve())
                        .is_ok()
                })
                .count();
            HelperPool { jobs, threads }
        })
    }

    fn run(&self, job: Job) {
        lock(&self.jobs.queue).push_back(job);
        self.jobs.ready.notify_one();
    }
}

/// The cores this process may use, read once.
pub(crate) fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_however_the_items_are_split() {
        let items: Vec<u32> = (0..1001).collect();
        for min in [1, 7, 500, 2000] {
            let out = map_chunks(&items, min, |part| part.iter().map(|x| x * 2).collect());
            assert_eq!(
                out,
                items.iter().map(|x| x * 2).collect::<Vec<_>>(),
                "min {min}"
            );
        }
        assert!(map_chunks(&[] as &[u32], 1, |p| p.to_vec()).is_empty());
    }

    /// Every block is taken once, whichever threads take part; a panic in any of them comes
    /// back to the caller, and the helpers go on serving later calls.
    #[test]
    fn shared_blocks_are_each_taken_once_and_a_panic_reaches_the_caller() {
        for blocks in [0, 1, 2, 7, 300] {
            let parts = share_blocks(blocks, cores(), |b: &Blocks| {
                let mut mine = Vec::new();
                while let Some(block) = b.take() {
                    mine.push(block);
                }
                mine
            });
            let mut all: Vec<usize> = parts.into_iter().flatten().collect();
            all.sort_unstable();
            assert_eq!(all, (0..blocks).collect::<Vec<_>>());
        }
        for round in 0..8 {
            let panicked = std::panic::catch_unwind(|| {
                share_blocks(50, cores(), move |b: &Blocks| {
                    while let Some(block) = b.take() {
                        assert_ne!(block, round, "block {block} fails");
                        std::thread::yield_now();
                    }
                })
            });
            let message = panicked.expect_err("a block panics");
            let text = message.downcast_ref::<String>().map_or("", String::as_str);
            assert!(text.contains(&format!("block {round} fails")), "{text}");
        }
        let after = share_blocks(100, cores(), |b: &Blocks| {
            std::iter::from_fn(|| b.take()).count()
        });
        assert_eq!(after.iter().sum::<usize>(), 100);
    }
}
