//! A queue's quota: what is in force, and whether it covers a gang's whole request.

use crate::api::QueueSettings;
use crate::dispatcher::job::Job;
use crate::dispatcher::oracle::view::show;
use crate::dispatcher::state::State;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::SystemTime;

/// The queue's quota in force: its own, or the sum of its workers' allocatable. A worker
/// counts until it is lost (unreachable for `workerLostTimeout`), with the allocatable last
/// known: a short disconnect changes nothing, not even the quota.
pub fn effective(
    state: &State,
    settings: &QueueSettings,
    now: SystemTime,
) -> BTreeMap<String, i64> {
    if let Some(q) = &settings.quota {
        return q.iter().map(|(k, v)| (k.clone(), v.0)).collect();
    }
    let table = &state.inventory.resources;
    // Summed by resource id, named once at the end.
    let mut sums: Vec<Option<i64>> = vec![None; table.len()];
    for name in &settings.clusters {
        let Some(c) = state.inventory.cluster(name) else {
            continue;
        };
        let counted = state
            .workers
            .get(name)
            .is_some_and(|w| !w.lost(now, settings.worker_lost_timeout));
        if !counted {
            continue;
        }
        for (sum, v) in sums.iter_mut().zip(&c.summary.allocatable) {
            if *v > 0 {
                *sum = Some(sum.unwrap_or(0).saturating_add(*v));
            }
        }
    }
    sums.into_iter()
        .enumerate()
        .filter_map(|(r, sum)| Some((table.name(r).to_string(), sum?)))
        .collect()
}

/// Whether a queue's quota covers a gang now.
pub(crate) enum QuotaCheck {
    Covered,
    /// Not now: what is short (empty unless messages are asked for).
    Short(String),
    /// Never: the gang asks for more than the quota is, or for a resource it has none of.
    Never(String),
}

/// What a queue has handed out: to its admitted Jobs, and held for starving ones.
pub(crate) struct QuotaUse<'a> {
    pub used: &'a BTreeMap<String, i64>,
    pub held: &'a BTreeMap<String, i64>,
}

/// Whether `quota` covers the whole gang of `job` on top of `taken`.
pub(crate) fn check(
    job: &Job,
    settings: &QueueSettings,
    quota: &BTreeMap<String, i64>,
    taken: QuotaUse,
    describe: bool,
) -> QuotaCheck {
    // The texts are only written when messages are asked for; the flags decide.
    let (mut is_short, mut is_never) = (false, false);
    let mut short = String::new();
    let mut never = String::new();
    for (r, n) in job.total_requests() {
        let Some(&limit) = quota.get(r) else {
            if settings.quota.is_none() && n > 0 {
                is_never = true;
                if describe {
                    let _ = write!(never, "{}{} {r}", sep(&never), show(r, n));
                }
            }
            continue;
        };
        if n > limit {
            is_never = true;
            if describe {
                let _ = write!(
                    never,
                    "{}{} {r} (quota {})",
                    sep(&never),
                    show(r, n),
                    show(r, limit)
                );
            }
            continue;
        }
        let used =
            taken.used.get(r).copied().unwrap_or(0) + taken.held.get(r).copied().unwrap_or(0);
        if used + n > limit {
            is_short = true;
            if describe {
                let _ = write!(
                    short,
                    "{}{} {r} ({} of {} free)",
                    sep(&short),
                    show(r, n),
                    show(r, (limit - used).max(0)),
                    show(r, limit)
                );
            }
        }
    }
    if is_never {
        QuotaCheck::Never(never)
    } else if is_short {
        QuotaCheck::Short(short)
    } else {
        QuotaCheck::Covered
    }
}

fn sep(s: &str) -> &'static str {
    if s.is_empty() {
        ""
    } else {
        ", "
    }
}

/// Adds `amounts` to `totals`, resource by resource.
pub(crate) fn add_to<'a>(
    totals: &mut BTreeMap<String, i64>,
    amounts: impl Iterator<Item = (&'a str, i64)>,
) {
    for (r, v) in amounts {
        match totals.get_mut(r) {
            Some(t) => *t += v,
            None => {
                totals.insert(r.to_string(), v);
            }
        }
    }
}
