//! A small deterministic generator (splitmix64) for generated scenarios, benchmarks and
//! randomized tests: the same seed always gives the same sequence, so a run replays. Not for
//! anything that must be unpredictable.

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Any seed works, zero included.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index into a slice of `len` items (0 when it is empty).
    #[cfg(test)]
    pub(crate) fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap_or(0)
    }

    /// In [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p` (0–1).
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() <= p
    }

    /// True `percent` times in 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    #[cfg(test)]
    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            items.get(self.index(items.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_draws_stay_in_range() {
        let draw = |seed| {
            let mut r = Rng::new(seed);
            (0..100).map(|_| r.below(7)).collect::<Vec<_>>()
        };
        assert_eq!(draw(0), draw(0));
        assert_ne!(draw(0), draw(1));
        assert!(draw(3).iter().all(|v| *v < 7));
        let mut r = Rng::new(9);
        assert_eq!(r.below(0), 0);
        assert_eq!(r.pick::<u8>(&[]), None);
        assert!((0..1000).map(|_| r.unit()).all(|u| (0.0..1.0).contains(&u)));
        let hits = (0..10_000).filter(|_| r.percent(30)).count();
        assert!((2_500..3_500).contains(&hits), "{hits}");
    }
}
