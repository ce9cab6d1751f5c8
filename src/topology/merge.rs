//! The hint merge, computed per candidate mask instead of per combination.
//!
//! The kubelet ANDs every combination (one hint per resource) and keeps a
//! running best, replaced only by a candidate that beats it. "Beats" is a
//! strict total order on distinct masks: preferred before unpreferred;
//! among preferred, fewer nodes, then (with prefer-closest) the lower
//! average distance, then the smaller value; among unpreferred, with `aim`
//! the widest of the resources' narrowest hints, a count of exactly `aim`
//! first, then counts below it from the widest down, then counts above it
//! from the narrowest up, ties broken as for preferred ones. So the winner
//! is the minimum of all merged hints in that order, whatever order they are
//! visited in (which is also why Go's random map order doesn't change it),
//! and it only depends on two sets, which this module computes directly:
//!
//! * `P`, the masks some *preferred* combination merges to. Such a combination
//!   picks, for every resource, a preferred hint that is either affinity-free
//!   or has one common raw mask `X`; it merges to `X & all` (or `all` when
//!   every pick is affinity-free). So `X` qualifies iff every resource has a
//!   preferred `X` hint or a preferred affinity-free hint, and one has `X`.
//! * `A`, the masks any combination merges to, needed only when `P` is empty.
//!   Each resource contributes its hint masks clipped to the machine (`all`
//!   for affinity-free hints); `A` is the set of ANDs of one mask per
//!   resource. When the machine and the hints span at most [`DENSE_BITS`]
//!   bits, it comes from superset-sum transforms of per-resource tables
//!   (`2^n · n` work per resource, whatever the number of hints); otherwise
//!   it is built resource by resource as a set of masks.
//!
//! Combinations merging to an empty mask never compete, as in the kubelet.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::{NumaInfo, NumaMask, Policy, PolicyOptions, TopologyHint};

/// One hint provider's answer: resource name to its hints, where `None` means
/// "no preference" and `Some(vec![])` means "cannot be allocated". An empty
/// map means the provider has no preference for any resource.
pub type ProviderHints = BTreeMap<String, Option<Vec<TopologyHint>>>;

/// The merged hint and the admission decision of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeResult {
    pub hint: TopologyHint,
    pub admit: bool,
}

/// Most distinct node ids (the machine's and the hints') for which the merge
/// uses dense tables of `2^DENSE_BITS` entries; beyond, sorted sets of masks.
pub(crate) const DENSE_BITS: u32 = 12;

const NO_PREFERENCE: [TopologyHint; 1] = [TopologyHint {
    affinity: None,
    preferred: true,
}];
const NO_ALLOCATION: [TopologyHint; 1] = [TopologyHint {
    affinity: None,
    preferred: false,
}];

/// Merges the providers' hints as the kubelet's policy `policy` would, and
/// says whether it admits the pod.
///
/// The configuration is assumed to have passed [`super::validate`]; if it has
/// not, nothing panics, but a mask whose average distance cannot be computed
/// ranks behind those whose average can.
pub fn merge(
    policy: Policy,
    options: &PolicyOptions,
    numa_info: &NumaInfo,
    providers: &[ProviderHints],
) -> MergeResult {
    merge_flat(policy, options, numa_info, &flatten(providers))
}

/// [`merge`] on hints given per resource, provider boundaries dropped (they do not change
/// the result), without building [`ProviderHints`] maps: `None` for a resource without
/// preference, an empty list for one that cannot be allocated. An empty slice is the
/// merge of no providers at all.
pub(crate) fn merge_resources(
    policy: Policy,
    options: &PolicyOptions,
    numa_info: &NumaInfo,
    resources: &[Option<&[TopologyHint]>],
) -> MergeResult {
    let flat: Vec<&[TopologyHint]> = resources
        .iter()
        .map(|hints| match hints {
            None => &NO_PREFERENCE[..],
            Some([]) => &NO_ALLOCATION[..],
            Some(h) => h,
        })
        .collect();
    merge_flat(policy, options, numa_info, &flat)
}

fn merge_flat(
    policy: Policy,
    options: &PolicyOptions,
    numa_info: &NumaInfo,
    resources: &[&[TopologyHint]],
) -> MergeResult {
    let all = numa_info.default_mask().bits();
    match policy {
        Policy::None => MergeResult {
            hint: TopologyHint {
                affinity: None,
                preferred: false,
            },
            admit: true,
        },
        Policy::BestEffort | Policy::Restricted => {
            let fit = if options.prefer_closest_numa {
                Fit::Closest(numa_info)
            } else {
                Fit::Narrowest
            };
            let hint = best_hint(resources, &|_: &TopologyHint| true, all, &fit);
            MergeResult {
                hint,
                admit: policy == Policy::BestEffort || hint.preferred,
            }
        }
        Policy::SingleNumaNode => {
            let single =
                |h: &TopologyHint| h.preferred && h.affinity.is_none_or(NumaMask::is_single);
            let mut hint = best_hint(resources, &single, all, &Fit::Narrowest);
            if hint.affinity == Some(NumaMask(all)) {
                hint.affinity = None;
            }
            MergeResult {
                hint,
                admit: hint.preferred,
            }
        }
    }
}

/// One hint list per resource, provider boundaries dropped.
fn flatten(providers: &[ProviderHints]) -> Vec<&[TopologyHint]> {
    let mut resources: Vec<&[TopologyHint]> = Vec::with_capacity(providers.len() * 2);
    for provider in providers {
        if provider.is_empty() {
            resources.push(&NO_PREFERENCE);
            continue;
        }
        for hints in provider.values() {
            resources.push(match hints {
                None => &NO_PREFERENCE,
                Some(h) if h.is_empty() => &NO_ALLOCATION,
                Some(h) => h,
            });
        }
    }
    resources
}

/// How two equally ranked masks are told apart.
enum Fit<'a> {
    /// Fewer nodes, then the smaller value.
    Narrowest,
    /// Fewer nodes, then the lower average distance, then the smaller value.
    Closest(&'a NumaInfo),
}

fn best_hint<F>(resources: &[&[TopologyHint]], keep: &F, all: u64, fit: &Fit<'_>) -> TopologyHint
where
    F: Fn(&TopologyHint) -> bool,
{
    let fallback = TopologyHint {
        affinity: Some(NumaMask(all)),
        preferred: false,
    };
    if all == 0 {
        // Every merge is empty, so none competes.
        return fallback;
    }
    // Hints rarely name nodes the machine lacks, so first assume they don't.
    let found = dense_best(resources, keep, all, all, fit).unwrap_or_else(|Foreign| {
        let universe = resources
            .iter()
            .flat_map(|hints| hints.iter())
            .filter(|h| keep(h))
            .filter_map(|h| h.affinity)
            .fold(all, |u, m| u | m.bits());
        dense_best(resources, keep, all, universe, fit)
            .unwrap_or_else(|Foreign| sparse_best(resources, keep, all, fit))
    });
    match found {
        Some((m, preferred)) => TopologyHint {
            affinity: Some(NumaMask(m)),
            preferred,
        },
        None => fallback,
    }
}

/// What the winning mask's node count is chosen by.
#[derive(Clone, Copy)]
enum Aim {
    /// Preferred merges: the fewest nodes.
    Fewest,
    /// Unpreferred merges: this count if reachable, else the widest count
    /// below it, else the narrowest above it. The count is the widest of the
    /// resources' narrowest hints, counted on raw (unclipped) masks.
    Toward(u32),
}

/// A hint names a node outside the index space tried.
struct Foreign;

/// The search over dense tables indexed by the masks of `universe`, which
/// must hold the machine's nodes and every node a kept hint names.
///
/// Tables are bytes rather than bits: consecutive hints then write distinct
/// bytes instead of updating one word in a chain.
fn dense_best<F>(
    resources: &[&[TopologyHint]],
    keep: &F,
    all: u64,
    universe: u64,
    fit: &Fit<'_>,
) -> Result<Option<(u64, bool)>, Foreign>
where
    F: Fn(&TopologyHint) -> bool,
{
    let gather = &Gather::new(universe);
    if gather.width > DENSE_BITS {
        return Err(Foreign);
    }
    let size = 1usize << gather.width;
    // Gathering keeps node counts, so counts can be looked up by index
    // (cheaper than popcount on targets without a popcount instruction).
    let mut nodes = vec![0u8; size];
    for i in 1..size {
        let half = nodes.get(i >> 1).copied().unwrap_or(0);
        if let Some(n) = nodes.get_mut(i) {
            *n = half + u8::from(i & 1 == 1);
        }
    }
    let count_of = |m: u64| u32::from(nodes.get(gather.index(m)).copied().unwrap_or(0));
    // Clipped masks live in the machine's own index space; `clip` maps a
    // mask's index to the index of its part on the machine.
    let machine = Gather::new(all);
    let machine_size = 1usize << machine.width;
    let clip: Vec<usize> = if universe == all {
        (0..size).collect()
    } else {
        (0..size)
            .map(|i| machine.index(gather.expand(i) & all))
            .collect()
    };

    // Raw masks every resource accepts as a preferred pick, and those some
    // resource names; `own` is the current resource's preferred masks.
    let mut common = vec![1u8; size];
    let mut named = vec![0u8; size];
    let mut own = vec![0u8; size];
    let mut clipped = vec![0u8; resources.len() * machine_size];
    let mut aim = 0u8;
    let mut every_free = true;
    for (hints, row) in resources.iter().zip(clipped.chunks_exact_mut(machine_size)) {
        own.fill(0);
        let mut free = false;
        let mut narrowest = u8::MAX;
        for h in hints.iter().filter(|h| keep(h)) {
            match h.affinity {
                None => {
                    free |= h.preferred;
                    if let Some(c) = row.last_mut() {
                        *c = 1;
                    }
                }
                Some(m) => {
                    if m.bits() & !universe != 0 {
                        return Err(Foreign);
                    }
                    let i = gather.index(m.bits());
                    narrowest = narrowest.min(nodes.get(i).copied().unwrap_or(u8::MAX));
                    if let Some(o) = own.get_mut(i) {
                        *o |= u8::from(h.preferred);
                    }
                    if let Some(c) = clip.get(i).and_then(|&j| row.get_mut(j)) {
                        *c = 1;
                    }
                }
            }
        }
        if narrowest != u8::MAX {
            aim = aim.max(narrowest);
        }
        every_free &= free;
        if free {
            for (n, &o) in named.iter_mut().zip(&own) {
                *n |= o;
            }
        } else {
            for ((c, n), &o) in common.iter_mut().zip(named.iter_mut()).zip(&own) {
                *n |= o;
                *c &= o;
            }
        }
    }

    let mut preferred: Vec<u64> = common
        .iter()
        .zip(&named)
        .enumerate()
        .filter(|(_, (&c, &n))| c & n != 0)
        .map(|(i, _)| gather.expand(i) & all)
        .filter(|&m| m != 0)
        .collect();
    if every_free {
        preferred.push(all);
    }
    if let Some(best) = pick(&preferred, Aim::Fewest, fit, count_of) {
        return Ok(Some((best, true)));
    }

    let reachable: Vec<u64> = reachable_dense(&clipped, machine_size)
        .into_iter()
        .map(|i| machine.expand(i))
        .collect();
    Ok(pick(&reachable, Aim::Toward(u32::from(aim)), fit, count_of).map(|m| (m, false)))
}

/// Indices of the non-empty ANDs of one clipped mask per resource, each
/// resource given as a row of `size` flags (a power of two).
///
/// With `Z` the superset-sum transform, `Z(f AND-conv g) = Z(f) · Z(g)`, so
/// the product of the rows' transforms, transformed back, counts for every
/// mask the combinations that AND to it exactly. A row's transform is at
/// most `size`, so products of up to `64 / (log2(size) + 1)` rows are exact
/// in `u64`; past that, the partial result is reduced to an indicator
/// (which is all that matters) and the product starts again from it.
fn reachable_dense(rows: &[u8], size: usize) -> Vec<usize> {
    let bits_per_factor = size.trailing_zeros() + 1;
    let mut product = vec![1u64; size];
    let mut table = vec![0u64; size];
    let mut bits_used = 0u32;
    let mut previous: Option<&[u8]> = None;
    for row in rows.chunks_exact(size) {
        if bits_used + bits_per_factor > 64 {
            superset_differences(&mut product);
            for p in &mut product {
                *p = u64::from(*p != 0);
            }
            superset_sums(&mut product);
            bits_used = bits_per_factor;
        }
        // Resources often share their hint masks: reuse the transform.
        if previous != Some(row) {
            for (t, &r) in table.iter_mut().zip(row) {
                *t = u64::from(r);
            }
            superset_sums(&mut table);
            previous = Some(row);
        }
        for (p, t) in product.iter_mut().zip(&table) {
            *p = p.wrapping_mul(*t);
        }
        bits_used += bits_per_factor;
    }
    superset_differences(&mut product);
    product
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, &p)| p != 0)
        .map(|(i, _)| i)
        .collect()
}

/// `f[i] += f[j]` for every strict superset `j` of `i`, in place.
fn superset_sums(f: &mut [u64]) {
    transform(f, u64::wrapping_add);
}

/// Inverse of [`superset_sums`].
fn superset_differences(f: &mut [u64]) {
    transform(f, u64::wrapping_sub);
}

/// Folds, for each bit, every entry with the bit set into the entry without
/// it. The three lowest bits are done within blocks of eight, which the
/// compiler keeps in registers; the others in runs it can vectorise.
fn transform<F: Fn(u64, u64) -> u64>(f: &mut [u64], op: F) {
    let mut half = 1;
    if f.len() >= 8 {
        for block in f.chunks_exact_mut(8) {
            if let Ok(b) = <&mut [u64; 8]>::try_from(block) {
                let [b0, b1, b2, b3, b4, b5, b6, b7] = *b;
                let (b0, b2, b4, b6) = (op(b0, b1), op(b2, b3), op(b4, b5), op(b6, b7));
                let (b0, b1, b4, b5) = (op(b0, b2), op(b1, b3), op(b4, b6), op(b5, b7));
                *b = [
                    op(b0, b4),
                    op(b1, b5),
                    op(b2, b6),
                    op(b3, b7),
                    b4,
                    b5,
                    b6,
                    b7,
                ];
            }
        }
        half = 8;
    }
    while half < f.len() {
        for block in f.chunks_exact_mut(2 * half) {
            let (without, with) = block.split_at_mut(half);
            for (a, b) in without.iter_mut().zip(with.iter()) {
                *a = op(*a, *b);
            }
        }
        half *= 2;
    }
}

/// The same search for hints spread over more than [`DENSE_BITS`] bits,
/// with sorted lists of masks instead of tables.
fn sparse_best<F>(
    resources: &[&[TopologyHint]],
    keep: &F,
    all: u64,
    fit: &Fit<'_>,
) -> Option<(u64, bool)>
where
    F: Fn(&TopologyHint) -> bool,
{
    let mut common: Option<Vec<u64>> = None;
    let mut named = Vec::new();
    let mut every_free = true;
    let mut aim = 0u32;
    for hints in resources {
        let mut free = false;
        let mut own = Vec::new();
        let mut narrowest: Option<u32> = None;
        for h in hints.iter().filter(|h| keep(h)) {
            match h.affinity {
                None => free |= h.preferred,
                Some(m) => {
                    narrowest = Some(narrowest.map_or(m.count(), |n| n.min(m.count())));
                    if h.preferred {
                        own.push(m.bits());
                    }
                }
            }
        }
        aim = aim.max(narrowest.unwrap_or(0));
        every_free &= free;
        own.sort_unstable();
        own.dedup();
        named.extend_from_slice(&own);
        if !free {
            common = Some(match common {
                None => own,
                Some(c) => intersect_sorted(&c, &own),
            });
        }
    }
    // With every resource free to pick "no affinity", any named mask works.
    let mut preferred = common.unwrap_or(named);
    if every_free {
        preferred.push(all);
    }
    preferred.retain_mut(|m| {
        *m &= all;
        *m != 0
    });
    if let Some(best) = pick(&preferred, Aim::Fewest, fit, u64::count_ones) {
        return Some((best, true));
    }
    let reachable = reachable_on_machine(resources, keep, all);
    pick(&reachable, Aim::Toward(aim), fit, u64::count_ones).map(|m| (m, false))
}

/// Most NUMA nodes of a machine for which [`reachable_on_machine`] uses the dense transform:
/// tables of 2^20 entries (8 MiB), built in milliseconds.
pub(crate) const MACHINE_DENSE_BITS: u32 = 20;

/// [`reachable_sparse`]'s set, found by whichever of the two exact ways costs less: the
/// sorted sets cost the product of the hint counts (in time, and before they are
/// deduplicated, in memory: two resources of 65,535 hints each on a 16-node machine asked for
/// 32 GiB as one list); the transform of [`reachable_dense`] costs its table, 2^width entries
/// per resource and bit, whatever the hints.
fn reachable_on_machine<F>(resources: &[&[TopologyHint]], keep: &F, all: u64) -> Vec<u64>
where
    F: Fn(&TopologyHint) -> bool,
{
    let space = ReachSpace::new(resources, keep, all);
    let pairs: f64 = (resources.iter())
        .map(|hints| hints.iter().filter(|h| keep(h)).count().max(1) as f64)
        .product();
    let table = resources.len() as f64
        * f64::from(space.gather.width + 1)
        * (1u64 << space.gather.width.min(63)) as f64;
    if space.gather.width > MACHINE_DENSE_BITS || pairs <= table {
        reachable_sparse(resources, keep, all)
    } else {
        space.reachable(resources, keep, all)
    }
}

/// The index space in which the ANDs of clipped masks can be told apart. Clipped masks are
/// the nodes the hints name on the machine (`named`), or the whole machine for a hint without
/// affinity; an AND is then a subset of `named`, or the whole machine (every hint without
/// affinity). So the space is `named` and, when the machine has other nodes, one of those
/// standing for all of them.
struct ReachSpace {
    gather: Gather,
    stand_in: u64,
}

/// The nodes of the machine (`all`) that `affinities` name, and the lowest of the others,
/// which stands for all of them (none when the affinities name every node): together, the
/// index space of [`ReachSpace`].
pub(crate) fn reach_nodes(all: u64, affinities: impl Iterator<Item = NumaMask>) -> (u64, u64) {
    let named = affinities.fold(0, |n, m| n | (m.bits() & all));
    let rest = all & !named;
    (named, rest & rest.wrapping_neg())
}

impl ReachSpace {
    fn new<F>(resources: &[&[TopologyHint]], keep: &F, all: u64) -> Self
    where
        F: Fn(&TopologyHint) -> bool,
    {
        let affinities = (resources.iter().flat_map(|hints| hints.iter()))
            .filter(|h| keep(h))
            .filter_map(|h| h.affinity);
        let (named, stand_in) = reach_nodes(all, affinities);
        Self {
            gather: Gather::new(named | stand_in),
            stand_in,
        }
    }

    /// [`reachable_sparse`]'s set with [`reachable_dense`]; the space's width must be at most
    /// [`MACHINE_DENSE_BITS`].
    fn reachable<F>(&self, resources: &[&[TopologyHint]], keep: &F, all: u64) -> Vec<u64>
    where
        F: Fn(&TopologyHint) -> bool,
    {
        let size = 1usize << self.gather.width;
        let mut rows = vec![0u8; resources.len() * size];
        for (hints, row) in resources.iter().zip(rows.chunks_exact_mut(size)) {
            for h in hints.iter().filter(|h| keep(h)) {
                let m = h.affinity.map_or(all, |m| m.bits() & all);
                if let Some(flag) = (m != 0)
                    .then(|| row.get_mut(self.gather.index(m)))
                    .flatten()
                {
                    *flag = 1;
                }
            }
        }
        reachable_dense(&rows, size)
            .into_iter()
            .map(|i| match self.gather.expand(i) {
                m if m & self.stand_in != 0 => all,
                m => m,
            })
            .collect()
    }
}

fn intersect_sorted(a: &[u64], b: &[u64]) -> Vec<u64> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while let (Some(&x), Some(&y)) = (a.get(i), b.get(j)) {
        match x.cmp(&y) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                out.push(x);
                i += 1;
                j += 1;
            }
        }
    }
    out
}

/// Every non-empty AND of one clipped mask per resource, built resource by
/// resource as a sorted set.
fn reachable_sparse<F>(resources: &[&[TopologyHint]], keep: &F, all: u64) -> Vec<u64>
where
    F: Fn(&TopologyHint) -> bool,
{
    let clipped_set = |hints: &[TopologyHint]| {
        let mut v: Vec<u64> = hints
            .iter()
            .filter(|h| keep(h))
            .map(|h| h.affinity.map_or(all, |m| m.bits() & all))
            .filter(|&m| m != 0)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let mut reach = vec![all];
    for hints in resources {
        let masks = clipped_set(hints);
        let mut next = Vec::with_capacity(reach.len().max(masks.len()));
        // Deduplicated as it grows, not once at the end: the pairs can be billions where
        // their distinct ANDs are few.
        let mut distinct = 0;
        for &a in &reach {
            next.extend(masks.iter().map(|&b| a & b).filter(|&m| m != 0));
            if next.len() > 2 * distinct + (1 << 16) {
                next.sort_unstable();
                next.dedup();
                distinct = next.len();
            }
        }
        next.sort_unstable();
        next.dedup();
        reach = next;
        if reach.is_empty() {
            break;
        }
    }
    reach
}

/// The count `aim` settles on among `masks`, then the fittest mask of it.
///
/// Averages are compared exactly, as the kubelet compares them: equal sums
/// in the same order give equal averages, and those must tie.
#[allow(clippy::float_cmp)]
fn pick(masks: &[u64], aim: Aim, fit: &Fit<'_>, count_of: impl Fn(u64) -> u32) -> Option<u64> {
    let count = match aim {
        Aim::Fewest => masks.iter().map(|&m| count_of(m)).min()?,
        Aim::Toward(target) => {
            let mut below: Option<u32> = None;
            let mut above: Option<u32> = None;
            let mut exact = false;
            for c in masks.iter().map(|&m| count_of(m)) {
                match c.cmp(&target) {
                    Ordering::Equal => {
                        exact = true;
                        break;
                    }
                    Ordering::Less => below = Some(below.map_or(c, |b| b.max(c))),
                    Ordering::Greater => above = Some(above.map_or(c, |a| a.min(c))),
                }
            }
            if exact {
                target
            } else {
                below.or(above)?
            }
        }
    };
    let mut of_count = masks.iter().copied().filter(|&m| count_of(m) == count);
    match fit {
        Fit::Narrowest => of_count.min(),
        Fit::Closest(info) => {
            // A missing distance sorts last rather than aborting the merge.
            let avg = |m: u64| info.average_distance(NumaMask(m)).unwrap_or(f64::INFINITY);
            let first = of_count.next()?;
            let mut best = (first, avg(first));
            for m in of_count {
                if m == best.0 {
                    continue;
                }
                let d = avg(m);
                if d < best.1 || (d == best.1 && m < best.0) {
                    best = (m, d);
                }
            }
            Some(best.0)
        }
    }
}

/// Packs the bits of `universe` into the low `width` bits, order kept, so
/// masks within it index a table of `2^width` entries and compare alike.
struct Gather {
    universe: u64,
    width: u32,
    /// `universe` is `0b0..01..1`: masks are their own index.
    identity: bool,
    positions: [u32; 64],
}

impl Gather {
    fn new(universe: u64) -> Self {
        let mut positions = [0u32; 64];
        let mut rest = universe;
        for slot in &mut positions {
            if rest == 0 {
                break;
            }
            *slot = rest.trailing_zeros();
            rest &= rest - 1;
        }
        Self {
            universe,
            width: universe.count_ones(),
            identity: universe & universe.wrapping_add(1) == 0,
            positions,
        }
    }

    /// Index of `mask` (its bits outside the universe ignored); callers keep
    /// `width <= DENSE_BITS` (or [`MACHINE_DENSE_BITS`]), so the index fits.
    fn index(&self, mask: u64) -> usize {
        let mask = mask & self.universe;
        if self.identity {
            // Dense callers keep masks within DENSE_BITS bits, which fit.
            return usize::try_from(mask).unwrap_or(usize::MAX);
        }
        let mut index = 0usize;
        let mut rest = mask;
        while rest != 0 {
            let bit = rest.trailing_zeros();
            let below = self.universe & ((1u64 << bit) - 1);
            index |= 1usize << below.count_ones();
            rest &= rest - 1;
        }
        index
    }

    fn expand(&self, index: usize) -> u64 {
        if self.identity {
            return index as u64;
        }
        let mut mask = 0u64;
        let mut rest = index;
        while rest != 0 {
            let slot = rest.trailing_zeros() as usize;
            if let Some(&pos) = self.positions.get(slot) {
                mask |= 1u64 << pos;
            }
            rest &= rest - 1;
        }
        mask
    }
}

/// The transform against the sorted sets, the plain computation it replaces, whichever one
/// [`reachable_on_machine`] would choose.
#[cfg(test)]
mod reach_tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn the_transform_finds_the_sets_ands() {
        let mut rng = Rng::new(0x5eed_0005);
        let keep = |h: &TopologyHint| h.preferred || h.affinity.is_some();
        for round in 0..3000 {
            // Machines of 1 to 40 nodes; hints naming a few of them, or any.
            let nodes = 1 + rng.below(40) as u32;
            let all = (1u64 << nodes) - 1;
            let few = rng.below(2) == 0;
            let pool = if few { all & 0b1010_0110_0001 } else { all };
            let resources: Vec<Vec<TopologyHint>> = (0..1 + rng.below(4))
                .map(|_| {
                    (0..rng.below(6))
                        .map(|_| TopologyHint {
                            affinity: (!rng.percent(15))
                                .then(|| NumaMask(pool & rng.next_u64() & rng.next_u64())),
                            preferred: rng.percent(50),
                        })
                        .collect()
                })
                .collect();
            let lists: Vec<&[TopologyHint]> = resources.iter().map(Vec::as_slice).collect();
            let space = ReachSpace::new(&lists, &keep, all);
            // Wider spaces work the same, in tables too slow for a debug build's test.
            if space.gather.width > 14 {
                continue;
            }
            assert_eq!(
                space.reachable(&lists, &keep, all),
                reachable_sparse(&lists, &keep, all),
                "round {round}: {nodes} nodes, {resources:?}"
            );
        }
    }
}
