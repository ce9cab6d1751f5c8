//! Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics: the
//! holder renews `renewTime` every retry period; a candidate takes the Lease over once
//! `renewTime + leaseDurationSeconds` has passed (or the holder released it), bumping
//! `leaseTransitions`; every write carries the resourceVersion it was decided on, so of two
//! candidates racing for one Lease the API server lets exactly one win (the other gets 409).
//!
//! The decision is [`step`], pure; [`run`] is the loop around it, publishing whether this
//! replica leads, stepping down when it cannot renew within the renew deadline, and giving
//! the Lease up on shutdown so a successor takes over at once.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{watch, Notify};

#[derive(Debug, thiserror::Error)]
pub(crate) enum LeaderError {
    #[error("leader-election Lease {namespace}/{name}: {source}; check that Switchyard may get, create and update Leases in {namespace}")]
    Api {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("leader-election Lease {namespace}/{name}: no answer within {limit:?}")]
    Timeout {
        namespace: String,
        name: String,
        limit: Duration,
    },
}

/// Leader-election settings (`leaderElection` in the configuration file).
#[derive(Debug, Clone, PartialEq)]
pub struct ElectionConfig {
    pub namespace: String,
    pub lease_name: String,
    /// This replica's identity in `holderIdentity`.
    pub identity: String,
    /// How long a Lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// A leader that could not renew for this long steps down (before others may take over).
    pub renew_deadline: Duration,
    /// How often the Lease is tried.
    pub retry_period: Duration,
}

impl ElectionConfig {
    pub fn new(namespace: &str, lease_name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            lease_name: lease_name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What to do with the Lease.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// There is none: create it, held by us.
    Create(LeaseSpec),
    /// It expired or was released: take it over.
    Acquire(LeaseSpec),
    /// We hold it: renew it.
    Renew(LeaseSpec),
    /// Someone else holds a valid Lease until `expires`.
    Follow { holder: String, expires: SystemTime },
}

impl Step {}

/// A MicroTime at `t` (microsecond precision, as the API server requires).
pub fn micro_time(t: SystemTime) -> MicroTime {
    let micros = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    MicroTime(k8s_openapi::jiff::Timestamp::from_microsecond(micros).unwrap_or_default())
}

/// Whole seconds, rounded up: a lease is never written shorter than configured.
fn seconds(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

/// When a Lease stops being valid: its last renewal (or acquisition) plus its duration.
/// Without either time it is taken as expired. Candidates compare against their own clock,
/// as client-go's do against the renewal they observed; replicas keep their clocks in sync
/// (NTP) and the renew deadline leaves the leader margin to step down first.
pub(crate) fn expiry(lease: &LeaseSpec) -> Option<SystemTime> {
    let renewed = lease
        .renew_time
        .as_ref()
        .or(lease.acquire_time.as_ref())
        .map(|t| SystemTime::from(t.0))?;
    let duration = Duration::from_secs(lease.lease_duration_seconds.unwrap_or(0).max(0) as u64);
    Some(renewed + duration)
}

/// Decides what `me` does with `lease` at `now`, holding it for `lease_duration` when it
/// writes.
pub(crate) fn step(
    lease: Option<&LeaseSpec>,
    me: &str,
    now: SystemTime,
    lease_duration: Duration,
) -> Step {
    let held_by_me = |acquired: Option<MicroTime>, transitions: i32| LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(seconds(lease_duration)),
        acquire_time: Some(acquired.unwrap_or_else(|| micro_time(now))),
        renew_time: Some(micro_time(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    };
    let Some(lease) = lease else {
        return Step::Create(held_by_me(None, 0));
    };
    let holder = lease.holder_identity.as_deref().unwrap_or("");
    let transitions = lease.lease_transitions.unwrap_or(0);
    if holder == me {
        return Step::Renew(held_by_me(lease.acquire_time.clone(), transitions));
    }
    match expiry(lease) {
        Some(expires) if !holder.is_empty() && expires > now => Step::Follow {
            holder: holder.to_string(),
            expires,
        },
        _ => Step::Acquire(held_by_me(None, transitions.saturating_add(1))),
    }
}

/// This replica's identity: the pod's name (or the host's), and a random suffix so two
/// processes on one host never share one.
pub(crate) fn identity(pod_name: Option<&str>, hostname: Option<&str>, random: u64) -> String {
    let base = pod_name
        .filter(|s| !s.is_empty())
        .or(hostname.filter(|s| !s.is_empty()))
        .unwrap_or("switchyard");
    format!("{base}_{random:016x}")
}

/// [`identity`] from the environment: `POD_NAME`, else the hostname.
pub(crate) fn identity_from_env() -> String {
    use std::hash::{BuildHasher, Hasher};
    let pod = std::env::var("POD_NAME").ok();
    let host = std::env::var("HOSTNAME").ok().or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
    });
    // The standard library seeds every RandomState from the OS: enough randomness for a
    // suffix that only has to differ between processes.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    identity(pod.as_deref(), host.as_deref(), hasher.finish())
}

/// The Lease's I/O: one attempt is a GET and, unless someone else leads, one write.
struct Elector {
    api: Api<Lease>,
    config: ElectionConfig,
    /// The Lease as we last wrote it, for a release without another GET.
    held: Option<Lease>,
}

/// The outcome of one attempt.
#[derive(Debug, PartialEq)]
enum Attempt {
    Leading,
    /// Someone else leads, or won the race for the Lease (409).
    Following(String),
}

impl Elector {
    fn err(&self, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            namespace: self.config.namespace.clone(),
            name: self.config.lease_name.clone(),
            source,
        }
    }

    async fn attempt(&mut self) -> Result<Attempt, LeaderError> {
        let name = self.config.lease_name.clone();
        let current = self.api.get_opt(&name).await.map_err(|e| self.err(e))?;
        let decision = step(
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &self.config.identity,
            SystemTime::now(),
            self.config.lease_duration,
        );
        let result = match (&decision, current) {
            (Step::Follow { holder, .. }, _) => {
                self.held = None;
                return Ok(Attempt::Following(holder.clone()));
            }
            (Step::Create(spec), _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec.clone()),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (Step::Acquire(spec) | Step::Renew(spec), Some(mut lease)) => {
                // The resourceVersion read above rides along: a write that raced another
                // candidate's fails with 409 instead of overwriting it.
                lease.spec = Some(spec.clone());
                self.api
                    .replace(&name, &PostParams::default(), &lease)
                    .await
            }
            (Step::Acquire(_) | Step::Renew(_), None) => unreachable_lease(),
        };
        match result {
            Ok(lease) => {
                if matches!(decision, Step::Acquire(_) | Step::Create(_)) {
                    tracing::info!(lease = %name, identity = %self.config.identity, "became the leader");
                }
                self.held = Some(lease);
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                self.held = None;
                Ok(Attempt::Following(format!(
                    "another candidate ({})",
                    e.reason
                )))
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// Gives the Lease up: holder cleared, valid for one second, so any candidate (ours or
    /// client-go's) takes it over at its next try.
    ///
    /// A renewal cut short by the stop may still have reached the API server after the Lease
    /// held was read: the release then conflicts (409). The Lease is read again and, if it
    /// still names this replica, given up from what was read.
    async fn release(&mut self) {
        let Some(mut lease) = self.held.take() else {
            return;
        };
        let name = self.config.lease_name.clone();
        for _ in 0..2 {
            let now = micro_time(SystemTime::now());
            let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions);
            lease.spec = Some(LeaseSpec {
                holder_identity: None,
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: transitions,
                ..Default::default()
            });
            let e = match self
                .api
                .replace(&name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => return tracing::info!(lease = %name, "leadership released"),
                Err(e) => e,
            };
            if !matches!(&e, kube::Error::Api(a) if a.code == 409) {
                return tracing::warn!(lease = %name, error = %e, "cannot release leadership; it expires on its own");
            }
            let ours = |l: &Lease| {
                l.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                    == Some(self.config.identity.as_str())
            };
            match self.api.get_opt(&name).await {
                Ok(Some(again)) if ours(&again) => lease = again,
                Ok(_) => return tracing::info!(lease = %name, "leadership already taken over"),
                Err(e) => {
                    return tracing::warn!(lease = %name, error = %e, "cannot release leadership; it expires on its own")
                }
            }
        }
        tracing::warn!(lease = %name, "cannot release leadership: it keeps changing; it expires on its own");
    }
}

/// A `Step::Acquire`/`Renew` always comes from an existing Lease; this keeps the match total
/// without a panic.
fn unreachable_lease() -> Result<Lease, kube::Error> {
    Err(kube::Error::Service("internal: no Lease to update".into()))
}

/// The writes a leader has sent and not seen answered yet: each holds a [`WriteGuard`] until
/// it is answered or given up.
///
/// A leader that stops (SIGTERM) gives its Lease up so that a successor leads at once. A claim
/// it sent just before could still land after the successor's first list of the Jobs, and the
/// successor would admit into quota that claim had taken: the Lease does not fence writes to
/// other objects. So the Lease is given up only once these writes are answered; writes still
/// unanswered after the renew deadline leave the Lease to expire on its own, and the successor
/// waits out `leaseDuration` first.
#[derive(Clone, Default)]
pub struct WritesInFlight(Arc<Writes>);

#[derive(Default)]
struct Writes {
    count: AtomicUsize,
    none: Notify,
}

/// One write in flight; dropping it says the write is answered or given up.
pub struct WriteGuard(Arc<Writes>);

impl WritesInFlight {
    pub fn begin(&self) -> WriteGuard {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        WriteGuard(self.0.clone())
    }

    /// How many writes are in flight now.
    pub fn count(&self) -> usize {
        self.0.count.load(Ordering::SeqCst)
    }

    /// Returns once no write is in flight.
    pub async fn drained(&self) {
        loop {
            let none = self.0.none.notified();
            tokio::pin!(none);
            // Registered before the count is read: a last write answered in between wakes it.
            none.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            none.await;
        }
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.none.notify_waiters();
        }
    }
}

/// Runs the election until `stop` turns true (then releases the Lease if held, once `writes`
/// are answered), publishing whether this replica leads on `leading`.
pub async fn run(
    client: kube::Client,
    config: ElectionConfig,
    leading: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
    writes: WritesInFlight,
) {
    let mut elector = Elector {
        api: Api::namespaced(client, &config.namespace),
        config: config.clone(),
        held: None,
    };
    let mut last_renewal: Option<Instant> = None;
    let mut jitter = Jitter::new(&config.identity);
    loop {
        if *stop.borrow() {
            break;
        }
        let limit = config.renew_deadline;
        // A stop never waits for an attempt stuck on a slow API server.
        let attempt = tokio::select! {
            r = tokio::time::timeout(limit, elector.attempt()) => r,
            _ = stop.changed() => break,
        };
        let outcome = match attempt {
            Ok(r) => r,
            Err(_) => Err(LeaderError::Timeout {
                namespace: config.namespace.clone(),
                name: config.lease_name.clone(),
                limit,
            }),
        };
        let was = *leading.borrow();
        let now = match outcome {
            Ok(Attempt::Leading) => {
                last_renewal = Some(Instant::now());
                true
            }
            Ok(Attempt::Following(holder)) => {
                if was {
                    tracing::warn!(%holder, "lost the leadership");
                } else {
                    tracing::debug!(%holder, "following");
                }
                false
            }
            Err(e) => {
                // A leader keeps leading through errors until the renew deadline, which ends
                // before the Lease expires for everyone else.
                let within = last_renewal.is_some_and(|t| t.elapsed() < config.renew_deadline);
                if was && !within {
                    tracing::warn!(error = %e, "could not renew the leadership in time; stepping down");
                } else {
                    tracing::warn!(error = %e, "leader election attempt failed");
                }
                was && within
            }
        };
        if !now {
            last_renewal = None;
        }
        leading.send_if_modified(|v| std::mem::replace(v, now) != now);
        // Candidates spread their tries (client-go's jitter factor 1.2); the leader renews
        // on time.
        let wait = if now {
            config.retry_period
        } else {
            config.retry_period + config.retry_period.mul_f64(0.2 * jitter.next())
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            changed = stop.changed() => if changed.is_err() { break },
        }
    }
    if *leading.borrow() {
        leading.send_replace(false);
        let in_flight = writes.count();
        if tokio::time::timeout(config.renew_deadline, writes.drained())
            .await
            .is_err()
        {
            tracing::warn!(
                writes = writes.count(),
                "writes still in flight after the renew deadline: the Lease is left to expire, so that no successor admits before they land"
            );
            return;
        }
        if in_flight > 0 {
            tracing::info!(
                writes = in_flight,
                "writes in flight answered before giving the Lease up"
            );
        }
        let _ = tokio::time::timeout(config.renew_deadline, elector.release()).await;
    }
}

/// A small deterministic sequence in [0, 1) seeded per identity.
struct Jitter(u64);

impl Jitter {
    fn new(seed: &str) -> Self {
        let s = seed.bytes().fold(0x9E37_79B9_7F4A_7C15u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
        });
        Jitter(s | 1)
    }
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A receiver that always says "leading": for a single replica with leader election off.
pub(crate) fn always() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(true);
    drop(tx);
    rx
}

#[cfg(test)]
mod tests;
