//! Splitting independent judgements across the cores, for the calls big enough to gain from
//! it (a thread costs tens of microseconds to start; a small call stays on its own thread).

/// `f` over `items` in order, the slice cut into one contiguous part per core when there are
/// at least `min_per_thread` items for each; results come back in the order of `items`.
pub fn map_chunks<T: Sync, R: Send>(
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

/// The cores this process may use, read once.
pub fn cores() -> usize {
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
}
