//! NUMA affinity masks: one bit per NUMA node id, ids 0..=63.

use std::fmt;
use std::ops::{BitAnd, BitOr};

use super::ConfigError;

/// A set of NUMA node ids packed into a `u64` (bit `i` = node `i`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NumaMask(pub u64);

impl NumaMask {
    /// The mask with no node set.
    pub(crate) const EMPTY: Self = Self(0);
    /// Largest NUMA id a mask can hold.
    pub(crate) const MAX_ID: u32 = 63;

    /// Builds a mask from node ids; any id above [`NumaMask::MAX_ID`] is refused,
    /// as the kubelet refuses it.
    pub(crate) fn from_ids<I: IntoIterator<Item = u32>>(ids: I) -> Result<Self, ConfigError> {
        let mut bits = 0u64;
        for id in ids {
            if id > Self::MAX_ID {
                return Err(ConfigError::InvalidNumaId(i64::from(id)));
            }
            bits |= 1u64 << id;
        }
        Ok(Self(bits))
    }

    /// The raw bits.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Number of NUMA nodes in the mask.
    pub(crate) const fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// Exactly one node.
    pub(crate) const fn is_single(self) -> bool {
        self.0.is_power_of_two()
    }

    pub(crate) const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether node `id` is in the mask (ids past 63 never are).
    #[cfg(test)]
    pub(crate) const fn contains(self, id: u32) -> bool {
        id <= Self::MAX_ID && self.0 & (1u64 << id) != 0
    }

    #[cfg(test)]
    pub(crate) const fn is_subset_of(self, other: Self) -> bool {
        self.0 & !other.0 == 0
    }

    /// The kubelet's `IsNarrowerThan`: fewer nodes, or as many nodes and a
    /// smaller value as an integer (so lower-numbered nodes win ties).
    #[cfg(test)]
    pub(crate) const fn is_narrower_than(self, other: Self) -> bool {
        let (a, b) = (self.count(), other.count());
        a < b || (a == b && self.0 < other.0)
    }

    /// Node ids in ascending order.
    pub(crate) fn ids(self) -> Ids {
        Ids(self.0)
    }
}

impl BitAnd for NumaMask {
    type Output = Self;
    fn bitand(self, rhs: Self) -> Self {
        Self(self.0 & rhs.0)
    }
}

impl BitOr for NumaMask {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl fmt::Debug for NumaMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.ids()).finish()
    }
}

/// Ascending iterator over the node ids of a [`NumaMask`].
#[derive(Clone, Debug)]
pub struct Ids(u64);

impl Iterator for Ids {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let id = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(id)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.0.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Ids {}
