//! Connection abuse on the HTTPS port (issue 24, part 3): idle connections, half-finished TLS
//! handshakes, bodies and heads trickled a byte at a time, and clients that never read their
//! replies, all against the real server in this process. Meanwhile a normal client sends the
//! real AdmissionReview on a kept-alive connection and the probes are asked; their latencies
//! must stay low, and the process's file descriptors and memory must stay bounded and come back
//! once the abusers go.
//!
//!     cargo test --test abuse                                               # CI size, ~25 s
//!     SWITCHYARD_ABUSE_FULL=1 cargo test --release --test abuse -- --nocapture   # full size
//!
//! The abuse comes in two rounds, so that what the first leaves behind shows whether memory is
//! reused or piles up. Every abuser keeps one connection of its kind open for the whole round:
//! when the server closes it, it opens another at once, so the pressure does not fade as the
//! server's timeouts fire. Environment (CI size / full size):
//!   SWITCHYARD_ABUSE_IDLE [100 / 1000]     connections that finish the handshake and go quiet
//!   SWITCHYARD_ABUSE_HALF [100 / 1000]     connections that send half a ClientHello and wait
//!   SWITCHYARD_ABUSE_TRICKLE [10 / 100]    connections sending a review a byte at a time
//!   SWITCHYARD_ABUSE_DEAF [10 / 100]       connections sending reviews, never reading a reply
//!   SWITCHYARD_ABUSE_SECONDS [8 / 60]      how long each round lasts
//!   SWITCHYARD_ABUSE_TRICKLE_MS [500 / 1000]  the pause between two trickled bytes

mod common;

use common::fixture;
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard::config::{ServeSettings, TlsSource};
use switchyard::wellknown::MUTATE_JOB_PATH;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

// As in the binary: memory figures mean something only with the allocator `serve` runs on.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const FIXTURE: &str = "admission-mutate-create-basic";
/// The normal client's pace: one review every 5 ms, a busy API server's worth for one hook.
const REVIEW_EVERY: Duration = Duration::from_millis(5);
/// Between two probe rounds (/healthz, /readyz) and two reviews on a fresh connection.
const PROBE_EVERY: Duration = Duration::from_millis(250);
const FRESH_EVERY: Duration = Duration::from_millis(500);
/// Quiet time before the abuse: the normal client's figures without abusers, to compare.
const BASELINE: Duration = Duration::from_secs(2);

struct Sizes {
    full: bool,
    idle: usize,
    half: usize,
    trickle: usize,
    deaf: usize,
    seconds: u64,
    trickle_every: Duration,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

impl Sizes {
    fn from_env() -> Self {
        let full = std::env::var("SWITCHYARD_ABUSE_FULL").is_ok_and(|v| v == "1");
        let (idle, half, trickle, deaf, seconds, trickle_ms) = if full {
            (1000, 1000, 100, 100, 60, 1000)
        } else {
            (100, 100, 10, 10, 8, 500)
        };
        let mut sizes = Self {
            full,
            idle: env_or("SWITCHYARD_ABUSE_IDLE", idle),
            half: env_or("SWITCHYARD_ABUSE_HALF", half),
            trickle: env_or("SWITCHYARD_ABUSE_TRICKLE", trickle),
            deaf: env_or("SWITCHYARD_ABUSE_DEAF", deaf),
            seconds: env_or("SWITCHYARD_ABUSE_SECONDS", seconds),
            trickle_every: Duration::from_millis(env_or("SWITCHYARD_ABUSE_TRICKLE_MS", trickle_ms)),
        };
        // Each abuser holds two descriptors here (its socket and the server's), and a
        // reconnecting one briefly a third.
        let wanted = 3 * sizes.connections() + 256;
        let limit = open_files_limit();
        if limit < wanted {
            let scale = limit.saturating_sub(256) as f64 / (3 * sizes.connections()) as f64;
            let shrink = |n: usize| ((n as f64 * scale) as usize).max(1);
            eprintln!(
                "abuse: open files limit {limit} is below the {wanted} this size needs (`ulimit -n {wanted}` to run it whole); every abuser count scaled by {scale:.2}"
            );
            sizes.idle = shrink(sizes.idle);
            sizes.half = shrink(sizes.half);
            sizes.trickle = shrink(sizes.trickle);
            sizes.deaf = shrink(sizes.deaf);
        }
        sizes
    }

    fn connections(&self) -> usize {
        self.idle + self.half + self.trickle + self.deaf
    }
}

/// The soft limit on open files, from /proc/self/limits.
fn open_files_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let soft = line["Max open files".len()..]
        .split_whitespace()
        .next()
        .expect("a soft limit");
    soft.parse().unwrap_or(usize::MAX) // "unlimited"
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Resident memory, from /proc/self/statm (pages).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// The server's side of connections to `port`, from the kernel's table: sockets with that
/// local port that are neither listening nor in TIME_WAIT (which holds no descriptor), as
/// (accepted by the server, still waiting in the listen backlog). A socket not yet accepted
/// belongs to no process, which the table shows as inode 0.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Sockets {
    accepted: usize,
    waiting: usize,
}

fn server_sockets(port: u16) -> Sockets {
    let mut n = Sockets::default();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (cols.get(1), cols.get(3), cols.get(9))
            else {
                continue;
            };
            let local_port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port != Some(port) || *state == "0A" || *state == "06" {
                continue;
            }
            if *inode == "0" {
                n.waiting += 1;
            } else {
                n.accepted += 1;
            }
        }
    }
    n
}

/// actix keeps its limit on handshakes in progress per process, not per server: the last
/// server started sets it for workers started after. `serve` starts one HTTPS server; these
/// tests, which start servers with different bounds, take turns.
static ONE_SERVER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A TLS record header announcing 512 bytes of handshake, and the start of a ClientHello: a
/// server must wait for the rest.
const HALF_CLIENT_HELLO: [u8; 10] = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03];

/// The most bytes waiting in the send queue of any of the server's sockets on `port`.
fn largest_send_queue(port: u16) -> usize {
    let text = std::fs::read_to_string("/proc/self/net/tcp").unwrap_or_default()
        + &std::fs::read_to_string("/proc/self/net/tcp6").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local_port = cols
                .get(1)?
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())?;
            let tx = cols.get(4)?.split_once(':')?.0;
            (local_port == port).then(|| usize::from_str_radix(tx, 16).ok())?
        })
        .max()
        .unwrap_or(0)
}

/// What the abusers did, for the report: connections opened, and how many of them the
/// server ended.
#[derive(Default)]
struct Tally {
    opened: AtomicU64,
    ended_by_server: AtomicU64,
    connect_failures: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// Finishes the TLS handshake and sends nothing.
    Idle,
    /// Finishes one review, then keeps the connection open without another.
    IdleAfterReview,
    /// Sends the first bytes of a ClientHello and nothing more.
    HalfHandshake,
    /// A review whose body comes a byte at a time.
    TrickleBody,
    /// A review whose head comes a byte at a time.
    TrickleHead,
    /// Sends pipelined reviews and never reads.
    Deaf,
}

struct Abuse {
    addr: SocketAddr,
    tls: TlsConnector,
    review: Vec<u8>,
    trickle_every: Duration,
    tallies: Vec<(Kind, Tally)>,
}

impl Abuse {
    fn tally(&self, kind: Kind) -> &Tally {
        &self.tallies.iter().find(|(k, _)| *k == kind).unwrap().1
    }

    fn head(&self) -> String {
        format!(
            "POST {MUTATE_JOB_PATH} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.review.len()
        )
    }

    async fn tls(&self) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        self.tls
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }

    /// One connection of its kind, held until the server ends it. `Err` when it could not
    /// even be opened.
    async fn once(&self, kind: Kind) -> std::io::Result<()> {
        let mut buf = vec![0u8; 16 * 1024];
        match kind {
            Kind::HalfHandshake => {
                let mut tcp = TcpStream::connect(self.addr).await?;
                tcp.write_all(&HALF_CLIENT_HELLO).await?;
                self.tally(kind).opened.fetch_add(1, Ordering::Relaxed);
                while tcp.read(&mut buf).await.unwrap_or(0) > 0 {}
            }
            Kind::Idle => {
                let mut tls = self.tls().await?;
                self.tally(kind).opened.fetch_add(1, Ordering::Relaxed);
                while tls.read(&mut buf).await.unwrap_or(0) > 0 {}
            }
            Kind::IdleAfterReview => {
                let mut tls = self.tls().await?;
                self.tally(kind).opened.fetch_add(1, Ordering::Relaxed);
                tls.write_all(self.head().as_bytes()).await?;
                tls.write_all(&self.review).await?;
                // Whatever the reply, the connection then idles until the server ends it.
                while tls.read(&mut buf).await.unwrap_or(0) > 0 {}
            }
            Kind::TrickleBody | Kind::TrickleHead => {
                let tls = self.tls().await?;
                self.tally(kind).opened.fetch_add(1, Ordering::Relaxed);
                let (mut rd, mut wr) = tokio::io::split(tls);
                let mut bytes = self.head().into_bytes();
                let mut sent = 0;
                if kind == Kind::TrickleBody {
                    wr.write_all(&bytes).await?;
                    sent = bytes.len();
                }
                bytes.extend_from_slice(&self.review);
                let every = self.trickle_every;
                let trickle = async move {
                    for b in &bytes[sent..] {
                        if wr.write_all(&[*b]).await.is_err() || wr.flush().await.is_err() {
                            return;
                        }
                        tokio::time::sleep(every).await;
                    }
                    // All sent (only with a short pause): wait for the server to end it.
                    std::future::pending::<()>().await
                };
                let read = async { while rd.read(&mut buf).await.unwrap_or(0) > 0 {} };
                tokio::select! {
                    _ = trickle => {}
                    _ = read => {}
                }
            }
            Kind::Deaf => {
                let mut tls = self.tls().await?;
                self.tally(kind).opened.fetch_add(1, Ordering::Relaxed);
                let mut request = self.head().into_bytes();
                request.extend_from_slice(&self.review);
                // Until the buffers on both sides are full and the write blocks, then held.
                while tls.write_all(&request).await.is_ok() {}
            }
        }
        self.tally(kind)
            .ended_by_server
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Keeps one connection of `kind` open until `until`, opening a new one whenever the
    /// server ends the last.
    async fn run(self: Arc<Self>, kind: Kind, until: tokio::time::Instant) {
        let keep = async {
            loop {
                if self.once(kind).await.is_err() {
                    self.tally(kind)
                        .connect_failures
                        .fetch_add(1, Ordering::Relaxed);
                    // Not a pause to wait something out: it keeps a refused abuser from
                    // spinning on the CPU the server needs.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        tokio::select! {
            _ = keep => {}
            _ = tokio::time::sleep_until(until) => {}
        }
    }
}

/// One timed exchange of the normal client.
struct Sample {
    at: Instant,
    latency: Duration,
    ok: bool,
}

/// What the normal client does, each on a thread and a runtime of its own so that neither
/// the abusers' tasks nor another part of the normal client delay its timing.
#[derive(Clone, Copy)]
enum Exchange {
    /// A review every [`REVIEW_EVERY`] on one kept-alive connection, as kube-apiserver sends.
    KeptAlive,
    /// A review on a new connection every [`FRESH_EVERY`]: the API server opens new ones too.
    Fresh,
    /// `/healthz` and `/readyz` every [`PROBE_EVERY`], each on a new connection as the
    /// kubelet asks.
    Probes,
}

/// Runs `what` until `stop` is set; returns its samples and its first failure.
fn normal_client(
    what: Exchange,
    https: SocketAddr,
    probes: SocketAddr,
    tls: TlsConnector,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(Vec<Sample>, Option<String>)> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let review = fixture(FIXTURE);
            let mut samples = Vec::new();
            let mut first_error = None;
            let mut conn = match what {
                Exchange::KeptAlive => Some(
                    common::tls_client::connect(&tls, https, "localhost")
                        .await
                        .expect("the normal client connects"),
                ),
                _ => None,
            };
            let every = match what {
                Exchange::KeptAlive => REVIEW_EVERY,
                Exchange::Fresh => FRESH_EVERY,
                Exchange::Probes => PROBE_EVERY,
            };
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Far past any bound asserted: a hang is recorded as a failure, not waited out.
            let limit = Duration::from_secs(10);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let at = Instant::now();
                let failure = match (what, conn.as_mut()) {
                    (Exchange::KeptAlive, Some(conn)) => {
                        let r = tokio::time::timeout(
                            limit,
                            conn.post_json(MUTATE_JOB_PATH, review.clone()),
                        )
                        .await;
                        match r {
                            Ok((200, body)) if allowed(&body) => None,
                            other => Some(format!("kept-alive review: {other:?}")),
                        }
                    }
                    (Exchange::Fresh, _) => {
                        let r = tokio::time::timeout(limit, async {
                            let mut c =
                                common::tls_client::connect(&tls, https, "localhost").await?;
                            std::io::Result::Ok(c.post_json(MUTATE_JOB_PATH, review.clone()).await)
                        })
                        .await;
                        match r {
                            Ok(Ok((200, body))) if allowed(&body) => None,
                            other => Some(format!("fresh-connection review: {other:?}")),
                        }
                    }
                    _ => {
                        let mut failure = None;
                        for path in ["/healthz", "/readyz"] {
                            let r =
                                tokio::time::timeout(limit, common::probe_get(probes, path)).await;
                            if !matches!(r, Ok((200, _))) {
                                failure = Some(format!("{path}: {r:?}"));
                            }
                        }
                        failure
                    }
                };
                samples.push(Sample {
                    at,
                    latency: at.elapsed(),
                    ok: failure.is_none(),
                });
                if first_error.is_none() {
                    first_error = failure;
                }
            }
            (samples, first_error)
        })
    })
}

fn allowed(reply: &[u8]) -> bool {
    reply.windows(14).any(|w| w == b"\"allowed\":true")
}

/// Latency figures of the samples taken in `[from, to)`.
struct Latency {
    count: usize,
    failed: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

impl Latency {
    fn of(samples: &[Sample], from: Instant, to: Instant) -> Self {
        let within: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.at >= from && s.at < to)
            .collect();
        let mut l: Vec<Duration> = within.iter().map(|s| s.latency).collect();
        l.sort_unstable();
        let pct = |q: f64| {
            if l.is_empty() {
                return Duration::ZERO;
            }
            l[((q * l.len() as f64).ceil() as usize).clamp(1, l.len()) - 1]
        };
        Self {
            count: within.len(),
            failed: within.iter().filter(|s| !s.ok).count(),
            p50: pct(0.50),
            p99: pct(0.99),
            max: pct(1.0),
        }
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} failed): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.count,
            self.failed,
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.max.as_secs_f64() * 1e3
        )
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Polls `check` every 100 ms until it holds or `limit` passes; returns whether it held.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One round of abuse and what the process held before, during and after it.
struct Round {
    started: Instant,
    ended: Instant,
    fds: [usize; 3],
    sockets: [Sockets; 3],
    rss: [u64; 3],
    /// Whether the descriptors and sockets came back within [`RELEASE_WITHIN`].
    released: bool,
    settled: Duration,
    tallies: Vec<(Kind, [u64; 3])>,
}

/// How long the server may take to let go of the abusers' connections once they are gone.
const RELEASE_WITHIN: Duration = Duration::from_secs(15);

async fn round(sizes: &Sizes, addr: SocketAddr, tls: &TlsConnector) -> Round {
    let port = addr.port();
    let fds_before = open_fds();
    let sockets_before = server_sockets(port);
    let rss_before = rss_bytes();

    let started = Instant::now();
    let until = tokio::time::Instant::now() + Duration::from_secs(sizes.seconds);
    let kinds: Vec<(Kind, usize)> = vec![
        (Kind::Idle, sizes.idle - sizes.idle / 2),
        (Kind::IdleAfterReview, sizes.idle / 2),
        (Kind::HalfHandshake, sizes.half),
        (Kind::TrickleBody, sizes.trickle - sizes.trickle / 2),
        (Kind::TrickleHead, sizes.trickle / 2),
        (Kind::Deaf, sizes.deaf),
    ];
    let abuse = Arc::new(Abuse {
        addr,
        tls: tls.clone(),
        review: fixture(FIXTURE),
        trickle_every: sizes.trickle_every,
        tallies: kinds.iter().map(|(k, _)| (*k, Tally::default())).collect(),
    });
    let mut abusers = Vec::new();
    for (kind, n) in &kinds {
        for _ in 0..*n {
            abusers.push(tokio::spawn(abuse.clone().run(*kind, until)));
        }
    }

    // Peaks while the abuse lasts, sampled every 100 ms.
    let (mut fds_peak, mut rss_peak) = (0, 0);
    let mut sockets_peak = Sockets::default();
    while tokio::time::Instant::now() < until {
        fds_peak = fds_peak.max(open_fds());
        let now = server_sockets(port);
        sockets_peak.accepted = sockets_peak.accepted.max(now.accepted);
        sockets_peak.waiting = sockets_peak.waiting.max(now.waiting);
        rss_peak = rss_peak.max(rss_bytes());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for a in abusers {
        a.await.unwrap();
    }
    let ended = Instant::now();

    // The abusers are gone: the server must let go of their connections promptly.
    let released = eventually(RELEASE_WITHIN, || {
        let now = server_sockets(port);
        open_fds() <= fds_before + 8
            && now.accepted <= sockets_before.accepted + 2
            && now.waiting == 0
    })
    .await;
    let settled = ended.elapsed();
    let tallies = abuse
        .tallies
        .iter()
        .map(|(k, t)| {
            (
                *k,
                [
                    t.opened.load(Ordering::Relaxed),
                    t.ended_by_server.load(Ordering::Relaxed),
                    t.connect_failures.load(Ordering::Relaxed),
                ],
            )
        })
        .collect();
    Round {
        started,
        ended,
        fds: [fds_before, fds_peak, open_fds()],
        sockets: [sockets_before, sockets_peak, server_sockets(port)],
        rss: [rss_before, rss_peak, rss_bytes()],
        released,
        settled,
        tallies,
    }
}

/// Two rounds: the second shows whether what the first left behind is reused or piles up.
const ROUNDS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abusers_neither_slow_the_normal_client_nor_keep_what_they_took() {
    let _turn = ONE_SERVER_AT_A_TIME.lock().await;
    switchyard::install_crypto_provider();
    let sizes = Sizes::from_env();
    let dir = tempfile::tempdir().unwrap();
    // The server as `serve` runs it by default, with the 2 workers of the 2-core machine.
    let running =
        switchyard::server::start(ServeSettings::for_tests(TlsSource::Dev(dir.path().into())))
            .await
            .expect("server starts");
    let tls = common::tls_client::connector_from_dir(dir.path());

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let normal: Vec<_> = [Exchange::KeptAlive, Exchange::Fresh, Exchange::Probes]
        .into_iter()
        .map(|what| {
            normal_client(
                what,
                running.https_addr,
                running.probe_addr,
                tls.clone(),
                stop.clone(),
            )
        })
        .collect();
    tokio::time::sleep(BASELINE).await;
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        rounds.push(round(&sizes, running.https_addr, &tls).await);
    }
    stop.store(true, Ordering::Relaxed);
    let mut normal: Vec<(Vec<Sample>, Option<String>)> = normal
        .into_iter()
        .map(|t| t.join().expect("normal client"))
        .collect();
    let first_error = normal.iter_mut().find_map(|(_, e)| e.take());

    println!(
        "abuse, {ROUNDS} rounds of {} s: {} idle, {} half handshakes, {} trickles (a byte every {:?}), {} deaf",
        sizes.seconds, sizes.idle, sizes.half, sizes.trickle, sizes.trickle_every, sizes.deaf
    );
    let first = rounds[0].started;
    println!(
        "reviews, kept-alive, before the abuse: {}",
        Latency::of(&normal[0].0, first - BASELINE, first)
    );
    let mut worst = Duration::ZERO;
    for (i, r) in rounds.iter().enumerate() {
        println!("round {}:", i + 1);
        for (kind, [opened, ended, failed]) in &r.tallies {
            println!(
                "  {kind:?}: {opened} connections, {ended} ended by the server, {failed} failed to connect"
            );
        }
        let reviews = Latency::of(&normal[0].0, r.started, r.ended);
        println!("  reviews, kept-alive, under abuse: {reviews}");
        println!(
            "  reviews, fresh connection, under abuse: {}",
            Latency::of(&normal[1].0, r.started, r.ended)
        );
        println!(
            "  probes under abuse: {}",
            Latency::of(&normal[2].0, r.started, r.ended)
        );
        println!(
            "  fds: {} before, {} peak, {} after ({:.1} s after the abusers left)",
            r.fds[0],
            r.fds[1],
            r.fds[2],
            r.settled.as_secs_f64()
        );
        println!(
            "  server sockets (accepted, waiting in the backlog): {:?} before, {:?} peak, {:?} after",
            r.sockets[0], r.sockets[1], r.sockets[2]
        );
        println!(
            "  RSS: {:.1} MiB before, {:.1} MiB peak, {:.1} MiB after",
            mib(r.rss[0]),
            mib(r.rss[1]),
            mib(r.rss[2])
        );
        worst = worst.max(reviews.max);
    }
    if let Some(e) = &first_error {
        println!("first error of the normal client: {e}");
    }

    let (start, end) = (first, rounds[ROUNDS - 1].ended);
    let reviews = Latency::of(&normal[0].0, start, end);
    let fresh = Latency::of(&normal[1].0, start, end);
    let probes = Latency::of(&normal[2].0, start, end);
    assert!(
        reviews.count > 100 && probes.count > 10,
        "the normal client barely ran: {reviews}; probes {probes}"
    );
    assert_eq!(
        (reviews.failed, probes.failed, fresh.failed),
        (0, 0, 0),
        "every review and probe answers under abuse; first error: {first_error:?}"
    );
    // The bound, on the 2-core machine in a release build. The CI size runs a debug
    // build on a machine shared with other builds, so it checks only that nothing waits on
    // the abusers: a stalled accept or a worker stuck behind a slow client costs seconds.
    let p99_bound = if sizes.full {
        Duration::from_millis(50)
    } else {
        Duration::from_millis(500)
    };
    for (i, r) in rounds.iter().enumerate() {
        let reviews = Latency::of(&normal[0].0, r.started, r.ended);
        assert!(
            reviews.p99 < p99_bound,
            "round {}: reviews under abuse: {reviews}; bound p99 < {p99_bound:?}",
            i + 1
        );
        assert!(
            r.released,
            "round {}: descriptors or sockets not released within {RELEASE_WITHIN:?}: fds {:?}, server sockets {:?} (before, peak, after)",
            i + 1,
            r.fds,
            r.sockets
        );
    }
    // Bounded: no round grows the process by more than a fixed part and 256 KiB a connection
    // held (both ends are in this process; the full size measured about 110 KiB).
    let rss_start = rounds[0].rss[0];
    let growth = rounds.iter().map(|r| r.rss[1]).max().unwrap() - rss_start;
    let allowed = (32 << 20) + 256 * 1024 * sizes.connections() as u64;
    assert!(
        growth <= allowed,
        "RSS grew {:.1} MiB under abuse, over {:.1} MiB",
        mib(growth),
        mib(allowed)
    );
    // Not piling up: after the last round the process is no larger than one round needed. The
    // allocator hands memory back when it chooses, so "after" moves by tens of MiB between runs
    // (178 and 208 MiB after two full-size runs; in a debug build at CI size once 105.9 MiB
    // after the last round against a first peak of 91.3 MiB, other runs under it); a quarter
    // over the first round's peak covers that. What a connection keeps is bounded above.
    let (first_peak, after_last) = (rounds[0].rss[1], rounds[ROUNDS - 1].rss[2]);
    assert!(
        after_last <= first_peak + first_peak / 4,
        "RSS {:.1} MiB after the last round, over the first round's peak of {:.1} MiB",
        mib(after_last),
        mib(first_peak)
    );
    running.shutdown().await;
}

/// `maxConnections` bounds what the server holds: past it, connections wait in the listen
/// backlog, holding no descriptor of the server's, and are served once the holders go. Half
/// handshakes get the same bound as any other connection, not a smaller one of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_max_connections_wait_in_the_backlog() {
    let _turn = ONE_SERVER_AT_A_TIME.lock().await;
    switchyard::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = ServeSettings::for_tests(TlsSource::Dev(dir.path().into()));
    settings.max_connections = 16;
    let running = switchyard::server::start(settings).await.unwrap();
    let port = running.https_addr.port();
    let mut held = Vec::new();
    for _ in 0..48 {
        let mut tcp = TcpStream::connect(running.https_addr).await.unwrap();
        tcp.write_all(&HALF_CLIENT_HELLO).await.unwrap();
        held.push(tcp);
    }
    // Within the 5 s handshake timeout, which would let the first ones go.
    let bounded = eventually(Duration::from_secs(3), || {
        let now = server_sockets(port);
        now.accepted + now.waiting == 48 && now.waiting >= 32
    })
    .await;
    let now = server_sockets(port);
    assert!(bounded, "16 connections held, 32 waiting; got {now:?}");
    assert!(now.accepted <= 16, "{now:?}");
    let (status, _) = common::probe_get(running.probe_addr, "/healthz").await;
    assert_eq!(status, 200, "the probes are not behind the HTTPS bound");

    drop(held);
    let tls = common::tls_client::connector_from_dir(dir.path());
    let served = tokio::time::timeout(Duration::from_secs(5), async {
        let mut c = common::tls_client::connect(&tls, running.https_addr, "localhost").await?;
        std::io::Result::Ok(c.post_json(MUTATE_JOB_PATH, fixture(FIXTURE)).await.0)
    })
    .await;
    assert!(matches!(served, Ok(Ok(200))), "{served:?}");
    running.shutdown().await;
}

/// Half-finished handshakes past actix's own limit on handshakes in progress (256 a worker)
/// must not stop new connections: kube-apiserver opens new ones too. With that limit, a new
/// connection waited for the 5 s handshake timeout to free a place (5 - 9 s in the full
/// campaign).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_handshakes_past_actix_own_limit_do_not_stop_new_connections() {
    let _turn = ONE_SERVER_AT_A_TIME.lock().await;
    const HALF: usize = 600;
    if open_files_limit() < 3 * HALF {
        eprintln!(
            "half handshakes: open files limit {} is below the {} this test needs; not run",
            open_files_limit(),
            3 * HALF
        );
        return;
    }
    switchyard::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let running =
        switchyard::server::start(ServeSettings::for_tests(TlsSource::Dev(dir.path().into())))
            .await
            .unwrap();
    let port = running.https_addr.port();
    let mut held = Vec::new();
    for _ in 0..HALF {
        let mut tcp = TcpStream::connect(running.https_addr).await.unwrap();
        tcp.write_all(&HALF_CLIENT_HELLO).await.unwrap();
        held.push(tcp);
    }
    let all_in = eventually(Duration::from_secs(2), || {
        server_sockets(port).accepted >= HALF
    })
    .await;
    assert!(all_in, "{:?}", server_sockets(port));

    let tls = common::tls_client::connector_from_dir(dir.path());
    let asked = Instant::now();
    let served = tokio::time::timeout(Duration::from_secs(2), async {
        let mut c = common::tls_client::connect(&tls, running.https_addr, "localhost").await?;
        std::io::Result::Ok(c.post_json(MUTATE_JOB_PATH, fixture(FIXTURE)).await.0)
    })
    .await;
    assert!(
        matches!(served, Ok(Ok(200))),
        "a new connection behind {HALF} half handshakes: {served:?} after {:?}",
        asked.elapsed()
    );
    drop(held);
    running.shutdown().await;
}

/// A client that sends reviews and never reads a reply gets answers only until its
/// connection's send buffer is full, and that buffer is bounded: left to autotuning it grew to
/// 4 MiB, and the server answered about 10,000 reviews for nobody before the writes stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_fills_a_bounded_send_buffer() {
    let _turn = ONE_SERVER_AT_A_TIME.lock().await;
    switchyard::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let running =
        switchyard::server::start(ServeSettings::for_tests(TlsSource::Dev(dir.path().into())))
            .await
            .unwrap();
    let port = running.https_addr.port();
    let tls = common::tls_client::connector_from_dir(dir.path());
    let tcp = TcpStream::connect(running.https_addr).await.unwrap();
    let mut deaf = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let review = fixture(FIXTURE);
    let mut request = format!(
        "POST {MUTATE_JOB_PATH} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        review.len()
    )
    .into_bytes();
    request.extend_from_slice(&review);

    // Written until a write waits a whole second (both sides' buffers are full), or until the
    // server ends the connection (which bounds what it holds for the client as well).
    let started = Instant::now();
    let mut sent = 0usize;
    let (blocked, closed) = loop {
        match tokio::time::timeout(Duration::from_secs(1), deaf.write_all(&request)).await {
            Err(_) => break (true, false),
            Ok(Ok(())) => {}
            Ok(Err(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionAborted
                ) =>
            {
                break (false, true)
            }
            Ok(Err(e)) => panic!("writing to the server: {e}"),
        }
        sent += 1;
        if started.elapsed() > Duration::from_secs(60) {
            break (false, false);
        }
    };
    let queued = if closed { 0 } else { largest_send_queue(port) };
    println!("never reading: {sent} reviews sent before the writes stopped (server closed: {closed}); {queued} bytes queued by the server");
    assert!(
        blocked || closed,
        "{sent} reviews in 60 s and the writes never stopped"
    );
    assert!(
        queued <= 1024 * 1024,
        "the server queued {queued} bytes of replies for a client that reads none"
    );
    drop(deaf);
    running.shutdown().await;
}
