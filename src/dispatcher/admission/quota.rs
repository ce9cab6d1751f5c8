//! A queue's quota: what is in force, and whether it covers a gang's whole request.
//!
//! A pass counts quota in amounts indexed by resource ([`Resources`]): every Job looked at is
//! checked against its queue's quota, so the check is a walk over a few numbers.

use crate::api::QueueSettings;
use crate::dispatcher::job::Job;
use crate::dispatcher::ledger::Ledger;
use crate::dispatcher::oracle::view::show;
use crate::dispatcher::state::{State, Worker};
use crate::inventory::Cluster;
use foldhash::HashMap;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::SystemTime;

/// The queue's quota in force: its own, or the sum of its workers' allocatable. A worker
/// counts until it is lost (unreachable for `workerLostTimeout`), with the allocatable last
/// known: a short disconnect changes nothing, not even the quota.
pub(crate) fn effective(
    state: &State,
    settings: &QueueSettings,
    now: SystemTime,
) -> BTreeMap<String, i64> {
    if let Some(q) = &settings.quota {
        return q.iter().map(|(k, v)| (k.clone(), v.0)).collect();
    }
    let table = &state.inventory.resources;
    automatic(looked_up(state, settings), settings, table.len(), now)
        .in_force
        .into_iter()
        .enumerate()
        .filter_map(|(r, sum)| Some((table.name(r).to_string(), sum?)))
        .collect()
}

/// A queue's automatic quota, by the inventory's resource ids (`None`: none of the workers
/// counted has the resource).
struct Automatic {
    /// The sum of the allocatable of the queue's workers not lost.
    in_force: Vec<Option<i64>>,
    /// The same with the lost workers counted (they may come back).
    with_lost: Vec<Option<i64>>,
    /// The lost workers the inventory knows.
    lost: Vec<String>,
}

/// A queue's workers as its automatic quota counts them: each one's name, its cluster in
/// the inventory and the worker, when known.
pub(crate) type Counted<'a> = (&'a str, Option<&'a Cluster>, Option<&'a Worker>);

/// The queue's workers, each looked up in the state (see [`Counted`]).
fn looked_up<'a>(
    state: &'a State,
    settings: &'a QueueSettings,
) -> impl Iterator<Item = Counted<'a>> + 'a {
    settings.clusters.iter().map(|name| {
        (
            name.as_str(),
            state.inventory.cluster(name),
            state.workers.get(name),
        )
    })
}

/// The automatic quota of a queue whose workers are `workers` (see [`Counted`]) in an
/// inventory of `resources` resources.
fn automatic<'a>(
    workers: impl Iterator<Item = Counted<'a>>,
    settings: &QueueSettings,
    resources: usize,
    now: SystemTime,
) -> Automatic {
    let mut a = Automatic {
        in_force: vec![None; resources],
        with_lost: vec![None; resources],
        lost: Vec::new(),
    };
    let add = |sums: &mut Vec<Option<i64>>, allocatable: &[i64]| {
        for (sum, v) in sums.iter_mut().zip(allocatable) {
            if *v > 0 {
                *sum = Some(sum.unwrap_or(0).saturating_add(*v));
            }
        }
    };
    for (name, cluster, worker) in workers {
        let Some(c) = cluster else {
            continue;
        };
        let counted = worker.is_some_and(|w| !w.lost(now, settings.worker_lost_timeout));
        if counted {
            add(&mut a.in_force, &c.summary.allocatable);
        } else {
            a.lost.push(name.to_string());
        }
        add(&mut a.with_lost, &c.summary.allocatable);
    }
    a
}

/// Up to this many resources, [`Resources::id`] finds a name by comparing it with each.
const FEW: usize = 8;

/// The resources a pass counts quota in, each with an index: the inventory's (with the
/// inventory's ids), then any other that a queue's quota or use names. A Job asking for a
/// resource none of them names asks for one no quota limits and no admitted Job uses.
pub(crate) struct Resources<'w> {
    /// Empty while there are at most [`FEW`].
    ids: HashMap<&'w str, usize>,
    names: Vec<&'w str>,
}

impl<'w> Resources<'w> {
    pub(crate) fn new(state: &'w State, ledger: &'w Ledger) -> Self {
        let table = &state.inventory.resources;
        let mut r = Self {
            ids: HashMap::default(),
            names: Vec::with_capacity(table.len()),
        };
        for id in 0..table.len() {
            r.intern(table.name(id));
        }
        for q in state.queues.values() {
            if let Some(quota) = q.settings.as_ref().ok().and_then(|s| s.quota.as_ref()) {
                for name in quota.keys() {
                    r.intern(name);
                }
            }
        }
        for (_, u) in ledger.queue_uses() {
            for name in u.usage.keys() {
                r.intern(name);
            }
        }
        r
    }

    fn intern(&mut self, name: &'w str) {
        if self.id(name).is_some() {
            return;
        }
        self.names.push(name);
        if self.names.len() > FEW {
            if self.ids.is_empty() {
                self.ids = self
                    .names
                    .iter()
                    .enumerate()
                    .map(|(id, n)| (*n, id))
                    .collect();
            } else {
                self.ids.insert(name, self.names.len() - 1);
            }
        }
    }

    pub(crate) fn id(&self, name: &str) -> Option<usize> {
        // A pass counts a handful of resources, and looks one up for every resource of every
        // Job it checks: comparing a few names (most differ in length) costs less than
        // hashing one. The map is only made for more.
        if self.names.len() <= FEW {
            return self.names.iter().position(|n| *n == name);
        }
        self.ids.get(name).copied()
    }

    /// How many resources there are.
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// `amounts` by name as amounts by index.
    pub(crate) fn amounts(&self, amounts: &BTreeMap<String, i64>) -> Amounts {
        let mut out = vec![0; self.names.len()];
        for (name, v) in amounts {
            if let Some(id) = self.id(name) {
                out[id] = *v;
            }
        }
        out
    }

    /// The queue's quota in force (see [`effective`]), by index, for a queue whose workers
    /// are `workers` (see [`Counted`]).
    pub(crate) fn quota<'a>(
        &self,
        state: &State,
        settings: &QueueSettings,
        workers: impl Iterator<Item = Counted<'a>>,
        now: SystemTime,
    ) -> Quota {
        let mut limits = vec![None; self.names.len()];
        let mut with_lost = Vec::new();
        let mut lost = Vec::new();
        match &settings.quota {
            Some(own) => {
                for (name, v) in own {
                    if let Some(id) = self.id(name) {
                        limits[id] = Some(v.0);
                    }
                }
            }
            // The inventory's resources come first, with its ids.
            None => {
                let a = automatic(workers, settings, state.inventory.resources.len(), now);
                for (id, sum) in a.in_force.into_iter().enumerate() {
                    limits[id] = sum;
                }
                if !a.lost.is_empty() {
                    with_lost = vec![None; self.names.len()];
                    for (id, sum) in a.with_lost.into_iter().enumerate() {
                        with_lost[id] = sum;
                    }
                    lost = a.lost;
                }
            }
        }
        Quota {
            limits,
            automatic: settings.quota.is_none(),
            with_lost,
            lost,
        }
    }

    /// Adds the Job's whole request to `totals`.
    pub(crate) fn add(&self, totals: &mut Amounts, job: &Job) {
        for (name, v) in job.total_requests() {
            if let Some(id) = self.id(name) {
                totals[id] += v;
            }
        }
    }
}

/// Amounts by resource index (see [`Resources`]).
pub(crate) type Amounts = Vec<i64>;

/// A queue's quota during a pass.
pub(crate) struct Quota {
    /// The limit per resource.
    pub(crate) limits: Vec<Option<i64>>,
    /// The queue sets no quota of its own: it is the sum of its workers' allocatable, and a
    /// resource none of them has can never be given.
    pub(crate) automatic: bool,
    /// An automatic quota with its lost workers counted (empty when none is lost): a lost
    /// worker may come back, so what only it could give is waited for, not refused.
    pub(crate) with_lost: Vec<Option<i64>>,
    /// Those lost workers.
    pub(crate) lost: Vec<String>,
}

/// Whether a queue's quota covers a gang now.
pub(crate) enum QuotaCheck {
    Covered,
    /// Not now: what is short (empty unless messages are asked for).
    Short(String),
    /// Never: the gang asks for more than the quota is, or for a resource it has none of.
    Never(String),
    /// Not while workers of the queue are lost: they would give what the gang asks for
    /// beyond the quota in force (what, and the lost workers).
    Unreachable(String, Vec<String>),
}

/// Whether `quota` covers the whole gang of `job` on top of what the queue's admitted Jobs
/// use (`used`) and what it holds for starving Jobs (`held`).
pub(crate) fn check(
    job: &Job,
    resources: &Resources<'_>,
    quota: &Quota,
    used: &[i64],
    held: &[i64],
    describe: bool,
) -> QuotaCheck {
    // The texts are only written when messages are asked for; the flags decide.
    let (mut is_short, mut is_never, mut is_unreachable) = (false, false, false);
    let mut short = String::new();
    let mut never = String::new();
    let mut unreachable = String::new();
    for (r, n) in job.total_requests() {
        let id = resources.id(r);
        let limit = id.and_then(|id| quota.limits[id]);
        if n > limit.unwrap_or(0) && (limit.is_some() || quota.automatic) {
            let with_lost = id.and_then(|id| quota.with_lost.get(id).copied().flatten());
            if with_lost.is_some_and(|all| n <= all) {
                is_unreachable = true;
                if describe {
                    let _ = write!(
                        unreachable,
                        "{}{} {r} ({} without them)",
                        sep(&unreachable),
                        show(r, n),
                        show(r, limit.unwrap_or(0))
                    );
                }
                continue;
            }
        }
        let Some(limit) = limit else {
            if quota.automatic && n > 0 {
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
        let taken = id.map_or(0, |id| used[id] + held[id]);
        if taken + n > limit {
            is_short = true;
            if describe {
                let _ = write!(
                    short,
                    "{}{} {r} ({} of {} free)",
                    sep(&short),
                    show(r, n),
                    show(r, (limit - taken).max(0)),
                    show(r, limit)
                );
            }
        }
    }
    if is_never {
        QuotaCheck::Never(never)
    } else if is_unreachable {
        QuotaCheck::Unreachable(unreachable, quota.lost.clone())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids are found the same by comparing names (a few) and through the map (more): each
    /// name keeps the id it was interned with, and a name never interned has none.
    #[test]
    fn a_resource_keeps_its_id_as_more_are_counted() {
        let names: Vec<String> = (0..3 * FEW).map(|i| format!("example.com/r{i}")).collect();
        let mut r = Resources {
            ids: HashMap::default(),
            names: Vec::new(),
        };
        for (count, name) in names.iter().enumerate() {
            r.intern(name);
            r.intern(name);
            assert_eq!(r.len(), count + 1);
            for (id, earlier) in names.iter().take(count + 1).enumerate() {
                assert_eq!(
                    r.id(earlier),
                    Some(id),
                    "{earlier} with {} counted",
                    count + 1
                );
            }
            assert_eq!(r.id("example.com/none"), None);
            assert_eq!(r.id(&format!("{}0", names[count])), None);
        }
    }
}
