//! The result of a simulation, in the format of `tests/data/formats/simulate-output.md`: one
//! JSON object (`--output json`), or a table and a summary for people (`--output text`).

use super::{secs, Record, ScenarioJob, Simulation};
use crate::dispatcher::kind::Status;
use crate::dispatcher::{Job, JobResult};
use serde::Serialize;
use serde_json::{Number, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

pub mod chart;
pub mod html;
#[cfg(test)]
mod tests;

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
    /// Per worker and resource requested by the scenario's Jobs, what was in use over time,
    /// when asked for ([`Simulation::with_usage_history`]; not part of the JSON format).
    #[serde(skip)]
    pub capacity: Vec<Capacity>,
}

/// What a worker's running pods requested of one resource over time.
#[derive(Debug, Clone)]
pub struct Capacity {
    pub cluster: String,
    pub resource: String,
    /// The worker's allocatable amount (thousandths).
    pub allocatable: i64,
    /// Steps: from each time (seconds) on, the amount in use (thousandths) until the next
    /// time; at most [`chart::MAX_POINTS`] of them, averaged over equal spans of time when
    /// there were more changes.
    pub steps: Vec<(f64, f64)>,
    /// The end of the run: the last step lasts until then.
    pub until: f64,
}

/// A status the dispatcher wrote to a manager Job and the API server accepted.
#[derive(Debug, Clone)]
pub struct StatusWrite {
    /// Seconds of virtual time since the scenario start.
    pub at: f64,
    /// `namespace/name`.
    pub job: String,
    /// The status as the API server would show it (a batch/v1 Job's, or a JobSet's).
    pub status: serde_json::Value,
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
    /// `JobSet` for a JobSet, after the format's fields; absent for a batch/v1 Job, whose
    /// entry stays exactly the format's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
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
    /// `started − submitted` over the Jobs that started.
    pub start_wait: Spread,
    /// `finished − submitted` over the Succeeded Jobs.
    pub completion_time: Spread,
    /// Per resource, the resource-hours of the pods of Succeeded Jobs.
    pub goodput: BTreeMap<String, Value>,
    pub topology_affinity_errors_by_cluster: BTreeMap<String, u64>,
    pub by_queue: BTreeMap<String, Breakdown>,
    /// `cpu-only`, and one entry per extended resource requested.
    pub by_kind: BTreeMap<String, Breakdown>,
}

/// Mean, nearest-rank percentiles and maximum of some seconds; all `null` when there are none.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    pub mean: Value,
    pub p50: Value,
    pub p95: Value,
    pub max: Value,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Self {
        if values.is_empty() {
            return Self {
                mean: Value::Null,
                p50: Value::Null,
                p95: Value::Null,
                max: Value::Null,
            };
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        // Nearest rank: the smallest value with at least p % of the values at or below it.
        let rank = |p: usize| values[(p * n).div_ceil(100).clamp(1, n) - 1];
        Self {
            mean: num(values.iter().sum::<f64>() / n as f64, 3),
            p50: num(rank(50), 3),
            p95: num(rank(95), 3),
            max: num(values[n - 1], 3),
        }
    }

    /// As the text output shows it.
    fn text(&self) -> String {
        if self.mean.is_null() {
            return "-".into();
        }
        format!(
            "mean {}s, p50 {}s, p95 {}s, max {}s",
            self.mean, self.p50, self.p95, self.max
        )
    }
}

/// The Jobs of one queue, or of one kind.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Breakdown {
    pub jobs: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub pending: usize,
    pub start_wait: Spread,
    pub goodput: BTreeMap<String, Value>,
}

/// What a [`Breakdown`] is made of, while Jobs are added to it.
#[derive(Default)]
struct Tally {
    jobs: usize,
    succeeded: usize,
    failed: usize,
    pending: usize,
    start_waits: Vec<f64>,
    goodput: BTreeMap<String, f64>,
}

impl Tally {
    fn add(&mut self, job: &Outcome) {
        self.jobs += 1;
        match job.result {
            "Succeeded" => self.succeeded += 1,
            "Failed" => self.failed += 1,
            "Pending" => self.pending += 1,
            _ => {}
        }
        self.start_waits.extend(job.start_wait);
        for (r, hours) in &job.goodput {
            *self.goodput.entry(r.clone()).or_insert(0.0) += hours;
        }
    }

    fn breakdown(self) -> Breakdown {
        Breakdown {
            jobs: self.jobs,
            succeeded: self.succeeded,
            failed: self.failed,
            pending: self.pending,
            start_wait: Spread::of(self.start_waits),
            goodput: hours(&self.goodput),
        }
    }
}

/// What one Job adds to the summary's distributions and breakdowns.
struct Outcome<'a> {
    result: &'a str,
    start_wait: Option<f64>,
    /// Every resource it requests, with the resource-hours its pods did (0 unless it
    /// succeeded).
    goodput: Vec<(String, f64)>,
}

fn hours(goodput: &BTreeMap<String, f64>) -> BTreeMap<String, Value> {
    goodput
        .iter()
        .map(|(r, h)| (r.clone(), num(*h, 3)))
        .collect()
}

/// Resources a Job's kind is named after: all but cpu, memory, ephemeral-storage, pods and
/// hugepages-*.
/// The kinds a Job counts in (`byKind`): one per extended resource its pods request, or
/// `cpu-only`.
pub(crate) fn kinds(job: &crate::simulate::ScenarioJob) -> Vec<&str> {
    let extended: Vec<&str> = job
        .shapes()
        .flat_map(|pod| pod.node_request.keys())
        .map(String::as_str)
        .filter(|r| is_extended(r))
        .collect::<BTreeSet<&str>>()
        .into_iter()
        .collect();
    if extended.is_empty() {
        vec!["cpu-only"]
    } else {
        extended
    }
}

fn is_extended(resource: &str) -> bool {
    !matches!(resource, "cpu" | "memory" | "ephemeral-storage" | "pods")
        && !resource.starts_with("hugepages-")
}

/// Resources counted in bytes, whose goodput is in GiB-hours.
fn in_bytes(resource: &str) -> bool {
    matches!(resource, "memory" | "ephemeral-storage") || resource.starts_with("hugepages-")
}

/// `milli` thousandths of `resource` held for `seconds`, in the resource's unit-hours (cores,
/// GiB, devices).
fn resource_hours(resource: &str, milli: i64, seconds: f64) -> f64 {
    let mut amount = milli as f64 / 1000.0;
    if in_bytes(resource) {
        amount /= (1u64 << 30) as f64;
    }
    amount * seconds / 3600.0
}

/// The unit of a resource's goodput in the text output.
fn hours_unit(resource: &str) -> &'static str {
    match resource {
        "cpu" => "core-h",
        r if in_bytes(r) => "GiB-h",
        _ => "device-h",
    }
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
    let (mut start_waits, mut completion_times) = (Vec::new(), Vec::new());
    let mut all = Tally::default();
    let mut by_queue: BTreeMap<String, Tally> = world
        .state
        .queues
        .keys()
        .map(|q| (q.clone(), Tally::default()))
        .collect();
    let mut by_kind: BTreeMap<String, Tally> = BTreeMap::new();
    let mut makespan = 0f64;
    let mut requested: BTreeSet<String> = BTreeSet::new();
    for (i, sj) in sim.scenario_jobs().iter().enumerate() {
        let rec = &sim.records[i];
        let job = world.state.jobs.get(&sj.key());
        requested.extend(sj.shapes().flat_map(|pod| pod.node_request.keys().cloned()));
        let submitted = super::epoch() + sj.submit_at;
        let (result, reason) = result_of(sim, job, rec);
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
        let succeeded = result == "Succeeded";
        let start_wait = rec.started.map(|t| secs(t) - secs(submitted));
        start_waits.extend(start_wait);
        if let (true, Some(t)) = (succeeded, rec.finished) {
            completion_times.push(secs(t) - secs(submitted));
        }
        let outcome = Outcome {
            result: &result,
            start_wait,
            goodput: goodput_of(sj, rec, succeeded),
        };
        all.add(&outcome);
        by_queue.entry(sj.queue.clone()).or_default().add(&outcome);
        for kind in kinds(sj) {
            by_kind.entry(kind.to_string()).or_default().add(&outcome);
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
            kind: sj.is_jobset().then(|| sj.kind.name().to_string()),
        });
    }
    let n = jobs.len();
    let mean_wait = if waits.is_empty() {
        Value::Null
    } else {
        num(waits.iter().sum::<f64>() / waits.len() as f64, 3)
    };

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
            utilization: utilization(sim, &requested, makespan),
            topology_affinity_errors: sim.topology_errors,
            remote_writes_per_job: if n == 0 {
                num(0.0, 3)
            } else {
                num(sim.remote_writes as f64 / n as f64, 3)
            },
            max_quota_usage: max_quota_usage(sim),
            start_wait: Spread::of(start_waits),
            completion_time: Spread::of(completion_times),
            goodput: hours(&all.goodput),
            topology_affinity_errors_by_cluster: sim
                .topology_errors_by_worker()
                .map(|(name, n)| (name.to_string(), n))
                .collect(),
            by_queue: by_queue
                .into_iter()
                .map(|(q, t)| (q, t.breakdown()))
                .collect(),
            by_kind: by_kind
                .into_iter()
                .map(|(k, t)| (k, t.breakdown()))
                .collect(),
        },
        events: sim.log.clone().unwrap_or_default(),
        status_writes: sim.status_writes.clone().unwrap_or_default(),
        capacity: capacity(sim, &requested, makespan),
    }
}

/// A Job's result as the report names it, and why when it did not succeed.
fn result_of(sim: &Simulation, job: Option<&Job>, rec: &Record) -> (String, Option<String>) {
    let Some(j) = job else {
        return ("Pending".to_string(), Some("never submitted".to_string()));
    };
    match (j.result, &j.deactivated) {
        (Some(JobResult::Succeeded), _) => ("Succeeded".into(), None),
        (Some(JobResult::Failed), _) => ("Failed".into(), Some(why_failed(j, rec))),
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
                let waits = sim.job_waiting.get(&j.key);
                match waits.or_else(|| sim.waiting.get(&j.class())) {
                    Some(why) => why.clone(),
                    None if j.requeues > 0 => format!(
                        "requeued {}, and not admitted again when the simulation ended (--events shows each requeue and why)",
                        match j.requeues {
                            1 => "once".to_string(),
                            n => format!("{n} times"),
                        }
                    ),
                    None => "never admitted".into(),
                }
            };
            ("Pending".into(), Some(why))
        }
    }
}

/// Why a Job failed in its worker: its pods' failures, and the kubelets' rejections among them.
fn why_failed(j: &Job, rec: &Record) -> String {
    let worker = rec.cluster.as_deref().unwrap_or("?");
    let limit = super::worker::BACKOFF_LIMIT;
    let mut why = match &j.status {
        Status::Job(s) => format!(
            "its pods failed {} times in worker {worker} (backoffLimit {limit})",
            s.failed.unwrap_or(0),
        ),
        Status::JobSet(s) => format!(
            "{} of its Jobs failed in worker {worker} (each after its pods \
             failed past backoffLimit {limit}; the JobSet's failurePolicy \
             restarts none)",
            s.replicated_jobs_status
                .iter()
                .map(|r| r.failed.max(0))
                .sum::<i32>(),
        ),
    };
    if rec.topology_errors > 0 {
        let _ = write!(
            why,
            "; {} rejected by a kubelet's Topology Manager (TopologyAffinityError)",
            rec.topology_errors
        );
    }
    why
}

/// The resource-hours a Job's pods did, per resource it asks for: counted once its Job has
/// succeeded, those of the copy that completed, each pod shape's (a JobSet may have several)
/// for as long as its pods ran.
fn goodput_of(sj: &ScenarioJob, rec: &Record, succeeded: bool) -> Vec<(String, f64)> {
    let mut goodput: BTreeMap<String, f64> = sj
        .shapes()
        .flat_map(|pod| pod.node_request.keys())
        .map(|r| (r.clone(), 0.0))
        .collect();
    if let (true, Some(ran)) = (succeeded, &rec.ran) {
        for (pod, d) in ran {
            for (r, milli) in &pod.node_request {
                *goodput.entry(r.clone()).or_default() +=
                    resource_hours(r, *milli, d.as_secs_f64());
            }
        }
    }
    goodput.into_iter().collect()
}

/// Each worker's mean use over the run, of the resources some Job asked for.
fn utilization(
    sim: &Simulation,
    requested: &BTreeSet<String>,
    makespan: f64,
) -> BTreeMap<String, Value> {
    let world = sim.world();
    let table = &world.state.inventory.resources;
    let mut utilization = BTreeMap::new();
    for (name, integral) in sim.usage_integrals() {
        let Some(cluster) = world.state.inventory.cluster(name) else {
            continue;
        };
        let mut fracs = Vec::new();
        for r in requested {
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
    utilization
}

/// Each queue's highest quota use, of the resources its quota names or its Jobs ask for.
fn max_quota_usage(sim: &Simulation) -> BTreeMap<String, BTreeMap<String, Value>> {
    let world = sim.world();
    let mut max_quota_usage = BTreeMap::new();
    for (queue, per) in &sim.max_quota {
        let q_requested: BTreeSet<&String> = sim
            .scenario_jobs()
            .iter()
            .filter(|j| &j.queue == queue)
            .flat_map(|j| j.shapes())
            .flat_map(|pod| pod.node_request.keys())
            .collect();
        let explicit = world
            .state
            .settings(queue)
            .is_some_and(|s| s.quota.is_some());
        let m: BTreeMap<String, Value> = per
            .iter()
            .filter(|(r, _)| explicit || q_requested.contains(r))
            .map(|(r, v)| (r.clone(), num(*v, 3)))
            .collect();
        max_quota_usage.insert(queue.clone(), m);
    }
    max_quota_usage
}

/// The usage histories kept, per worker and resource requested by some Job, as steps.
fn capacity(sim: &Simulation, requested: &BTreeSet<String>, makespan: f64) -> Vec<Capacity> {
    let inventory = &sim.world().state.inventory;
    let table = &inventory.resources;
    let mut out = Vec::new();
    for (name, history) in sim.usage_histories() {
        let Some(cluster) = inventory.cluster(name) else {
            continue;
        };
        let until = makespan.max(history.at.last().copied().unwrap_or(0.0));
        for r in requested {
            let Some(id) = table.id(r) else { continue };
            let allocatable = cluster.summary.allocatable.get(id).copied().unwrap_or(0);
            if allocatable <= 0 {
                continue;
            }
            let amounts: Vec<f64> = history
                .used
                .chunks(history.width.max(1))
                .map(|row| row.get(id).copied().unwrap_or(0) as f64)
                .collect();
            out.push(Capacity {
                cluster: name.to_string(),
                resource: r.clone(),
                allocatable,
                steps: chart::downsample(&history.at, &amounts, until, chart::MAX_POINTS),
                until,
            });
        }
    }
    out
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
    }

    /// The jobs as a table, then the summary.
    pub fn to_text(&self) -> String {
        let mut out = self.jobs_text();
        self.summary_text(&mut out);
        out
    }

    /// The strategy, the jobs as a table and why those that did not succeed did not.
    fn jobs_text(&self) -> String {
        // A KIND column only when there is a JobSet to tell apart.
        let kinds = self.jobs.iter().any(|j| j.kind.is_some());
        let mut header = vec![
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
        if kinds {
            header.insert(1, "KIND");
        }
        let rows: Vec<Vec<String>> = self
            .jobs
            .iter()
            .map(|j| {
                let mut row = vec![
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
                ];
                if kinds {
                    row.insert(1, j.kind.clone().unwrap_or_else(|| "Job".into()));
                }
                row
            })
            .collect();
        let mut out = format!("strategy: {}\n\n", self.strategy);
        write_table(&mut out, &header, &rows);
        let reasons: Vec<&JobReport> = self.jobs.iter().filter(|j| j.reason.is_some()).collect();
        if !reasons.is_empty() {
            out.push_str("\nwhy:\n");
            for j in reasons {
                let _ = writeln!(
                    out,
                    "  {}: {}",
                    j.title(),
                    j.reason.as_deref().unwrap_or("")
                );
            }
        }
        out
    }

    /// Jobs given up after their requeuing limit. The JSON summary has no count of its own
    /// for them (the format's), so the text names them, or the counts would not add up to
    /// the jobs.
    fn deactivated(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| j.result == "Deactivated")
            .count()
    }

    fn summary_text(&self, out: &mut String) {
        let s = &self.summary;
        let deactivated = self.deactivated();
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
        let _ = writeln!(out, "start wait: {}", s.start_wait.text());
        let _ = writeln!(out, "completion time: {}", s.completion_time.text());
        let _ = writeln!(out, "goodput: {}", goodput_text(&s.goodput));
        let by_cluster: Vec<String> = s
            .topology_affinity_errors_by_cluster
            .iter()
            .map(|(c, n)| format!("{c} {n}"))
            .collect();
        let _ = writeln!(
            out,
            "TopologyAffinityErrors by cluster: {}",
            by_cluster.join(", ")
        );
        for (what, groups) in [("queue", &s.by_queue), ("kind", &s.by_kind)] {
            for (name, b) in groups {
                let _ = writeln!(
                    out,
                    "{what} {name}: {} jobs, {} succeeded, {} failed, {} pending; start wait: {}; goodput: {}",
                    b.jobs,
                    b.succeeded,
                    b.failed,
                    b.pending,
                    b.start_wait.text(),
                    goodput_text(&b.goodput)
                );
            }
        }
    }
}

impl JobReport {
    /// `namespace/name` for a Job, `JobSet namespace/name` for a JobSet, as the dispatcher's
    /// messages name them.
    pub fn title(&self) -> String {
        match &self.kind {
            None => format!("{}/{}", self.namespace, self.name),
            Some(kind) => format!("{kind} {}/{}", self.namespace, self.name),
        }
    }
}

/// A time or figure as the text shows it: `-` for none.
fn show(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

fn goodput_text(goodput: &BTreeMap<String, Value>) -> String {
    if goodput.is_empty() {
        return "-".into();
    }
    let parts: Vec<String> = goodput
        .iter()
        .map(|(r, v)| format!("{r} {v} {}", hours_unit(r)))
        .collect();
    parts.join(", ")
}

/// Rows under a header, each column as wide as its widest cell, two spaces apart.
fn write_table<S: AsRef<str>>(out: &mut String, header: &[&str], rows: &[Vec<S>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.as_ref().len());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(AsRef::as_ref).collect());
    }
}

/// Several strategies' reports on one scenario, as one JSON array in the order given.
pub fn compare_json(reports: &[Report]) -> String {
    serde_json::to_string_pretty(reports)
        .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
}

/// Several strategies' reports on one scenario: their summaries side by side in one table
/// (a row per figure, named by its path in the JSON summary, a column per strategy), then
/// each strategy's jobs.
pub fn compare_text(reports: &[Report]) -> String {
    let columns: Vec<Vec<(String, String)>> = reports.iter().map(figures).collect();
    // Every figure of any strategy, in the order of the first that has it.
    let mut labels: Vec<&str> = Vec::new();
    let mut seen = BTreeSet::new();
    for (label, _) in columns.iter().flatten() {
        if seen.insert(label.as_str()) {
            labels.push(label);
        }
    }
    let rows: Vec<Vec<String>> = labels
        .iter()
        .map(|label| {
            let mut row = vec![label.to_string()];
            for column in &columns {
                let cell = column.iter().find(|(l, _)| l == label);
                row.push(cell.map_or_else(|| "-".into(), |(_, v)| v.clone()));
            }
            row
        })
        .collect();
    let mut header = vec!["FIGURE"];
    header.extend(reports.iter().map(|r| r.strategy.as_str()));
    let mut out = String::new();
    write_table(&mut out, &header, &rows);
    for r in reports {
        out.push('\n');
        out.push_str(&r.jobs_text());
    }
    out
}

/// A report's summary as (figure, value) rows: every figure of the JSON summary, in its
/// order, named by its path there (keys joined by spaces: resource names have dots), and the
/// deactivated Jobs after the pending ones.
fn figures(report: &Report) -> Vec<(String, String)> {
    let s = &report.summary;
    let mut out: Vec<(String, String)> = Vec::new();
    let mut add = |label: String, value: String| out.push((label, value));
    for (label, n) in [
        ("jobs", s.jobs),
        ("succeeded", s.succeeded),
        ("failed", s.failed),
        ("pending", s.pending),
        ("deactivated", report.deactivated()),
    ] {
        add(label.into(), n.to_string());
    }
    add("makespan".into(), show(&s.makespan));
    add("meanWait".into(), show(&s.mean_wait));
    for (c, u) in &s.utilization {
        add(format!("utilization {c}"), show(u));
    }
    add(
        "topologyAffinityErrors".into(),
        s.topology_affinity_errors.to_string(),
    );
    add("remoteWritesPerJob".into(), show(&s.remote_writes_per_job));
    for (q, per) in &s.max_quota_usage {
        for (r, v) in per {
            add(format!("maxQuotaUsage {q} {r}"), show(v));
        }
    }
    let spread = |prefix: &str, sp: &Spread| {
        [
            ("mean", &sp.mean),
            ("p50", &sp.p50),
            ("p95", &sp.p95),
            ("max", &sp.max),
        ]
        .map(|(k, v)| (format!("{prefix} {k}"), show(v)))
    };
    out.extend(spread("startWait", &s.start_wait));
    out.extend(spread("completionTime", &s.completion_time));
    for (r, v) in &s.goodput {
        out.push((format!("goodput {r}"), show(v)));
    }
    for (c, n) in &s.topology_affinity_errors_by_cluster {
        out.push((
            format!("topologyAffinityErrorsByCluster {c}"),
            n.to_string(),
        ));
    }
    for (group, breakdowns) in [("byQueue", &s.by_queue), ("byKind", &s.by_kind)] {
        for (name, b) in breakdowns {
            let at = format!("{group} {name}");
            for (k, n) in [
                ("jobs", b.jobs),
                ("succeeded", b.succeeded),
                ("failed", b.failed),
                ("pending", b.pending),
            ] {
                out.push((format!("{at} {k}"), n.to_string()));
            }
            out.extend(spread(&format!("{at} startWait"), &b.start_wait));
            for (r, v) in &b.goodput {
                out.push((format!("{at} goodput {r}"), show(v)));
            }
        }
    }
    out
}
