//! The HTTPS server every surface shares, and the plain-HTTP probe server.
//!
//! Handlers are thin: read the body within limits, call the pure admission code, answer.

use crate::cli::Role;
use crate::config::{ServeSettings, TlsSource};
use crate::inventory::InventoryStore;
use crate::metrics::Metrics;
use crate::namespaces::NamespaceLabels;
use crate::text::Clipped;
use crate::tls::{self, CertificateStore};
use crate::webhook::{self, AdmissionPolicy, BadReview, Decision, Denial, Hook, Kind};
use crate::wellknown::{
    HEALTHZ_PATH, METRICS_PATH, MUTATE_JOBSET_PATH, MUTATE_JOB_PATH, READYZ_PATH,
    VALIDATE_JOBSET_PATH, VALIDATE_JOB_PATH,
};
use actix_web::dev::{ServerHandle, Service};
use actix_web::http::{header, StatusCode};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use futures::StreamExt;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The name the cluster `serve` runs in has in its own live inventory.
pub(crate) const LOCAL_CLUSTER: &str = "local";

/// The admission surface's state.
pub(crate) struct Webhooks {
    pub(crate) policy: AdmissionPolicy,
    pub(crate) namespaces: NamespaceLabels,
    pub(crate) max_body: usize,
    pub(crate) body_timeout: Duration,
}

/// What `/readyz` reports.
pub(crate) struct Readiness {
    shutting_down: AtomicBool,
    /// One line per surface that is off, and why.
    notes: Vec<String>,
    /// Whether this replica leads, when it runs leader election.
    leader: Option<(String, tokio::sync::watch::Receiver<bool>)>,
}

/// What a manager replica runs beside its HTTPS surfaces, built once by [`start`]: the hook
/// the dispatcher starts from. Everything here is cheap to clone and live: the workers'
/// views change as WorkerClusters and their connections do, `leader` as the Lease does.
#[derive(Clone)]
pub struct Manager {
    /// The manager cluster's client.
    pub client: kube::Client,
    /// Switchyard's namespace.
    pub namespace: String,
    /// Every WorkerCluster's view (rate-limited client, connection state, labels).
    pub workers: crate::workers::Workers,
    /// Whether this replica leads: only the leader may write (statuses, virtual nodes,
    /// dispatch decisions).
    pub leader: tokio::sync::watch::Receiver<bool>,
}

pub(crate) struct State {
    webhooks: Webhooks,
    pub(crate) extender: Arc<crate::extender::Extender>,
    metrics: Arc<Metrics>,
}

/// The route and result labels a handler leaves for the metrics middleware.
#[derive(Clone, Copy)]
pub struct Outcome {
    pub(crate) path: &'static str,
    pub result: &'static str,
}

/// A started server. Dropping it does not stop it; call [`Running::shutdown`].
pub struct Running {
    pub https_addr: SocketAddr,
    pub probe_addr: SocketAddr,
    pub metrics: Arc<Metrics>,
    https: ServerHandle,
    probe: ServerHandle,
    servers: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    readiness: Arc<Readiness>,
    stop_background: tokio::sync::watch::Sender<bool>,
    /// Present with `role: manager` (and a cluster).
    pub manager: Option<Manager>,
    /// Awaited on shutdown: it gives the leader Lease up.
    election: Option<(tokio::task::JoinHandle<()>, Duration)>,
    /// Aborted on shutdown.
    background: Vec<tokio::task::JoinHandle<()>>,
}

fn bind(addr: SocketAddr) -> crate::Result<TcpListener> {
    let listener = TcpListener::bind(addr).map_err(|error| crate::Error::Listen { addr, error })?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The kernel's send and receive buffers of each HTTPS connection (Linux doubles the value
/// asked for, so 256 KiB each). Left to autotuning the send buffer grows to `tcp_wmem`'s 4 MiB,
/// and a client that sends reviews without reading the replies had the server answer about
/// 10,000 of them (4 MiB of replies held in the kernel until the client goes) before its writes
/// stopped; with this bound about 2,000, and 256 KiB of replies. The extender's largest
/// replies (about 350 KB for 5,000 nodes) then go out in a few writes, and 256 KiB at a 1 ms
/// round trip still carries 250 MB/s, far above what a review or an extender call needs.
const CONNECTION_BUFFER_BYTES: u32 = 128 * 1024;

/// actix-web's own backlog.
const HTTPS_BACKLOG: u32 = 1024;

/// The HTTPS listener, its connections' buffers bounded ([`CONNECTION_BUFFER_BYTES`]; accepted
/// sockets inherit them from the listener). Needs a tokio runtime.
fn bind_https(addr: SocketAddr) -> crate::Result<TcpListener> {
    let listen = || -> std::io::Result<TcpListener> {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.set_send_buffer_size(CONNECTION_BUFFER_BYTES)?;
        socket.set_recv_buffer_size(CONNECTION_BUFFER_BYTES)?;
        socket.bind(addr)?;
        socket.listen(HTTPS_BACKLOG)?.into_std()
    };
    listen().map_err(|error| crate::Error::Listen { addr, error })
}

/// Binds both listeners and starts serving; returns once both accept connections. Without
/// `--standalone` the Kubernetes client comes from the environment (KUBECONFIG or in-cluster).
pub async fn start(settings: ServeSettings) -> crate::Result<Running> {
    let client = if settings.standalone {
        None
    } else {
        Some(
            kube::Client::try_default()
                .await
                .map_err(|e| crate::Error::KubeClient(e.to_string()))?,
        )
    };
    start_with_client(settings, client).await
}

/// [`start`] with a given Kubernetes client (`None`: standalone).
pub async fn start_with_client(
    settings: ServeSettings,
    client: Option<kube::Client>,
) -> crate::Result<Running> {
    let (cert_path, key_path) = match &settings.tls {
        TlsSource::Files { cert, key } => (cert.clone(), key.clone()),
        TlsSource::Dev(dir) => crate::certs::ensure_dev(dir)?,
    };
    let certificates = CertificateStore::load(&cert_path, &key_path)?;
    let tls_config = tls::server_config(certificates.clone(), settings.client_ca.as_deref())?;
    let metrics = Arc::new(Metrics::new());
    let standalone = client.is_none();
    let (stop_background, stop_rx) = tokio::sync::watch::channel(false);

    let mut notes = Vec::new();
    let namespaces = namespace_labels(client.as_ref(), &settings, &mut notes);
    let store = Arc::new(InventoryStore::default());
    let mut started = start_inventory(
        &settings,
        client.as_ref(),
        store.clone(),
        metrics.clone(),
        stop_rx.clone(),
    )?;
    notes.append(&mut started.notes);
    let readiness = Arc::new(Readiness {
        shutting_down: AtomicBool::new(false),
        notes,
        leader: started.leader_line,
    });
    let extender = Arc::new(crate::extender::Extender::new(
        store,
        settings.extender.clone(),
        client,
    ));
    let state = web::Data::new(State {
        webhooks: Webhooks {
            policy: settings.policy.clone(),
            namespaces,
            max_body: settings.max_review_bytes,
            body_timeout: settings.body_timeout,
        },
        metrics: metrics.clone(),
        extender: extender.clone(),
    });

    let https_listener = bind_https(settings.listen)?;
    let https_addr = https_listener.local_addr()?;
    let https = https_server(&settings, state, https_listener, tls_config)?;
    let https_handle = https.handle();
    let probe_listener = bind(settings.probe_listen)?;
    let probe_addr = probe_listener.local_addr()?;
    let probe = probe_server(
        &settings,
        readiness.clone(),
        metrics.clone(),
        probe_listener,
    )?;
    let probe_handle = probe.handle();

    tokio::spawn(extender.clone().housekeep(stop_rx.clone()));
    tokio::spawn(certificates.clone().watch(
        settings.tls_reload_interval,
        metrics.clone(),
        stop_rx,
    ));
    let servers = vec![tokio::spawn(https), tokio::spawn(probe)];
    tracing::info!(%https_addr, %probe_addr, standalone, "serving");
    Ok(Running {
        https_addr,
        probe_addr,
        metrics,
        https: https_handle,
        probe: probe_handle,
        servers,
        readiness,
        stop_background,
        manager: started.manager,
        election: started.election,
        background: started.background,
    })
}

/// Where the webhooks read namespace labels (for `managedNamespaces`) from: the API server,
/// or, standalone, only the label every namespace has.
fn namespace_labels(
    client: Option<&kube::Client>,
    settings: &ServeSettings,
    notes: &mut Vec<String>,
) -> NamespaceLabels {
    if settings.policy.default_queue.is_some() && settings.policy.managed_namespaces.is_none() {
        tracing::warn!("defaultQueue is set but managedNamespaces is not: no namespace gets the default queue (use managedNamespaces: {{}} for all)");
    }
    match client {
        None => {
            notes.push("kubernetes-api: off (--standalone): namespace labels for defaultQueue are reduced to kubernetes.io/metadata.name".to_string());
            tracing::warn!("standalone: no Kubernetes API server is contacted; managedNamespaces matches on kubernetes.io/metadata.name only");
            NamespaceLabels::Standalone
        }
        Some(client) => NamespaceLabels::live(client.clone(), settings.namespace_cache_ttl),
    }
}

/// What runs beside the HTTPS surfaces, by [`start_inventory`].
#[derive(Default)]
struct Started {
    /// Present with `role: manager` and a cluster.
    manager: Option<Manager>,
    /// One `/readyz` line per surface started or left off.
    notes: Vec<String>,
    /// The leader election's task and how long it may take to give the Lease up.
    election: Option<(tokio::task::JoinHandle<()>, Duration)>,
    /// Aborted on shutdown.
    background: Vec<tokio::task::JoinHandle<()>>,
    /// `/readyz`'s leader line, and whether this replica leads.
    leader_line: Option<(String, tokio::sync::watch::Receiver<bool>)>,
}

/// Fills the extender's inventory, from the first source there is: a file; else, live, every
/// WorkerCluster (manager, which starts the dispatcher too) or the cluster this server runs in
/// (worker); else none.
fn start_inventory(
    settings: &ServeSettings,
    client: Option<&kube::Client>,
    store: Arc<InventoryStore>,
    metrics: Arc<Metrics>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> crate::Result<Started> {
    match (&settings.inventory, client, settings.role) {
        (Some(path), _, _) => {
            let loaded = crate::inventory::load_file(path)?;
            for warning in &loaded.warnings {
                tracing::warn!(inventory = %path.display(), "{warning}");
            }
            let inv = loaded.inventory;
            tracing::info!(inventory = %path.display(), clusters = inv.clusters.len(), "inventory loaded");
            store.replace(inv);
            Ok(Started::default())
        }
        (None, Some(client), Role::Manager) => Ok(start_manager(
            client.clone(),
            settings,
            store,
            metrics,
            stop,
        )),
        (None, Some(client), Role::Worker) => Ok(watch_local_cluster(
            client.clone(),
            settings,
            store,
            &metrics,
        )),
        (None, None, role) => {
            let mut notes = Vec::new();
            if role == Role::Manager {
                notes.push("manager: off (--standalone): no WorkerCluster controller, leader election or virtual nodes".to_string());
            }
            notes.push(
                "extender: no inventory (--inventory FILE): every node is reported as unknown"
                    .to_string(),
            );
            Ok(Started {
                notes,
                ..Default::default()
            })
        }
    }
}

/// A worker's inventory: its own nodes, from watches, as [`LOCAL_CLUSTER`].
fn watch_local_cluster(
    client: kube::Client,
    settings: &ServeSettings,
    store: Arc<InventoryStore>,
    metrics: &Metrics,
) -> Started {
    let mut hub = crate::workers::hub::Hub::new(store, settings.stale_after);
    hub.add_worker(
        LOCAL_CLUSTER,
        Default::default(),
        std::time::SystemTime::now(),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let options = crate::workers::watch::WatchOptions {
        restarts: Some(metrics.worker(LOCAL_CLUSTER).watch_restarts),
        timings: crate::workers::watch::WatchTimings::for_stale_after(settings.stale_after),
        ..Default::default()
    };
    Started {
        background: vec![
            tokio::spawn(crate::workers::watch::run(
                LOCAL_CLUSTER.to_string(),
                client,
                tx,
                options,
            )),
            tokio::spawn(crate::workers::hub::run(
                hub,
                rx,
                Duration::from_millis(100),
            )),
        ],
        notes: vec![format!(
            "extender: live inventory of this cluster (as {LOCAL_CLUSTER:?}) from watches"
        )],
        ..Default::default()
    }
}

/// The HTTPS server of the webhooks and the extender, with every request timed into the
/// metrics by the route and result its handler left ([`Outcome`]).
fn https_server(
    settings: &ServeSettings,
    state: web::Data<State>,
    listener: TcpListener,
    tls_config: rustls::ServerConfig,
) -> std::io::Result<actix_web::dev::Server> {
    let per_worker = settings.max_connections.div_ceil(settings.workers).max(1);
    Ok(HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap_fn(|req, srv| {
                let started = Instant::now();
                let metrics = req
                    .app_data::<web::Data<State>>()
                    .map(|s| s.metrics.clone());
                let fut = srv.call(req);
                async move {
                    let res = fut.await?;
                    if let Some(metrics) = metrics {
                        let outcome = res
                            .response()
                            .extensions()
                            .get::<Outcome>()
                            .copied()
                            .unwrap_or(Outcome {
                                path: "unmatched",
                                result: status_class(res.status()),
                            });
                        metrics.observe_request(outcome.path, outcome.result, started.elapsed());
                    }
                    Ok(res)
                }
            })
            .configure(webhook_routes)
            .configure(crate::extender::http::routes)
            .default_service(web::to(not_found))
    })
    .workers(settings.workers)
    .disable_signals()
    .shutdown_timeout(shutdown_secs(settings))
    // actix counts connections per worker, and a worker at its share stops taking more (the
    // rest wait in the listen backlog), so the share is the bound divided among the workers.
    .max_connections(per_worker)
    // A TLS handshake in progress is a connection like any other: half-finished ones, left so
    // by a client, cost a descriptor and a little memory, no CPU. With actix's own limit (256
    // per worker) a few hundred of them stopped every new connection, kube-apiserver's
    // included, until the handshake timeout let them go. actix keeps this limit per process
    // (the last server started sets it), which is right for `serve`: one HTTPS server.
    .max_connection_rate(per_worker)
    .client_request_timeout(Duration::from_secs(5))
    .tls_handshake_timeout(Duration::from_secs(5))
    .keep_alive(Duration::from_secs(90))
    // Replies go out as soon as they are written: with Nagle's algorithm a reply's last small
    // TLS record waits for the client's delayed ACK (40 ms on Linux) whenever it follows a
    // large one, which kube-scheduler and kube-apiserver would see as a slow extender/webhook.
    .tcp_nodelay(true)
    .listen_rustls_0_23(listener, tls_config)?
    .run())
}

/// The plain-HTTP probe server: `/healthz`, `/readyz` and `/metrics`.
fn probe_server(
    settings: &ServeSettings,
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
    listener: TcpListener,
) -> std::io::Result<actix_web::dev::Server> {
    let probe_state = (readiness, metrics);
    Ok(HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(probe_state.clone()))
            .route(
                HEALTHZ_PATH,
                web::get().to(|| async { HttpResponse::Ok().body("ok\n") }),
            )
            .route(READYZ_PATH, web::get().to(readyz))
            .route(METRICS_PATH, web::get().to(metrics_text))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(shutdown_secs(settings))
    .listen(listener)?
    .run())
}

/// How long a stopping server waits for requests in flight, in actix's whole seconds.
fn shutdown_secs(settings: &ServeSettings) -> u64 {
    settings.shutdown_timeout.as_secs().max(1)
}

/// A manager replica's tasks: leader election, the WorkerCluster controller feeding the
/// extender's inventory, (while leading) the virtual nodes, and the dispatcher.
fn start_manager(
    client: kube::Client,
    settings: &ServeSettings,
    store: Arc<InventoryStore>,
    metrics: Arc<Metrics>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Started {
    use crate::workers::{controller, virtual_node, ControllerOptions};
    let namespace = settings.namespace.clone();
    let mut started = Started::default();
    // The dispatcher's writes, which the Lease is given up after (see `WritesInFlight`).
    let writes = crate::leader::WritesInFlight::default();
    let leader = start_election(
        &client,
        settings,
        stop.clone(),
        writes.clone(),
        &mut started,
    );
    started.background.push(tokio::spawn(show_leadership(
        leader.clone(),
        metrics.clone(),
    )));

    let mut options = ControllerOptions::new(&namespace);
    options.stale_after = settings.stale_after;
    options.link.watch = crate::workers::watch::WatchTimings::for_stale_after(settings.stale_after);
    options.link.qps = settings.worker_qps;
    options.link.burst = settings.worker_burst;
    let (workers, task) = controller::start(
        client.clone(),
        store.clone(),
        options,
        leader.clone(),
        Some(metrics.clone()),
    );
    started.background.push(task);
    started.notes.push(format!(
        "manager: WorkerCluster controller (kubeconfig Secrets in {namespace}; {} QPS, burst {} per worker)",
        settings.worker_qps, settings.worker_burst
    ));
    started
        .notes
        .push("extender: live inventory of every WorkerCluster from watches".to_string());

    if settings.virtual_nodes {
        let options = virtual_node::VirtualNodeOptions {
            prefix: settings.extender.virtual_node_prefix.clone(),
            ..Default::default()
        };
        started.background.push(tokio::spawn(virtual_node::maintain(
            client.clone(),
            workers.clone(),
            store.clone(),
            leader.clone(),
            options,
        )));
        started.notes.push(format!(
            "virtual nodes: one per worker ({}<cluster>), kept by the leader",
            settings.extender.virtual_node_prefix
        ));
    } else {
        started
            .notes
            .push("virtual nodes: off (virtualNodes: false)".to_string());
    }

    let options = crate::dispatcher::live::LiveOptions {
        config: crate::dispatcher::DispatchConfig {
            manager_id: settings.manager_id.clone(),
            engine: settings.extender.engine,
            ..Default::default()
        },
        jobsets: settings.jobsets,
        ..Default::default()
    };
    let inputs = crate::dispatcher::live::Inputs {
        client: client.clone(),
        workers: workers.clone(),
        leader: leader.clone(),
        inventory: store,
        metrics: Some(metrics),
        writes,
    };
    started
        .background
        .push(crate::dispatcher::live::start(inputs, options, stop).task);
    started.notes.push(format!(
        "dispatcher: queued Jobs to worker clusters, copies labelled {}={} (the leader dispatches)",
        crate::dispatcher::ORIGIN_LABEL,
        settings.manager_id
    ));
    started.manager = Some(Manager {
        client,
        namespace,
        workers,
        leader,
    });
    started
}

/// Whether this replica leads: by the Lease when leader election is on (its task and
/// `/readyz` line go into `started`), else always.
fn start_election(
    client: &kube::Client,
    settings: &ServeSettings,
    stop: tokio::sync::watch::Receiver<bool>,
    writes: crate::leader::WritesInFlight,
    started: &mut Started,
) -> tokio::sync::watch::Receiver<bool> {
    let le = &settings.leader_election;
    if !le.enabled {
        started.notes.push(
            "leader election: off (leaderElection.enabled: false): this replica leads".to_string(),
        );
        return crate::leader::always();
    }
    let config = crate::leader::ElectionConfig {
        namespace: settings.namespace.clone(),
        lease_name: le.lease_name.clone(),
        identity: crate::leader::identity_from_env(),
        lease_duration: le.lease_duration,
        renew_deadline: le.renew_deadline,
        retry_period: le.retry_period,
    };
    let line = format!(
        "leader election: Lease {}/{} as {}",
        settings.namespace, config.lease_name, config.identity
    );
    tracing::info!(lease = %config.lease_name, identity = %config.identity, "leader election");
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(crate::leader::run(client.clone(), config, tx, stop, writes));
    started.election = Some((task, le.renew_deadline));
    started.leader_line = Some((line, rx.clone()));
    rx
}

/// Keeps the leader gauge equal to whether this replica leads.
async fn show_leadership(mut leader: tokio::sync::watch::Receiver<bool>, metrics: Arc<Metrics>) {
    loop {
        metrics.leader.set(i64::from(*leader.borrow_and_update()));
        if leader.changed().await.is_err() {
            return;
        }
    }
}

impl Running {
    /// Stops accepting, lets in-flight requests finish within the shutdown timeout, and
    /// returns when both servers have stopped.
    pub async fn shutdown(self) {
        self.readiness.shutting_down.store(true, Ordering::SeqCst);
        let _ = self.stop_background.send(true);
        self.https.stop(true).await;
        self.probe.stop(true).await;
        for server in self.servers {
            let _ = server.await;
        }
        // The Lease is given up before the process goes, so a successor leads at once: after
        // the dispatcher's writes in flight are answered (up to the renew deadline), then the
        // release itself (up to the renew deadline again).
        if let Some((election, limit)) = self.election {
            let _ = tokio::time::timeout(2 * limit + Duration::from_secs(1), election).await;
        }
        for task in self.background {
            task.abort();
        }
        tracing::info!("stopped");
    }
}

/// `serve`: start, wait for SIGTERM or SIGINT, shut down gracefully.
///
/// The handlers are installed before anything else: a SIGTERM while the Kubernetes client
/// is being built (an exec credential plugin can take seconds) would otherwise kill the
/// process by the default action instead of ending it with 0. A signal that arrives while
/// `start` blocks (the plugin runs synchronously) is kept: the server stops once it is up.
pub async fn run(settings: ServeSettings) -> crate::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let running = tokio::select! {
        biased;
        _ = term.recv() => {
            tracing::info!("SIGTERM during start-up: exiting");
            return Ok(());
        }
        _ = interrupt.recv() => {
            tracing::info!("interrupted during start-up: exiting");
            return Ok(());
        }
        started = start(settings) => started?,
    };
    if let Some(manager) = &running.manager {
        tracing::info!(namespace = %manager.namespace, "manager running");
    }
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: finishing in-flight requests"),
        _ = interrupt.recv() => tracing::info!("interrupted: finishing in-flight requests"),
    }
    running.shutdown().await;
    Ok(())
}

/// The admission webhook routes, for the shared HTTPS app: a mutating and a validating hook
/// per kind the dispatcher runs.
pub(crate) fn webhook_routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        MUTATE_JOB_PATH,
        web::post().to(|s, r, p| review(Hook::Mutate, Kind::Job, s, r, p)),
    )
    .route(
        VALIDATE_JOB_PATH,
        web::post().to(|s, r, p| review(Hook::Validate, Kind::Job, s, r, p)),
    )
    .route(
        MUTATE_JOBSET_PATH,
        web::post().to(|s, r, p| review(Hook::Mutate, Kind::JobSet, s, r, p)),
    )
    .route(
        VALIDATE_JOBSET_PATH,
        web::post().to(|s, r, p| review(Hook::Validate, Kind::JobSet, s, r, p)),
    );
    for path in [
        MUTATE_JOB_PATH,
        VALIDATE_JOB_PATH,
        MUTATE_JOBSET_PATH,
        VALIDATE_JOBSET_PATH,
    ] {
        cfg.route(path, web::to(method_not_allowed));
    }
}

/// The path of a kind's hook (the metrics' `path` label).
fn hook_path(hook: Hook, kind: Kind) -> &'static str {
    match (hook, kind) {
        (Hook::Mutate, Kind::Job) => MUTATE_JOB_PATH,
        (Hook::Validate, Kind::Job) => VALIDATE_JOB_PATH,
        (Hook::Mutate, Kind::JobSet) => MUTATE_JOBSET_PATH,
        (Hook::Validate, Kind::JobSet) => VALIDATE_JOBSET_PATH,
    }
}

fn status_class(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200..=299 => "2xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

pub(crate) fn plain(status: StatusCode, outcome: Outcome, line: String) -> HttpResponse {
    let mut res = HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .body(line + "\n");
    res.extensions_mut().insert(outcome);
    res
}

async fn not_found(req: HttpRequest) -> HttpResponse {
    plain(
        StatusCode::NOT_FOUND,
        Outcome {
            path: "unmatched",
            result: "not_found",
        },
        format!(
            "no such path {:?}: this server answers POST {MUTATE_JOB_PATH}, {VALIDATE_JOB_PATH}, {MUTATE_JOBSET_PATH}, {VALIDATE_JOBSET_PATH}, {}, {} and {}",
            req.path(),
            crate::extender::FILTER_PATH,
            crate::extender::PRIORITIZE_PATH,
            crate::extender::BIND_PATH
        ),
    )
}

pub(crate) async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    let mut res = plain(
        StatusCode::METHOD_NOT_ALLOWED,
        Outcome {
            path: "unmatched",
            result: "bad_request",
        },
        format!("{} {}: only POST is served here", req.method(), req.path()),
    );
    res.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
    res
}

pub(crate) fn is_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The most a request may reserve before its bytes arrive: a declared Content-Length is only
/// a claim, and trusting it would let idle connections pin `limit` bytes each.
const INITIAL_BODY_CAPACITY: usize = 64 * 1024;

/// Reads the body within the size limit and the body timeout.
pub(crate) async fn read_body<P>(
    req: &HttpRequest,
    mut payload: P,
    limit: usize,
    timeout: Duration,
    path: &'static str,
) -> Result<Vec<u8>, HttpResponse>
where
    P: futures::Stream<Item = Result<actix_web::web::Bytes, actix_web::error::PayloadError>>
        + Unpin,
{
    let bad = Outcome {
        path,
        result: "bad_request",
    };
    let too_large = |n: String| {
        plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            bad,
            format!("a body of {n} bytes is over the {limit}-byte limit of {path}"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(n) = declared.filter(|n| *n > limit) {
        return Err(too_large(n.to_string()));
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0).min(INITIAL_BODY_CAPACITY));
    let read = async {
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|e| {
                let why = match e {
                    // actix's own text ends in its inner error's Debug ("None").
                    actix_web::error::PayloadError::Incomplete(_) => {
                        "it ended before its declared length or last chunk".to_string()
                    }
                    other => other.to_string(),
                };
                plain(
                    StatusCode::BAD_REQUEST,
                    bad,
                    format!("request body could not be read: {why}"),
                )
            })?;
            if body.len() + chunk.len() > limit {
                return Err(too_large(format!("more than {limit}")));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(())) => Ok(body),
        Ok(Err(res)) => Err(res),
        Err(_) => Err(plain(
            StatusCode::REQUEST_TIMEOUT,
            bad,
            format!("request body did not arrive within {timeout:?}"),
        )),
    }
}

/// One admission review. Logging is per event, not per span: a span per request costs as
/// much as the review itself with the JSON formatter, and only denials and refusals are
/// logged at info.
async fn review(
    hook: Hook,
    kind: Kind,
    state: web::Data<State>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let webhooks = &state.webhooks;
    let path = hook_path(hook, kind);
    let outcome = |result| Outcome { path, result };
    let hook_name = hook.as_str();
    if !is_json(&req) {
        let found = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none");
        tracing::warn!(hook = hook_name, content_type = found, "refused: not JSON");
        return plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            outcome("bad_request"),
            format!("Content-Type {found:?} is not application/json: send an admission.k8s.io/v1 AdmissionReview"),
        );
    }
    let body = match read_body(
        &req,
        payload,
        webhooks.max_body,
        webhooks.body_timeout,
        path,
    )
    .await
    {
        Ok(b) => b,
        Err(res) => {
            tracing::warn!(
                hook = hook_name,
                status = res.status().as_u16(),
                "refused: body"
            );
            return res;
        }
    };
    let review = match webhook::parse(&body, kind) {
        Ok(r) => r,
        Err(BadReview::Unreadable(line)) => {
            let line = crate::text::about_request(&line);
            tracing::warn!(hook = hook_name, reason = %line, "refused: unreadable review");
            return plain(StatusCode::BAD_REQUEST, outcome("bad_request"), line);
        }
        Err(BadReview::Rejected { envelope, message }) => {
            let message = crate::text::about_request(&message);
            tracing::warn!(hook = hook_name, uid = %Clipped(&envelope.uid), reason = %message, "denied: malformed request");
            let d = Decision::deny(Denial::bad_request(message));
            return reply(&envelope.into(), &d, outcome("bad_request"));
        }
    };

    let labels = match review.namespace_to_look_up(hook, &webhooks.policy) {
        None => None,
        Some(ns) => match webhooks.namespaces.get(ns).await {
            Ok(labels) => labels,
            Err(e) => {
                tracing::error!(hook = hook_name, uid = %Clipped(&review.envelope.uid), error = %e, "denied: namespace lookup failed");
                let d = Decision::deny(Denial::unavailable(format!(
                    "{e}; the default queue cannot be decided, retry shortly"
                )));
                return reply(&review.envelope, &d, outcome("error"));
            }
        },
    };
    let decision = webhook::decide(hook, &review, &webhooks.policy, labels.as_deref());
    match &decision.denial {
        Some(d) => tracing::info!(
            hook = hook_name,
            uid = %Clipped(&review.envelope.uid),
            namespace = %Clipped(review.namespace.as_deref().unwrap_or("")),
            name = %Clipped(review.object_name()),
            operation = review.operation.as_str(),
            user = %Clipped(&review.username),
            dry_run = review.dry_run,
            code = d.code,
            reason = %Clipped(&d.message),
            "denied"
        ),
        None => tracing::debug!(
            hook = hook_name,
            uid = %Clipped(&review.envelope.uid),
            namespace = %Clipped(review.namespace.as_deref().unwrap_or("")),
            name = %Clipped(review.object_name()),
            operation = review.operation.as_str(),
            mutated = decision.mutated(),
            "allowed"
        ),
    }
    reply(&review.envelope, &decision, outcome(decision.outcome()))
}

fn reply(envelope: &webhook::Envelope, d: &Decision, outcome: Outcome) -> HttpResponse {
    let mut res = HttpResponse::Ok()
        .content_type("application/json")
        .body(webhook::render(envelope, d));
    res.extensions_mut().insert(outcome);
    res
}

type ProbeState = web::Data<(Arc<Readiness>, Arc<Metrics>)>;

async fn readyz(state: ProbeState) -> HttpResponse {
    let readiness = &state.0;
    let mut body = String::new();
    let status = if readiness.shutting_down.load(Ordering::SeqCst) {
        body.push_str("shutting down\n");
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        body.push_str("webhooks: ok\n");
        StatusCode::OK
    };
    for note in &readiness.notes {
        body.push_str(note);
        body.push('\n');
    }
    if let Some((line, leader)) = &readiness.leader {
        let leading = if *leader.borrow() {
            "leading"
        } else {
            "following"
        };
        body.push_str(&format!("{line}: {leading}\n"));
    }
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .body(body)
}

async fn metrics_text(state: ProbeState) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(state.1.encode())
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::web::Bytes;

    fn chunks(
        parts: Vec<Vec<u8>>,
    ) -> impl futures::Stream<Item = Result<Bytes, actix_web::error::PayloadError>> + Unpin {
        futures::stream::iter(parts.into_iter().map(|p| Ok(Bytes::from(p))))
    }

    #[tokio::test]
    async fn a_declared_length_reserves_no_more_than_arrives_up_front() {
        let limit = crate::config::DEFAULT_MAX_REVIEW_BYTES;
        let req = actix_web::test::TestRequest::post()
            .insert_header((header::CONTENT_LENGTH, (limit - 1).to_string()))
            .to_http_request();
        let body = read_body(
            &req,
            chunks(vec![b"{}".to_vec()]),
            limit,
            Duration::from_secs(5),
            MUTATE_JOB_PATH,
        )
        .await
        .unwrap();
        assert_eq!(body, b"{}");
        assert!(
            body.capacity() <= INITIAL_BODY_CAPACITY,
            "{} bytes reserved for a 2-byte body",
            body.capacity()
        );

        // A body larger than the first reservation still arrives whole.
        let parts: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 4096]).collect();
        let whole: Vec<u8> = parts.concat();
        let req = actix_web::test::TestRequest::post()
            .insert_header((header::CONTENT_LENGTH, whole.len().to_string()))
            .to_http_request();
        let body = read_body(
            &req,
            chunks(parts),
            limit,
            Duration::from_secs(5),
            MUTATE_JOB_PATH,
        )
        .await
        .unwrap();
        assert_eq!(body, whole);
    }
}
