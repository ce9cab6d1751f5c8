//! End-to-end load: HTTPS with keep-alive on loopback against switchyard in-process, then
//! against a hello-world actix-web + rustls server as the baseline, one after the other so
//! they never share the CPU.
//!
//!     cargo bench --bench load                      # full run, about a minute
//!     LOAD_SECONDS=2 cargo bench --bench load       # smoke test
//!
//! Environment (defaults in brackets):
//!   LOAD_SECONDS [10]        measured seconds per mode and server
//!   LOAD_WARMUP [2]          unmeasured seconds before each mode
//!   LOAD_CONNECTIONS [32]    keep-alive connections, one task each
//!   LOAD_RATE [5000]         open-loop requests/s (all connections together)
//!   LOAD_WORKERS [2]         server worker threads (switchyard and baseline alike)
//!   LOAD_CLIENT_THREADS [1]  load-generator runtime threads
//!   LOAD_BODY [stored]       `stored`: the fixture as kept (pretty-printed, 4.2 KB);
//!                            `compact`: the same JSON without whitespace (2.2 KB), as
//!                            kube-apiserver sends it
//!   LOAD_LOG [info]          switchyard's log filter; JSON lines into a sink, as `serve` would
//!                            format them (but not write them); `off` installs no subscriber
//!
//! Mode A (closed loop): every connection posts the next review as soon as the last reply is
//! in; reports replies/s. Mode B (open loop): requests are scheduled at fixed intervals spread
//! across the connections, and a request that cannot be sent on time because its connection
//! is still busy is timed from its *scheduled* time, so a stall is not hidden by the load
//! generator slowing down (coordinated omission).
//!
//! The generator runs on its own tokio runtime with one thread by default: on a 2-core machine
//! the servers' workers keep most of the CPU, as they would with the API server elsewhere. The
//! generator shares a core with them, so figures are a lower bound on the server's capacity.
//!
//! Without `--bench` (`cargo test --benches`), a one-second run with two connections only
//! checks that the harness works.

use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::{anyhow, bail, Context};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use switchyard::config::{ServeSettings, TlsSource};
use switchyard::wellknown::MUTATE_JOB_PATH;
use tokio::runtime::Handle;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

/// Bound on a connection (TCP + TLS + HTTP handshake) and on each request.
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long an open-loop connection may run past the end catching up before it gives up on
/// the requests it still owes (counted as dropped).
const GRACE: Duration = Duration::from_secs(5);
const FIXTURE: &str = "admission-mutate-create-basic";
const BASELINE_PATH: &str = "/hello";
const BASELINE_REPLY: &str = r#"{"hello":"world"}"#;

type Sender = SendRequest<Full<Bytes>>;

struct Params {
    seconds: u64,
    warmup: u64,
    connections: usize,
    rate: u64,
    workers: usize,
    client_threads: usize,
    compact: bool,
    log: String,
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map_err(|e| anyhow!("{name}={v:?}: {e}")),
        Err(_) => Ok(default),
    }
}

impl Params {
    fn from_env() -> anyhow::Result<Self> {
        let p = Self {
            seconds: env("LOAD_SECONDS", 10)?,
            warmup: env("LOAD_WARMUP", 2)?,
            connections: env("LOAD_CONNECTIONS", 32)?,
            rate: env("LOAD_RATE", 5000)?,
            workers: env("LOAD_WORKERS", 2)?,
            client_threads: env("LOAD_CLIENT_THREADS", 1)?,
            compact: match env("LOAD_BODY", "stored".to_string())?.as_str() {
                "stored" => false,
                "compact" => true,
                other => bail!("LOAD_BODY={other:?}: expected stored or compact"),
            },
            log: env("LOAD_LOG", "info".to_string())?,
        };
        if p.seconds == 0 || p.connections == 0 || p.rate == 0 || p.workers == 0 {
            bail!("LOAD_SECONDS, LOAD_CONNECTIONS, LOAD_RATE and LOAD_WORKERS must be at least 1");
        }
        if p.client_threads == 0 {
            bail!("LOAD_CLIENT_THREADS must be at least 1");
        }
        Ok(p)
    }

    /// `cargo test --benches`: prove the harness runs, quickly.
    fn smoke() -> Self {
        Self {
            seconds: 1,
            warmup: 0,
            connections: 2,
            rate: 100,
            workers: 1,
            client_threads: 1,
            compact: false,
            log: "off".into(),
        }
    }
}

/// What the load is pointed at.
struct Target {
    name: &'static str,
    addr: SocketAddr,
    path: &'static str,
    /// Checked once per run in a preflight reply, so a misrouted request (a fast 404, an
    /// unreadable-body 400) cannot pass for a review.
    reply_contains: &'static str,
}

/// One phase's figures from one connection, merged across connections.
#[derive(Default)]
struct Stats {
    completed: u64,
    latencies_ns: Vec<u64>,
    /// Open loop: how late the timer woke the generator for a request whose connection was
    /// free (its own slack, excluded from latency, reported for transparency).
    timer_lag_ns: Vec<u64>,
    errors: u64,
    dropped: u64,
    first_error: Option<String>,
}

impl Stats {
    fn merge(&mut self, other: Stats) {
        self.completed += other.completed;
        self.latencies_ns.extend(other.latencies_ns);
        self.timer_lag_ns.extend(other.timer_lag_ns);
        self.errors += other.errors;
        self.dropped += other.dropped;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn error(&mut self, e: anyhow::Error) {
        self.errors += 1;
        self.first_error.get_or_insert_with(|| format!("{e:#}"));
    }
}

/// Nearest-rank percentile of sorted values, in microseconds.
fn pct_us(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1e3
}

struct Summary {
    rps: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
    timer_lag_p99: f64,
    requests: u64,
    errors: u64,
    dropped: u64,
    first_error: Option<String>,
}

impl Summary {
    fn of(mut s: Stats, seconds: u64) -> Self {
        s.latencies_ns.sort_unstable();
        s.timer_lag_ns.sort_unstable();
        let l = &s.latencies_ns;
        Self {
            rps: s.completed as f64 / seconds as f64,
            p50: pct_us(l, 0.50),
            p90: pct_us(l, 0.90),
            p99: pct_us(l, 0.99),
            p999: pct_us(l, 0.999),
            max: pct_us(l, 1.0),
            timer_lag_p99: pct_us(&s.timer_lag_ns, 0.99),
            requests: s.completed,
            errors: s.errors,
            dropped: s.dropped,
            first_error: s.first_error,
        }
    }

    fn json(&self) -> serde_json::Value {
        // NaN (no samples) is not JSON; null says the same.
        let f = |v: f64| (v.is_finite()).then(|| (v * 10.0).round() / 10.0);
        json!({
            "rps": f(self.rps),
            "p50_us": f(self.p50),
            "p90_us": f(self.p90),
            "p99_us": f(self.p99),
            "p999_us": f(self.p999),
            "max_us": f(self.max),
            "timer_lag_p99_us": f(self.timer_lag_p99),
            "requests": self.requests,
            "errors": self.errors,
            "dropped": self.dropped,
            "first_error": self.first_error,
        })
    }
}

struct ServerResult {
    closed: Summary,
    open: Summary,
}

fn connector(ca: &Path) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).with_context(|| ca.display().to_string())? {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// One keep-alive HTTPS connection, verified against the dev CA as "localhost". Must run on
/// the load runtime: the socket and the connection task belong to it.
async fn connect(connector: TlsConnector, addr: SocketAddr) -> anyhow::Result<Sender> {
    if !addr.ip().is_loopback() {
        bail!("refusing to load {addr}: loopback only");
    }
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        // As Go's net/http (the API server's client) does.
        tcp.set_nodelay(true)?;
        let tls = connector
            .connect(ServerName::try_from("localhost")?, tcp)
            .await?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        anyhow::Ok(sender)
    };
    tokio::time::timeout(TIMEOUT, handshake)
        .await
        .map_err(|_| anyhow!("connect to {addr}: no handshake within {TIMEOUT:?}"))?
}

/// POSTs `body` and reads the whole reply; anything but 200 within the timeout is an error.
async fn post(sender: &mut Sender, path: &str, body: &Bytes) -> anyhow::Result<Bytes> {
    let req = hyper::Request::post(path)
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body.clone()))?;
    let exchange = async {
        sender.ready().await?;
        let res = sender.send_request(req).await?;
        let status = res.status();
        let reply = res.into_body().collect().await?.to_bytes();
        if status != hyper::StatusCode::OK {
            bail!(
                "POST {path}: {status}: {}",
                String::from_utf8_lossy(&reply).trim()
            );
        }
        Ok(reply)
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow!("POST {path}: no reply within {TIMEOUT:?}"))?
}

/// Mode A for one connection: back-to-back requests until `end`; replies that arrive in
/// `[warm_end, end)` are counted. A failed connection stops (and is reported).
async fn closed_loop(
    mut sender: Sender,
    path: &'static str,
    body: Bytes,
    warm_end: Instant,
    end: Instant,
) -> (Option<Sender>, Stats) {
    let mut stats = Stats::default();
    loop {
        let sent = Instant::now();
        if sent >= end {
            return (Some(sender), stats);
        }
        if let Err(e) = post(&mut sender, path, &body).await {
            stats.error(e);
            return (None, stats);
        }
        let done = Instant::now();
        if done >= warm_end && done < end {
            stats.completed += 1;
            stats.latencies_ns.push((done - sent).as_nanos() as u64);
        }
    }
}

/// Mode B for connection `index` of `connections`: request k is due at
/// `start + (index + k * connections) / rate`, so the connections together send `rate`
/// requests/s evenly spaced. Only requests due in `[warm_end, end)` are recorded.
#[allow(clippy::too_many_arguments)]
async fn open_loop(
    mut sender: Sender,
    path: &'static str,
    body: Bytes,
    index: u64,
    connections: u64,
    rate: u64,
    start: Instant,
    warm_end: Instant,
    end: Instant,
) -> (Option<Sender>, Stats) {
    let mut stats = Stats::default();
    let mut gave_up = false;
    for k in 0.. {
        // Integer nanoseconds from the start: no drift accumulates over the run.
        let due_ns = (index + k * connections) as u128 * 1_000_000_000 / rate as u128;
        let due = start + Duration::from_nanos(due_ns as u64);
        if due >= end {
            break;
        }
        let measured = due >= warm_end;
        if gave_up || Instant::now() > end + GRACE {
            gave_up = true;
            stats.dropped += u64::from(measured);
            continue;
        }
        let begin = if Instant::now() >= due {
            // Late: the previous reply held this connection past the due time (or the
            // generator was busy). A real caller would have waited too, so it counts.
            due
        } else {
            // Early: the connection is free. tokio's timer wakes up to ~1 ms late; that is
            // the generator's slack, not the server's, so time from the actual send.
            tokio::time::sleep_until(due).await;
            let now = Instant::now();
            if measured {
                stats.timer_lag_ns.push((now - due).as_nanos() as u64);
            }
            now
        };
        if let Err(e) = post(&mut sender, path, &body).await {
            stats.error(e);
            return (None, stats);
        }
        if measured {
            stats.completed += 1;
            stats
                .latencies_ns
                .push((Instant::now() - begin).as_nanos() as u64);
        }
    }
    (Some(sender), stats)
}

/// Joins one phase's tasks, bounded so a wedged task cannot hang the run.
async fn join_phase(
    tasks: Vec<tokio::task::JoinHandle<(Option<Sender>, Stats)>>,
    deadline: Instant,
) -> anyhow::Result<(Vec<Sender>, Stats)> {
    let joined = tokio::time::timeout_at(deadline, futures::future::join_all(tasks))
        .await
        .map_err(|_| anyhow!("load tasks did not finish in time"))?;
    let mut senders = Vec::new();
    let mut stats = Stats::default();
    for r in joined {
        let (sender, s) = r.map_err(|e| anyhow!("load task failed: {e}"))?;
        senders.extend(sender);
        stats.merge(s);
    }
    Ok((senders, stats))
}

/// Both modes against one server, with fresh connections.
async fn measure(
    load: &Handle,
    connector: &TlsConnector,
    target: &Target,
    body: &Bytes,
    p: &Params,
) -> anyhow::Result<ServerResult> {
    eprintln!("{}: {} on {}", target.name, target.path, target.addr);
    let connects: Vec<_> = (0..p.connections)
        .map(|_| load.spawn(connect(connector.clone(), target.addr)))
        .collect();
    let mut senders = Vec::with_capacity(p.connections);
    for c in connects {
        senders.push(c.await??);
    }

    let (path, preflight_body, mut first) = (target.path, body.clone(), senders.swap_remove(0));
    let (first, reply) = load
        .spawn(async move {
            let reply = post(&mut first, path, &preflight_body).await;
            (first, reply)
        })
        .await?;
    senders.push(first);
    let reply = reply?;
    if !String::from_utf8_lossy(&reply).contains(target.reply_contains) {
        bail!(
            "{}: preflight reply lacks {:?}: {}",
            target.name,
            target.reply_contains,
            String::from_utf8_lossy(&reply)
        );
    }

    let warmup = Duration::from_secs(p.warmup);
    let seconds = Duration::from_secs(p.seconds);
    let slack = TIMEOUT + GRACE + Duration::from_secs(5);

    eprintln!("{}: closed loop, {}+{} s", target.name, p.warmup, p.seconds);
    let start = Instant::now();
    let (warm_end, end) = (start + warmup, start + warmup + seconds);
    let tasks = senders
        .into_iter()
        .map(|s| load.spawn(closed_loop(s, target.path, body.clone(), warm_end, end)))
        .collect();
    let (senders, closed) = join_phase(tasks, end + slack).await?;

    eprintln!(
        "{}: open loop at {}/s, {}+{} s",
        target.name, p.rate, p.warmup, p.seconds
    );
    // A little lead so no connection starts out late because the tasks were still spawning.
    let start = Instant::now() + Duration::from_millis(20);
    let (warm_end, end) = (start + warmup, start + warmup + seconds);
    let n = senders.len() as u64;
    let tasks = senders
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            load.spawn(open_loop(
                s,
                target.path,
                body.clone(),
                i as u64,
                n,
                p.rate,
                start,
                warm_end,
                end,
            ))
        })
        .collect();
    let (_, open) = join_phase(tasks, end + slack).await?;

    Ok(ServerResult {
        closed: Summary::of(closed, p.seconds),
        open: Summary::of(open, p.seconds),
    })
}

async fn hello(_body: web::Bytes) -> HttpResponse {
    // The body is read (and dropped) so both servers receive the same bytes and keep-alive
    // never depends on draining an unread payload.
    HttpResponse::Ok()
        .content_type("application/json")
        .body(BASELINE_REPLY)
}

/// The baseline: plain actix-web + rustls 0.23 with the same certificate, protocols and
/// worker count as switchyard, and nothing else.
fn start_baseline(
    cert: &Path,
    key: &Path,
    workers: usize,
) -> anyhow::Result<(SocketAddr, actix_web::dev::Server)> {
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let server = HttpServer::new(|| App::new().route(BASELINE_PATH, web::post().to(hello)))
        .workers(workers)
        .disable_signals()
        .keep_alive(Duration::from_secs(90))
        .client_request_timeout(TIMEOUT)
        .tls_handshake_timeout(TIMEOUT)
        .listen_rustls_0_23(listener, config)?
        .run();
    Ok((addr, server))
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn install_logging(filter: &str) -> anyhow::Result<()> {
    if filter == "off" {
        return Ok(());
    }
    // What `switchyard serve --log-format json` installs (telemetry::init), writing into a
    // sink: the per-request span and field formatting is paid, the terminal is not.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(filter)?)
        .with_writer(std::io::sink)
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .try_init()
        .map_err(|e| anyhow!("logger: {e}"))
}

fn main() -> anyhow::Result<()> {
    switchyard::install_crypto_provider();
    let bench = std::env::args().any(|a| a == "--bench");
    let p = if bench {
        Params::from_env()?
    } else {
        Params::smoke()
    };
    install_logging(&p.log)?;

    let load = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(p.client_threads)
        .thread_name("load-gen")
        .enable_all()
        .build()?;
    // The servers' own threads are actix's; this runtime only starts and stops them.
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;

    let dir = tempfile::tempdir()?;
    let (cert, key) = switchyard::certs::ensure_dev(dir.path())?;
    let connector = connector(&dir.path().join("ca.crt"))?;
    let fixture_path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/admission")
        .join(format!("{FIXTURE}.json"));
    let mut body =
        std::fs::read(&fixture_path).with_context(|| fixture_path.display().to_string())?;
    if p.compact {
        body = serde_json::to_vec(&serde_json::from_slice::<serde_json::Value>(&body)?)?;
    }
    let body = Bytes::from(body);

    let (ours, base) = control.block_on(async {
        let mut settings = ServeSettings::for_tests(TlsSource::Dev(dir.path().to_path_buf()));
        settings.workers = p.workers;
        let running = switchyard::server::start(settings).await?;
        let target = Target {
            name: "switchyard",
            addr: running.https_addr,
            path: MUTATE_JOB_PATH,
            reply_contains: r#""patchType":"JSONPatch""#,
        };
        let ours = measure(load.handle(), &connector, &target, &body, &p).await;
        tokio::time::timeout(Duration::from_secs(15), running.shutdown())
            .await
            .map_err(|_| anyhow!("switchyard did not shut down"))?;
        let ours = ours?;

        let (addr, server) = start_baseline(&cert, &key, p.workers)?;
        let handle = server.handle();
        let serving = tokio::spawn(server);
        let target = Target {
            name: "baseline",
            addr,
            path: BASELINE_PATH,
            reply_contains: BASELINE_REPLY,
        };
        let base = measure(load.handle(), &connector, &target, &body, &p).await;
        tokio::time::timeout(Duration::from_secs(15), async {
            handle.stop(true).await;
            let _ = serving.await;
        })
        .await
        .map_err(|_| anyhow!("baseline did not shut down"))?;
        anyhow::Ok((ours, base?))
    })?;
    load.shutdown_timeout(Duration::from_secs(5));

    report(&p, body.len(), &ours, &base);
    if !bench {
        println!("(harness check without --bench: a debug build and tiny load, not a measurement)");
    }
    let errors = [&ours.closed, &ours.open, &base.closed, &base.open]
        .iter()
        .map(|s| s.errors + s.dropped)
        .sum::<u64>();
    if errors > 0 {
        bail!("{errors} requests failed or were dropped; the figures above are not valid");
    }
    Ok(())
}

fn report(p: &Params, body_len: usize, ours: &ServerResult, base: &ServerResult) {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = cpu_model();
    let ratio = ours.closed.rps / base.closed.rps;
    let targets = json!({
        "closed_rps_at_least_20000": ours.closed.rps >= 20_000.0,
        "closed_ratio_at_least_0_6": ratio >= 0.6,
        "open_p99_under_2ms": ours.open.p99 < 2_000.0,
    });

    println!();
    println!("machine: {nproc} CPUs, {cpu}");
    println!(
        "servers: {} workers each; generator: {} thread(s), {} keep-alive TLS connections; body {} B ({FIXTURE}, {}); {} s measured after {} s warm-up per mode",
        p.workers,
        p.client_threads,
        p.connections,
        body_len,
        if p.compact { "compact" } else { "as stored" },
        p.seconds,
        p.warmup
    );
    println!();
    println!("{:<34} {:>12} {:>12}", "", "switchyard", "baseline");
    let row = |label: &str, a: f64, b: f64| println!("{label:<34} {a:>12.1} {b:>12.1}");
    row("closed loop: replies/s", ours.closed.rps, base.closed.rps);
    row(
        "closed loop: p50 ms",
        ours.closed.p50 / 1e3,
        base.closed.p50 / 1e3,
    );
    row(
        "closed loop: p99 ms",
        ours.closed.p99 / 1e3,
        base.closed.p99 / 1e3,
    );
    println!("{:<34} {:>12.2}", "closed loop: ratio", ratio);
    let open = format!("open loop @{}/s", p.rate);
    row(&format!("{open}: achieved/s"), ours.open.rps, base.open.rps);
    let ms = |label: &str, a: f64, b: f64| {
        println!(
            "{:<34} {:>12.3} {:>12.3}",
            format!("{open}: {label} ms"),
            a / 1e3,
            b / 1e3
        )
    };
    ms("p50", ours.open.p50, base.open.p50);
    ms("p90", ours.open.p90, base.open.p90);
    ms("p99", ours.open.p99, base.open.p99);
    ms("p99.9", ours.open.p999, base.open.p999);
    ms("max", ours.open.max, base.open.max);
    ms(
        "timer lag p99",
        ours.open.timer_lag_p99,
        base.open.timer_lag_p99,
    );
    for (name, r) in [("switchyard", ours), ("baseline", base)] {
        for (mode, s) in [("closed", &r.closed), ("open", &r.open)] {
            if s.errors > 0 || s.dropped > 0 {
                println!(
                    "{name} {mode}: {} errors, {} dropped; first: {}",
                    s.errors,
                    s.dropped,
                    s.first_error.as_deref().unwrap_or("-")
                );
            }
        }
    }
    println!("targets: {targets}");
    println!();
    let line = json!({
        "bench": "switchyard-load",
        "machine": { "nproc": nproc, "cpu": cpu },
        "config": {
            "seconds": p.seconds,
            "warmup_seconds": p.warmup,
            "connections": p.connections,
            "open_loop_rate": p.rate,
            "server_workers": p.workers,
            "client_threads": p.client_threads,
            "log": p.log,
            "body": if p.compact { "compact" } else { "stored" },
            "body_bytes": body_len,
            "fixture": FIXTURE,
        },
        "switchyard": { "closed": ours.closed.json(), "open": ours.open.json() },
        "baseline": { "closed": base.closed.json(), "open": base.open.json() },
        "closed_ratio": (ratio * 1000.0).round() / 1000.0,
        "targets": targets,
    });
    println!("{line}");
}
