//! Times `merge` on inputs whose cross product the kubelet would walk in full:
//! 8 NUMA nodes, 4 resources, every non-empty mask (255) a hint of each.
//!
//!     cargo run --release --example merge_worst

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use switchyard::topology::{
    merge, NumaInfo, NumaMask, Policy, PolicyOptions, ProviderHints, TopologyHint,
};

const NODES: u32 = 8;
const RESOURCES: u64 = 4;
const BATCHES: usize = 40;
const PER_BATCH: u32 = 5_000;

/// Every mask a hint of every resource; `preferred(resource, mask)` sets flags.
fn providers(preferred: impl Fn(u64, u64) -> bool) -> Vec<ProviderHints> {
    providers_without(preferred, |_, _| false)
}

/// Like [`providers`], less the masks `skip(resource, mask)` selects.
fn providers_without(
    preferred: impl Fn(u64, u64) -> bool,
    skip: impl Fn(u64, u64) -> bool,
) -> Vec<ProviderHints> {
    (0..RESOURCES)
        .map(|r| {
            let hints = (1..(1u64 << NODES))
                .filter(|&m| !skip(r, m))
                .map(|m| TopologyHint {
                    affinity: Some(NumaMask(m)),
                    preferred: preferred(r, m),
                })
                .collect();
            let mut p = ProviderHints::new();
            p.insert(format!("resource-{r}"), Some(hints));
            p
        })
        .collect()
}

fn numa_info() -> NumaInfo {
    let distances: BTreeMap<u32, Vec<u64>> = (0..NODES)
        .map(|i| {
            let row = (0..NODES)
                .map(|j| 10 + 2 * u64::from(i.abs_diff(j)) + u64::from((i ^ j) % 3))
                .collect();
            (i, row)
        })
        .collect();
    NumaInfo::with_distances((0..NODES).collect(), distances)
}

/// Min and median over batches: the minimum is the figure least disturbed
/// by other work on the machine.
fn time(label: &str, policy: Policy, options: &PolicyOptions, providers: &[ProviderHints]) -> f64 {
    let info = numa_info();
    let first = merge(policy, options, &info, providers);
    let mut batches: Vec<f64> = (0..BATCHES)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..PER_BATCH {
                black_box(merge(
                    black_box(policy),
                    options,
                    &info,
                    black_box(providers),
                ));
            }
            start.elapsed().as_secs_f64() * 1e9 / f64::from(PER_BATCH)
        })
        .collect();
    batches.sort_by(f64::total_cmp);
    let (min, median) = (batches[0], batches[batches.len() / 2]);
    println!(
        "{label:<50} min {min:>7.0} ns  median {median:>7.0} ns  -> {:?} preferred={} admit={}",
        first.hint.affinity, first.hint.preferred, first.admit
    );
    min
}

fn main() {
    let plain = PolicyOptions::default();
    let closest = PolicyOptions {
        prefer_closest_numa: true,
        ..PolicyOptions::default()
    };
    // Mixed flags with masks preferred by every resource.
    let mixed = providers(|r, m| {
        (m.wrapping_mul(0x9E37) >> 3).wrapping_add(r) % 2 == 0 || m.count_ones() >= 6
    });
    // Mixed flags where no mask is preferred by all: the unpreferred search.
    let disjoint = providers(|r, m| m % RESOURCES == r);
    // The same, with hint sets differing per resource (one mask in 7 left
    // out), so no transform is shared between resources.
    let distinct = providers_without(|r, m| m % RESOURCES == r, |r, m| m % 7 == r);
    let all_preferred = providers(|_, _| true);

    let worst = [
        time(
            "best-effort, mixed flags",
            Policy::BestEffort,
            &plain,
            &mixed,
        ),
        time(
            "restricted + prefer-closest, mixed flags",
            Policy::Restricted,
            &closest,
            &mixed,
        ),
        time(
            "best-effort, no common preferred mask",
            Policy::BestEffort,
            &plain,
            &disjoint,
        ),
        time(
            "best-effort, no common preferred, distinct sets",
            Policy::BestEffort,
            &plain,
            &distinct,
        ),
        time(
            "best-effort + prefer-closest, no common preferred",
            Policy::BestEffort,
            &closest,
            &disjoint,
        ),
        time(
            "restricted, all preferred",
            Policy::Restricted,
            &plain,
            &all_preferred,
        ),
        time(
            "single-numa-node, mixed flags",
            Policy::SingleNumaNode,
            &plain,
            &mixed,
        ),
    ]
    .into_iter()
    .fold(0.0f64, f64::max);
    println!(
        "worst case (min over batches): {worst:.0} ns/merge (kubelet: 255^4 = {} combinations)",
        255u64.pow(4)
    );
}
