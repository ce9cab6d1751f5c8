//! The result of a simulation, in the format of `tests/data/formats/simulate-output.md`: one
//! JSON object (`--output json`), or a table and a summary for people (`--output text`).

use super::{secs, Simulation};
use crate::dispatcher::JobResult;
use k8s_openapi::api::batch::v1::JobStatus;
use serde::Serialize;
use serde_json::{Number, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub strategy: String,
    pub jobs: Vec<JobReport>,
    pub summary: Summary,
    /// The decisions in order, when asked for (not part of the JSON format).
    #[serde(skip)]
    pub events: Vec<String>,
    /// The statuses written to manager Jobs in order, when asked for (not part of the JSON
    /// format).
    #[serde(skip)]
    pub status_writes: Vec<StatusWrite>,
}

/// A status the dispatcher wrote to a manager Job and the API server accepted.
#[derive(Debug, Clone)]
pub struct StatusWrite {
    /// Seconds of virtual time since the scenario start.
    pub at: f64,
    /// `namespace/name`.
    pub job: String,
    pub status: JobStatus,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    pub name: String,
    pub(crate) namespace: String,
    pub(crate) queue: String,
    pub cluster: Option<String>,
    pub submitted: Value,
    pub admitted: Value,
    pub started: Value,
    pub finished: Value,
    pub result: String,
    pub requeues: u32,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub jobs: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub pending: usize,
    pub makespan: Value,
    pub mean_wait: Value,
    pub(crate) utilization: BTreeMap<String, Value>,
    pub topology_affinity_errors: u64,
    pub remote_writes_per_job: Value,
    pub max_quota_usage: BTreeMap<String, BTreeMap<String, Value>>,
}

/// A number as JSON: an integer when whole, else rounded to `places` decimals.
fn num(x: f64, places: i32) -> Value {
    let scale = 10f64.powi(places);
    let x = (x * scale).round() / scale;
    if x.fract() == 0.0 && x.abs() < 9e15 {
        Value::Number(Number::from(x as i64))
    } else {
        Number::from_f64(x).map_or(Value::Null, Value::Number)
    }
}

fn time(t: Option<std::time::SystemTime>) -> Value {
    t.map_or(Value::Null, |t| num(secs(t), 3))
}

pub(super) fn build(sim: &Simulation) -> Report {
    let world = sim.world();
    let mut jobs = Vec::new();
    let (mut succeeded, mut failed, mut pending) = (0, 0, 0);
    let mut waits = Vec::new();
    let mut makespan = 0f64;
    let mut requested: BTreeSet<String> = BTreeSet::new();
    for (i, sj) in sim.scenario_jobs().iter().enumerate() {
        let rec = &sim.records[i];
        let key = crate::dispatcher::JobKey::new(&sj.namespace, &sj.name);
        let job = world.state.jobs.get(&key);
        requested.extend(sj.pod.node_request.keys().cloned());
        let submitted = super::epoch() + sj.submit_at;
        let (result, reason) = match job {
            None => ("Pending".to_string(), Some("never submitted".to_string())),
            Some(j) => match (j.result, &j.deactivated) {
                (Some(JobResult::Succeeded), _) => ("Succeeded".into(), None),
                (Some(JobResult::Failed), _) => {
                    let mut why = format!(
                        "its pods failed {} times in worker {} (backoffLimit {})",
                        j.status.failed.unwrap_or(0),
                        rec.cluster.as_deref().unwrap_or("?"),
                        super::worker::BACKOFF_LIMIT
                    );
                    if rec.topology_errors > 0 {
                        let _ = write!(
                            why,
                            "; {} rejected by a kubelet's Topology Manager (TopologyAffinityError)",
                            rec.topology_errors
                        );
                    }
                    ("Failed".into(), Some(why))
                }
                (None, Some(msg)) => ("Deactivated".into(), Some(msg.clone())),
                (None, None) => {
                    let why = if let Some(c) = &j.cluster {
                        format!("still running in worker {c} when the simulation ended")
                    } else if !j.offers.is_empty() {
                        format!(
                            "offered to workers {} and not yet started when the simulation ended",
                            j.offers.join(", ")
                        )
                    } else {
                        sim.waiting
                            .get(&j.class())
                            .cloned()
                            .unwrap_or_else(|| "never admitted".into())
                    };
                    ("Pending".into(), Some(why))
                }
            },
        };
        match result.as_str() {
            "Succeeded" => succeeded += 1,
            "Failed" => failed += 1,
            "Pending" => pending += 1,
            _ => {}
        }
        if let Some(t) = rec.first_admitted {
            waits.push(secs(t) - secs(submitted));
        }
        if let Some(t) = rec.finished {
            makespan = makespan.max(secs(t));
        }
        jobs.push(JobReport {
            name: sj.name.clone(),
            namespace: sj.namespace.clone(),
            queue: sj.queue.clone(),
            cluster: rec.cluster.clone(),
            submitted: time(Some(submitted)),
            admitted: time(rec.admitted),
            started: time(rec.started),
            finished: time(rec.finished),
            result,
            requeues: job.map_or(0, |j| j.requeues),
            reason,
        });
    }
    let n = jobs.len();
    let mean_wait = if waits.is_empty() {
        Value::Null
    } else {
        num(waits.iter().sum::<f64>() / waits.len() as f64, 3)
    };

    let table = &world.state.inventory.resources;
    let mut utilization = BTreeMap::new();
    for (name, integral) in sim.usage_integrals() {
        let Some(cluster) = world.state.inventory.cluster(name) else {
            continue;
        };
        let mut fracs = Vec::new();
        for r in &requested {
            let Some(id) = table.id(r) else { continue };
            let alloc = cluster.summary.allocatable.get(id).copied().unwrap_or(0);
            if alloc <= 0 || makespan <= 0.0 {
                continue;
            }
            fracs.push(integral.get(id).copied().unwrap_or(0.0) / (alloc as f64 * makespan));
        }
        let u = if fracs.is_empty() {
            0.0
        } else {
            fracs.iter().sum::<f64>() / fracs.len() as f64
        };
        utilization.insert(name.to_string(), num(u, 3));
    }

    let mut max_quota_usage = BTreeMap::new();
    for (queue, per) in &sim.max_quota {
        let q_requested: BTreeSet<&String> = sim
            .scenario_jobs()
            .iter()
            .filter(|j| &j.queue == queue)
            .flat_map(|j| j.pod.node_request.keys())
            .collect();
        let explicit = world
            .state
            .queues
            .get(queue)
            .and_then(|q| q.settings.as_ref().ok())
            .is_some_and(|s| s.quota.is_some());
        let m: BTreeMap<String, Value> = per
            .iter()
            .filter(|(r, _)| explicit || q_requested.contains(r))
            .map(|(r, v)| (r.clone(), num(*v, 3)))
            .collect();
        max_quota_usage.insert(queue.clone(), m);
    }

    Report {
        strategy: sim.strategy().as_str().to_string(),
        jobs,
        summary: Summary {
            jobs: n,
            succeeded,
            failed,
            pending,
            makespan: num(makespan, 3),
            mean_wait,
            utilization,
            topology_affinity_errors: sim.topology_errors,
            remote_writes_per_job: if n == 0 {
                num(0.0, 3)
            } else {
                num(sim.remote_writes as f64 / n as f64, 3)
            },
            max_quota_usage,
        },
        events: sim.log.clone().unwrap_or_default(),
        status_writes: sim.status_writes.clone().unwrap_or_default(),
    }
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
    }

    /// The jobs as a table, then the summary.
    pub fn to_text(&self) -> String {
        let show = |v: &Value| match v {
            Value::Null => "-".to_string(),
            other => other.to_string(),
        };
        let header = [
            "NAME",
            "NAMESPACE",
            "QUEUE",
            "CLUSTER",
            "SUBMITTED",
            "ADMITTED",
            "STARTED",
            "FINISHED",
            "RESULT",
            "REQUEUES",
        ];
        let rows: Vec<[String; 10]> = self
            .jobs
            .iter()
            .map(|j| {
                [
                    j.name.clone(),
                    j.namespace.clone(),
                    j.queue.clone(),
                    j.cluster.clone().unwrap_or_else(|| "-".into()),
                    show(&j.submitted),
                    show(&j.admitted),
                    show(&j.started),
                    show(&j.finished),
                    j.result.clone(),
                    j.requeues.to_string(),
                ]
            })
            .collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        let mut out = format!("strategy: {}\n\n", self.strategy);
        let line = |cells: Vec<&str>, out: &mut String| {
            let parts: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            out.push_str(parts.join("  ").trim_end());
            out.push('\n');
        };
        line(header.to_vec(), &mut out);
        for r in &rows {
            line(r.iter().map(String::as_str).collect(), &mut out);
        }
        let reasons: Vec<&JobReport> = self.jobs.iter().filter(|j| j.reason.is_some()).collect();
        if !reasons.is_empty() {
            out.push_str("\nwhy:\n");
            for j in reasons {
                let _ = writeln!(
                    out,
                    "  {}/{}: {}",
                    j.namespace,
                    j.name,
                    j.reason.as_deref().unwrap_or("")
                );
            }
        }
        let s = &self.summary;
        // The JSON summary has no count of its own for them (the format's), so the text
        // names them, or the counts would not add up to the jobs.
        let deactivated = self
            .jobs
            .iter()
            .filter(|j| j.result == "Deactivated")
            .count();
        let _ = write!(
            out,
            "\njobs {}: {} succeeded, {} failed, {} pending",
            s.jobs, s.succeeded, s.failed, s.pending
        );
        if deactivated > 0 {
            let _ = write!(out, ", {deactivated} deactivated");
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "makespan: {}s   mean wait: {}s",
            show(&s.makespan),
            show(&s.mean_wait)
        );
        let util: Vec<String> = s
            .utilization
            .iter()
            .map(|(c, u)| format!("{c} {u}"))
            .collect();
        let _ = writeln!(out, "utilization: {}", util.join(", "));
        let _ = writeln!(
            out,
            "TopologyAffinityErrors: {}",
            s.topology_affinity_errors
        );
        let _ = writeln!(
            out,
            "remote writes per job: {}",
            show(&s.remote_writes_per_job)
        );
        for (q, per) in &s.max_quota_usage {
            let parts: Vec<String> = per.iter().map(|(r, v)| format!("{r} {v}")).collect();
            let _ = writeln!(out, "max quota usage of {q}: {}", parts.join(", "));
        }
        out
    }
}
