//! One worker's connection, in its own task: take the latest kubeconfig, check it, build a
//! rate-limited client, probe it with a timeout, then run the inventory watches and keep
//! probing. A probe shows the worker reachable (the connection state); whether its inventory
//! is fresh is the watches' business (see [`hub`](super::hub)). Every failure backs off (5 s doubling to 5 min) unless the kubeconfig changes,
//! which is tried at once. A worker that hangs or is slow only ever delays its own task.

use super::connection::{Backoff, ConnectionState, Health, Reason};
use super::hub::Update;
use super::kubeconfig::{client_for, probe, ClientOptions, KubeconfigError};
use super::ratelimit::RateLimiter;
use super::source::Reading;
use super::watch::{watches, WatchHealth, WatchTimings};
use crate::metrics::WorkerMetrics;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};

/// Timings and limits of every worker's connection.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    pub backoff: Backoff,
    /// How often a connected worker is probed (`GET /version`).
    pub probe_every: Duration,
    pub probe_timeout: Duration,
    /// The first node and pod lists must complete within this after connecting.
    pub establish_timeout: Duration,
    /// Timings of the inventory's lists and watches.
    pub watch: WatchTimings,
    /// The client rate limit: requests per second, and the burst above it.
    pub qps: f64,
    pub burst: u32,
}

impl Default for LinkOptions {
    fn default() -> Self {
        Self {
            backoff: Backoff::default(),
            probe_every: Duration::from_secs(10),
            probe_timeout: Duration::from_secs(10),
            establish_timeout: Duration::from_secs(60),
            watch: WatchTimings::default(),
            qps: 100.0,
            burst: 200,
        }
    }
}

/// What a connection tells the controller, after every change.
#[derive(Clone)]
pub(crate) struct LinkReport {
    pub(crate) name: String,
    pub(crate) epoch: u64,
    pub(crate) client: Option<kube::Client>,
    pub(crate) client_generation: u64,
    pub(crate) health: Health,
}

/// Everything one connection needs.
pub(crate) struct Link {
    pub(crate) name: String,
    /// Tags every report, so the controller can ignore a replaced link's last words.
    pub(crate) epoch: u64,
    pub(crate) kubeconfig: watch::Receiver<Option<Reading>>,
    pub(crate) hub: mpsc::Sender<Update>,
    pub(crate) reports: mpsc::UnboundedSender<LinkReport>,
    pub(crate) options: LinkOptions,
    pub(crate) metrics: Option<WorkerMetrics>,
    /// Where the previous connection of this worker left off (a new kubeconfig location
    /// starts a new task, but "disconnected since" must survive it).
    pub(crate) health: Health,
}

/// Why a connected session ended.
enum SessionEnd {
    KubeconfigChanged,
    Failed(String),
    /// The hub or the kubeconfig source is gone: the worker is being removed.
    Gone,
}

impl Link {
    /// Runs until the worker is removed (the controller aborts the task, or the hub and the
    /// kubeconfig source go away).
    pub(crate) async fn run(mut self) {
        let mut state = ConnectionState {
            health: self.health.clone(),
            backoff: self.options.backoff,
        };
        // One bucket per worker, across kubeconfig rotations.
        let client_options = ClientOptions {
            limiter: Some(Arc::new(RateLimiter::new(
                self.options.qps,
                self.options.burst,
            ))),
            latency: self.metrics.as_ref().map(|m| m.request_duration.clone()),
        };
        let mut current: Option<(String, kube::Client)> = None;
        let mut generation = 0u64;
        loop {
            let Some(reading) = self.next_reading().await else {
                return;
            };
            let failure = match reading {
                Err(message) => (Reason::BadKubeConfig, message),
                Ok(text) => {
                    let built = match &current {
                        Some((t, c)) if *t == text => Ok(c.clone()),
                        _ => client_for(&text, &client_options).await.inspect(|c| {
                            generation += 1;
                            current = Some((text.clone(), c.clone()));
                        }),
                    };
                    match built {
                        Err(KubeconfigError::Bad(m)) => (Reason::BadKubeConfig, m),
                        Err(KubeconfigError::Insecure(m)) => (Reason::InsecureKubeConfig, m),
                        Ok(client) => {
                            self.report(&current, generation, &state);
                            match probe(&client, self.options.probe_timeout).await {
                                Err(e) => {
                                    (Reason::ClientConnectionFailed, format!("GET /version: {e}"))
                                }
                                Ok(version) => {
                                    tracing::info!(cluster = %self.name, %version, generation, "worker connected");
                                    state.connected(SystemTime::now());
                                    self.report(&current, generation, &state);
                                    match self.session(client).await {
                                        SessionEnd::Gone => return,
                                        SessionEnd::KubeconfigChanged => continue,
                                        SessionEnd::Failed(m) => {
                                            (Reason::ClientConnectionFailed, m)
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            };
            let (reason, message) = failure;
            let delay = state.failed(SystemTime::now(), reason, message.clone());
            tracing::warn!(cluster = %self.name, reason = reason.as_str(), error = %message, retry_in = ?delay, "worker not connected");
            self.report(&current, generation, &state);
            // A new kubeconfig is tried at once: whoever fixed it should not wait minutes.
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                changed = self.kubeconfig.changed() => if changed.is_err() { return },
            }
        }
    }

    /// The latest kubeconfig reading, waiting for the first one.
    async fn next_reading(&mut self) -> Option<Reading> {
        loop {
            if let Some(r) = self.kubeconfig.borrow_and_update().clone() {
                return Some(r);
            }
            self.kubeconfig.changed().await.ok()?;
        }
    }

    fn report(
        &self,
        current: &Option<(String, kube::Client)>,
        generation: u64,
        state: &ConnectionState,
    ) {
        let _ = self.reports.send(LinkReport {
            name: self.name.clone(),
            epoch: self.epoch,
            client: current.as_ref().map(|(_, c)| c.clone()),
            client_generation: generation,
            health: state.health.clone(),
        });
    }

    /// Watches into the hub and probes until the worker stops answering, the watches are
    /// not established in time, or the kubeconfig changes.
    async fn session(&mut self, client: kube::Client) -> SessionEnd {
        let health = Arc::new(WatchHealth::default());
        let watches = watches(
            self.name.clone(),
            client.clone(),
            self.hub.clone(),
            health.clone(),
            self.metrics.as_ref().map(|m| m.watch_restarts.clone()),
            self.options.watch.clone(),
        );
        let mut watches = std::pin::pin!(watches);
        let establish_by = tokio::time::Instant::now() + self.options.establish_timeout;
        let establish = tokio::time::sleep_until(establish_by);
        let mut establish = std::pin::pin!(establish);
        let mut established = false;
        let mut ticker = tokio::time::interval(self.options.probe_every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = &mut watches => return SessionEnd::Gone,
                changed = self.kubeconfig.changed() => {
                    return match changed {
                        Ok(()) => SessionEnd::KubeconfigChanged,
                        Err(_) => SessionEnd::Gone,
                    };
                }
                _ = &mut establish, if !established => {
                    if !health.listed() {
                        let why = health.why_not_listed();
                        return SessionEnd::Failed(format!(
                            "the node and pod lists did not complete within {}s: {why}",
                            self.options.establish_timeout.as_secs()
                        ));
                    }
                    established = true;
                }
                _ = ticker.tick() => {
                    // Reachability only: a worker that answers here but whose watches say
                    // nothing goes stale in the hub, with the reason in its status.
                    if let Err(e) = probe(&client, self.options.probe_timeout).await {
                        return SessionEnd::Failed(format!("GET /version: {e}"));
                    }
                }
            }
        }
    }
}
