//! Which of a queue's workers may take Jobs in a pass, and what a Job that only the others
//! could hold waits for.

use super::{join, the_gang, Pass, WorkerReason};
use crate::api::QueueSettings;
use crate::dispatcher::oracle::{Gang, Oracle, Verdict};
use crate::dispatcher::reason;
use crate::dispatcher::state::{State, Worker};
use crate::inventory::Cluster;

/// Why no Job may go to a worker in a pass.
#[derive(Debug, Clone)]
pub(super) struct Unusable {
    pub(super) why: String,
    /// It does not answer (not connected, or its inventory is stale): it may come back.
    pub(super) unreachable: bool,
}

/// Why a worker cannot be tried for any Job now, if it cannot (`worker` and `cluster`: the
/// worker and its cluster in the inventory, as found in `state`).
pub(super) fn why_unusable(
    state: &State,
    name: &str,
    worker: Option<&Worker>,
    cluster: Option<&Cluster>,
) -> Option<Unusable> {
    let kept = |why: String| {
        Some(Unusable {
            why,
            unreachable: false,
        })
    };
    let Some(worker) = worker else {
        return kept("no such WorkerCluster".into());
    };
    if !worker.connected {
        return Some(Unusable {
            why: if worker.message.is_empty() {
                "not connected".into()
            } else {
                format!("not connected ({})", worker.message)
            },
            unreachable: true,
        });
    }
    if !worker.copies_synced() {
        return kept("connected, its Jobs not listed yet".into());
    }
    if let Some(why) = cluster.and_then(|c| c.unavailable.as_ref()) {
        return Some(Unusable {
            why: why.clone(),
            unreachable: true,
        });
    }
    if state.has_stale_copies(name) {
        return kept("copies of Jobs taken back from it are still being removed".into());
    }
    None
}

/// "worker a", "workers a and b", "workers a, b and c".
pub(super) fn named<S: AsRef<str>>(names: &[S]) -> String {
    match names {
        [] => "no worker".into(),
        [one] => format!("worker {}", one.as_ref()),
        [rest @ .., last] => format!(
            "workers {} and {}",
            rest.iter()
                .map(AsRef::as_ref)
                .collect::<Vec<_>>()
                .join(", "),
            last.as_ref()
        ),
    }
}

impl<'w> Pass<'w> {
    /// Whether every worker of the queue is unreachable.
    pub(super) fn all_unreachable(&mut self, settings: &'w QueueSettings) -> bool {
        settings
            .clusters
            .iter()
            .all(|name| self.unusable(name).is_some_and(|u| u.unreachable))
    }

    /// Why a gang that none of the workers it was asked about (`asked`, by position) could
    /// hold even empty waits. Not for ever while a worker of the queue that cannot take Jobs
    /// now could hold it (it waits for that worker to answer again, or to take Jobs again),
    /// or has not been seen yet (its nodes are not known); `NeverFits` only when every
    /// worker of the queue has been seen and none could.
    pub(super) fn beyond_reach(
        &mut self,
        gang: &Gang<'w>,
        settings: &'w QueueSettings,
        asked: &[usize],
        reasons: &[WorkerReason<'w>],
        oracle: &mut impl Oracle<'w>,
    ) -> Verdict {
        let job = gang.job;
        let mut unreachable: Vec<&str> = Vec::new();
        let mut later: Vec<&str> = Vec::new();
        for (i, name) in settings.clusters.iter().enumerate() {
            if asked.contains(&i) {
                continue;
            }
            let unusable = self.unusable(name);
            let seen = self.state.inventory.cluster(name).is_some();
            if seen && oracle.fit_drained(gang, name, i).is_none() {
                continue;
            }
            match unusable {
                Some(u) if u.unreachable => unreachable.push(name),
                _ => later.push(name),
            }
        }
        if !unreachable.is_empty() {
            Verdict::wait(
                reason::WORKER_UNREACHABLE,
                self.say(|| {
                    format!(
                        "no worker of queue {:?} that answers could hold {} even empty; {} could, and {} unreachable: {}",
                        job.queue,
                        the_gang(job),
                        named(&unreachable),
                        if unreachable.len() == 1 { "it is" } else { "they are" },
                        join(reasons)
                    )
                }),
            )
        } else if !later.is_empty() {
            Verdict::wait(
                reason::NO_WORKER_FITS,
                self.say(|| {
                    format!(
                        "no worker of queue {:?} that can take Jobs now could hold {} even empty; {} might, once it can (or once its nodes are known): {}",
                        job.queue,
                        the_gang(job),
                        named(&later),
                        join(reasons)
                    )
                }),
            )
        } else {
            Verdict::wait(
                reason::NEVER_FITS,
                self.say(|| {
                    format!(
                        "no worker of queue {:?} could hold {} even empty: {}",
                        job.queue,
                        the_gang(job),
                        join(reasons)
                    )
                }),
            )
        }
    }
}
