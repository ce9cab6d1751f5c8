//! The fuzzing campaign: every HTTP surface of the real server (`switchyard serve`, the binary,
//! in a process of its own: the webhooks and the extender over HTTPS, the probes over HTTP)
//! fed generated bodies on kept-alive connections, as many as asked. Each body is one of the real captures (tests/fixtures) changed field by
//! field (wrong types, huge and negative numbers, deep nesting, odd Unicode, duplicate keys,
//! quantities at their limits, long lists, removed fields), a capture with bytes flipped or cut,
//! or random bytes. Nothing may panic, hang or answer 5xx (every body is the client's doing),
//! and the server's heap (its `/metrics`) after the campaign is within 10 % of before. The
//! server runs `--standalone` (no API server): bind answers with the error it would give then.
//!
//!     cargo test --test fuzz_campaign -- --nocapture                  # CI: 300 bodies per endpoint
//!     SWITCHYARD_FUZZ_BODIES=1000000 SWITCHYARD_FUZZ_SETTLE_SECS=310 \
//!         cargo test --release --test fuzz_campaign -- --nocapture
//!
//! Body `i` of an endpoint depends only on the seed, the endpoint and `i`: a failure prints
//! them, and `SWITCHYARD_FUZZ_SEED=S SWITCHYARD_FUZZ_ONLY=endpoint:i` replays that body alone.
//! `SWITCHYARD_FUZZ_ENDPOINTS=mutate,bind` runs only those endpoints (names as printed), and
//! `SWITCHYARD_FUZZ_CONNECTIONS` sets the connections per endpoint (3).

mod common;

use common::tls_client::{connect, connector_from_dir, Connection};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard::rng::Rng;
use tokio_rustls::TlsConnector;

/// A reply slower than this is a hang.
const REPLY_WITHIN: Duration = Duration::from_secs(10);
/// Connections per endpoint, each sending its share of the bodies in turn.
const CONNECTIONS: usize = 3;
fn connections() -> usize {
    env_u64("SWITCHYARD_FUZZ_CONNECTIONS", CONNECTIONS as u64) as usize
}
/// The server's body limit in this campaign: small, so that oversized bodies are cheap.
const LIMIT: usize = 256 * 1024;

const INVENTORY: &str = r#"
clusters:
  - name: local
    nodes:
      - name: node-gpu-1
        allocatable: {cpu: "32", memory: 128Gi, nvidia.com/gpu: "4", pods: "110"}
        topology:
          attributes:
            - {name: topologyManagerPolicy, value: single-numa-node}
          zones:
            - {name: node-0, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}]}
            - {name: node-1, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}]}
      - name: node-gpu-2
        allocatable: {cpu: "32", memory: 128Gi, nvidia.com/gpu: "4", pods: "110"}
        requested: {nvidia.com/gpu: "2"}
  - name: eu-1
    nodes:
      - {name: eu-1-a, allocatable: {cpu: "64", memory: 256Gi, nvidia.com/gpu: "8", pods: "110"}}
"#;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn read_json(path: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One HTTP surface and the captures its bodies are made from.
struct Endpoint {
    name: &'static str,
    path: &'static str,
    /// Over HTTPS (a POST of a body) or to the probe port (a GET, the path fuzzed instead).
    probe: bool,
    seeds: Vec<Value>,
}

fn endpoints() -> Vec<Endpoint> {
    let admission = |names: &[&str]| -> Vec<Value> {
        names
            .iter()
            .map(|n| common::fixture_json(n))
            .collect::<Vec<_>>()
    };
    let extender = |n: &str| read_json(&format!("tests/fixtures/extender/{n}.json"));
    vec![
        Endpoint {
            name: "mutate",
            path: "/mutate-batch-v1-job",
            probe: false,
            seeds: admission(&[
                "admission-mutate-create-basic",
                "mutate-create-unknown-fields",
                "mutate-create-default-namespace",
                "mutate-create-generate-name",
            ]),
        },
        Endpoint {
            name: "validate",
            path: "/validate-batch-v1-job",
            probe: false,
            seeds: admission(&[
                "admission-validate-create-basic",
                "admission-validate-update-unsuspend-alice",
                "validate-update-relabel-running",
                "validate-update-status-subresource",
            ]),
        },
        Endpoint {
            name: "mutate-jobset",
            path: "/mutate-jobset-x-k8s-io-v1alpha2-jobset",
            probe: false,
            seeds: admission(&[
                "jobset/mutate-create-queued",
                "jobset/mutate-create-no-queue",
                "jobset/mutate-update-unsuspend-by-user",
            ]),
        },
        Endpoint {
            name: "validate-jobset",
            path: "/validate-jobset-x-k8s-io-v1alpha2-jobset",
            probe: false,
            seeds: admission(&[
                "jobset/validate-create-queued",
                "jobset/validate-update-unsuspend-by-user",
                "jobset/validate-update-unsuspend-by-dispatcher",
                "jobset/validate-update-status-by-dispatcher",
            ]),
        },
        Endpoint {
            name: "filter",
            path: "/scheduler/filter",
            probe: false,
            seeds: vec![
                extender("extender-filter-nodenames"),
                extender("extender-filter-nodes"),
            ],
        },
        Endpoint {
            name: "prioritize",
            path: "/scheduler/prioritize",
            probe: false,
            seeds: vec![extender("extender-prioritize-nodenames-guaranteed")],
        },
        Endpoint {
            name: "bind",
            path: "/scheduler/bind",
            probe: false,
            seeds: vec![extender("extender-bind")],
        },
        Endpoint {
            name: "probes",
            path: "/healthz",
            probe: true,
            seeds: Vec::new(),
        },
    ]
}

// ---------------------------------------------------------------------------------------
// Bodies

/// Strings that parsers, escapers and quantity readers get wrong.
const ODD_STRINGS: &[&str] = &[
    "",
    " ",
    "\u{0}",
    "a\u{0}b",
    "\u{202e}gnp.exe",
    "\u{feff}",
    "e\u{301}\u{301}\u{301}",
    "👩‍👩‍👧‍👦",
    "\u{10ffff}",
    "\\",
    "\"",
    "\n\r\t",
    "%00",
    "../../etc/passwd",
    "switchyard.dev/queue-name",
    "kube-system",
];

/// Quantities at and past their limits, and text that only looks like one.
const QUANTITIES: &[&str] = &[
    "0",
    "-1",
    "-0",
    "1e18",
    "1E308",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "99999999999999999999999Ki",
    "8Ei",
    "1.5Ei",
    "0.000000001",
    "1n",
    "1m",
    "+1",
    ".5",
    "5.",
    "1.5.5",
    "1Gb",
    "NaN",
    "Infinity",
    "0x10",
    "1 Gi",
];

/// Numbers of every awkward kind, written as JSON text (some past what f64 or i64 hold).
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "2147483648",
    "-2147483649",
    "9223372036854775807",
    "18446744073709551616",
    "-9223372036854775809",
    "1e308",
    "1e400",
    "-1e400",
    "1.0000000000000002",
    "5e-324",
    "123456789012345678901234567890",
];

fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[rng.below(items.len() as u64) as usize]
}

/// A value of another kind than `v`, or an awkward one of the same.
fn wrong_value(rng: &mut Rng, v: &Value) -> Value {
    match rng.below(7) {
        0 => Value::Null,
        1 => json!(rng.chance(0.5)),
        2 => json!([v.clone()]),
        3 => json!({"x": v.clone()}),
        4 => json!(pick(rng, ODD_STRINGS)),
        5 => json!(pick(rng, QUANTITIES)),
        _ => match v {
            Value::String(_) => json!(rng.below(1 << 40) as i64 - (1 << 39)),
            _ => json!(v.to_string()),
        },
    }
}

/// A marker replaced after serializing by number text serde_json cannot hold.
const NUMBER_MARK: &str = "\u{1}number\u{1}";

/// A marker replaced after serializing by arrays nested from a little to far past any
/// parser's recursion limit (written as text: a `Value` that deep would overflow the test's
/// own stack when dropped).
const DEEP_MARK: &str = "\u{1}deep\u{1}";

/// One field-level change at a random place of `v`.
fn mutate(rng: &mut Rng, v: &mut Value) {
    let mut all = Vec::new();
    common::pointers(v, String::new(), &mut all);
    let at = pick(rng, &all).clone();
    let Some(slot) = v.pointer_mut(&at) else {
        return;
    };
    match rng.below(8) {
        0 | 1 => *slot = wrong_value(rng, slot),
        2 => *slot = json!(NUMBER_MARK),
        3 => *slot = json!(DEEP_MARK),
        4 => *slot = json!(pick(rng, QUANTITIES)),
        5 => *slot = json!(pick(rng, ODD_STRINGS)),
        6 => {
            // A long list of what is there (node names, containers, conditions, ...).
            // As long as fits in about twice the body limit: longer only costs the client.
            let each = serde_json::to_vec(slot).map_or(1, |b| b.len() + 1);
            let n = [10, 1_000, 5_000][rng.below(3) as usize].min(2 * LIMIT / each + 1);
            *slot = Value::Array(vec![slot.clone(); n]);
        }
        _ => {
            if let Some((parent, key)) = at.rsplit_once('/') {
                if let Some(Value::Object(m)) = v.pointer_mut(parent) {
                    m.remove(&key.replace("~1", "/").replace("~0", "~"));
                }
            }
        }
    }
}

/// Text-level changes that a JSON value cannot express: duplicate keys, numbers past f64.
fn textual(rng: &mut Rng, text: String) -> Vec<u8> {
    // One pass each: a long list may hold thousands of marks.
    let mut text = replace_marks(&text, NUMBER_MARK, || pick(rng, NUMBERS).to_string());
    text = replace_marks(&text, DEEP_MARK, || {
        let depth = [2, 64, 127, 128, 129, 1_000, 20_000][rng.below(7) as usize];
        "[".repeat(depth) + "0" + &"]".repeat(depth)
    });
    if rng.chance(0.3) {
        // The same key twice in some object: serde keeps the last, Go the last too.
        let objects: Vec<usize> = text.match_indices("{\"").map(|(i, _)| i).collect();
        if !objects.is_empty() {
            let at = *pick(rng, &objects) + 1;
            let key = [
                "kind",
                "metadata",
                "spec",
                "uid",
                "Pod",
                "NodeNames",
                "Node",
            ][rng.below(7) as usize];
            let value = [r#"null"#, r#""x""#, r#"{}"#, r#"[]"#, r#"1"#][rng.below(5) as usize];
            text.insert_str(at, &format!("\"{key}\":{value},"));
        }
    }
    text.into_bytes()
}

/// `text` with each JSON string `mark` replaced by what `with` gives.
fn replace_marks(text: &str, mark: &str, mut with: impl FnMut() -> String) -> String {
    let mark = serde_json::to_string(mark).unwrap();
    let mut parts = text.split(&mark);
    let mut out = String::with_capacity(text.len());
    out.push_str(parts.next().unwrap_or_default());
    for rest in parts {
        out.push_str(&with());
        out.push_str(rest);
    }
    out
}

/// Body `i` of an endpoint.
fn body(seed: u64, endpoint: &Endpoint, i: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ fxhash(endpoint.name) ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let seed_json = pick(&mut rng, &endpoint.seeds).clone();
    match rng.below(10) {
        // Random bytes.
        0 => (0..rng.below(4096)).map(|_| rng.below(256) as u8).collect(),
        // A capture with bytes flipped or cut.
        1 => {
            let mut b = serde_json::to_vec(&seed_json).unwrap();
            for _ in 0..=rng.below(4) {
                let n = b.len() as u64;
                if rng.chance(0.5) {
                    b[rng.below(n) as usize] ^= rng.below(255) as u8 + 1;
                } else {
                    b.truncate(rng.below(n) as usize);
                }
                if b.is_empty() {
                    break;
                }
            }
            b
        }
        // A capture changed field by field.
        _ => {
            let mut v = seed_json;
            for _ in 0..=rng.below(3) {
                mutate(&mut rng, &mut v);
            }
            textual(&mut rng, serde_json::to_string(&v).unwrap())
        }
    }
}

/// A probe request: a path near the probes' and a query, with some bytes of noise.
fn probe_path(seed: u64, i: u64) -> String {
    let mut rng = Rng::new(seed ^ fxhash("probes") ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let base = [
        "/healthz",
        "/readyz",
        "/metrics",
        "/",
        "/livez",
        "/healthz/",
    ][rng.below(6) as usize];
    let noise: String = (0..rng.below(40))
        .map(|_| {
            let c = b"abcXYZ019%/._~-?&=;+"[rng.below(20) as usize];
            c as char
        })
        .collect();
    match rng.below(3) {
        0 => base.to_string(),
        1 => format!("{base}?{noise}"),
        _ => format!("{base}{noise}"),
    }
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------------------
// The campaign

#[derive(Default)]
struct Tally {
    by_status: BTreeMap<u16, u64>,
    slowest: Duration,
    /// The body the slowest reply was to.
    slowest_at: u64,
    failures: Vec<String>,
}

/// `switchyard serve` in a child process, stopped when dropped.
struct Server {
    child: std::process::Child,
    https: SocketAddr,
    probe: SocketAddr,
    log: std::path::PathBuf,
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

impl Server {
    fn start(dir: &Path) -> Self {
        let inventory = dir.join("inventory.yaml");
        std::fs::write(&inventory, INVENTORY).unwrap();
        let config = dir.join("config.yaml");
        std::fs::write(&config, format!("maxReviewBytes: {LIMIT}\n")).unwrap();
        let (https, probe) = (free_port(), free_port());
        let log = dir.join("server.log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["serve", "--standalone", "--workers", "2", "--log", "warn"])
            .arg("--config")
            .arg(&config)
            .arg("--dev-tls")
            .arg(dir.join("pki"))
            .arg("--inventory")
            .arg(&inventory)
            .args(["--listen", &https.to_string()])
            .args(["--probe-listen", &probe.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("switchyard serve starts");
        let server = Server {
            child,
            https,
            probe,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(https).is_err()
            || std::net::TcpStream::connect(probe).is_err()
        {
            assert!(
                Instant::now() < deadline,
                "switchyard serve did not listen within 30 s: {}",
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// The server's resident memory, in bytes.
    fn rss(&self) -> u64 {
        let statm =
            std::fs::read_to_string(format!("/proc/{}/statm", self.child.id())).unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    /// The resident memory once the allocator has handed back what it keeps for a while: the
    /// lowest of a few looks. See [`settle`] for the traffic that must come first.
    async fn settled_rss(&self) -> u64 {
        let mut lowest = self.rss();
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            lowest = lowest.min(self.rss());
        }
        lowest
    }

    /// The live heap as the server's `/metrics` reports it.
    async fn heap(&self) -> u64 {
        let (status, text) = probe(self.probe, "/metrics")
            .await
            .expect("the server answers /metrics");
        assert_eq!(status, 200);
        String::from_utf8_lossy(&text)
            .lines()
            .find_map(|l| l.strip_prefix("switchyard_heap_allocated_bytes "))
            .and_then(|v| v.trim().parse().ok())
            .expect("/metrics has switchyard_heap_allocated_bytes")
    }

    /// The lines of the server's log that say something panicked.
    fn panics(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("panicked"))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends one body; `Err` says what went wrong in a line.
async fn exchange(
    conn: &mut Option<Connection>,
    tls: &TlsConnector,
    addr: SocketAddr,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, Vec<u8>), String> {
    if conn
        .as_mut()
        .is_none_or(|c| c.sender.is_closed() || !c.sender.is_ready())
    {
        *conn = Some(connect(tls, addr, "localhost").await.expect("connects"));
    }
    let c = conn.as_mut().expect("just connected");
    let req = hyper::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let send = async {
        c.sender.ready().await.map_err(|e| e.to_string())?;
        let res = c
            .sender
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        status_and_body(res).await
    };
    match tokio::time::timeout(REPLY_WITHIN, send).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => {
            *conn = None;
            Err(format!("no reply: {e}"))
        }
        Err(_) => {
            *conn = None;
            Err(format!("no reply within {REPLY_WITHIN:?}"))
        }
    }
}

/// A reply's status and whole body.
async fn status_and_body(
    res: hyper::Response<hyper::body::Incoming>,
) -> Result<(u16, Vec<u8>), String> {
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.map_err(|e| e.to_string())?;
    Ok((status, body.to_bytes().to_vec()))
}

async fn probe(addr: SocketAddr, path: &str) -> Result<(u16, Vec<u8>), String> {
    let get = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = hyper::Request::get(path)
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
        status_and_body(res).await
    };
    tokio::time::timeout(REPLY_WITHIN, get)
        .await
        .unwrap_or_else(|_| Err(format!("no reply within {REPLY_WITHIN:?}")))
}

/// What is wrong with a reply to a body of `endpoint`, if anything.
fn judge_reply(endpoint: &Endpoint, path: &str, status: u16, reply: &[u8]) -> Option<String> {
    if status >= 500 {
        return Some(format!(
            "answered {status}: {}",
            String::from_utf8_lossy(&reply[..reply.len().min(300)])
        ));
    }
    if endpoint.probe {
        // The probes answer their own paths; anything else is not found, never an error.
        let bare = path.split('?').next().unwrap_or_default();
        let known = ["/healthz", "/readyz", "/metrics"].contains(&bare);
        return match (known, status) {
            (true, 200) | (false, 404) => None,
            _ => Some(format!("{path} answered {status}")),
        };
    }
    if status == 200 {
        // Well-formed JSON. Numbers are scanned, not converted (a filter answer echoes the
        // nodes it was sent, numbers past f64 included, as kube-scheduler would never send
        // them); nesting past this checker's 128 levels is echoed input too (Go's decoder in
        // kube-scheduler takes 10,000).
        match serde_json::from_slice::<serde::de::IgnoredAny>(reply) {
            Ok(_) => {}
            Err(e) if e.to_string().starts_with("recursion limit exceeded") => {}
            Err(e) => {
                let text = String::from_utf8_lossy(reply);
                let at = e.column().saturating_sub(80).min(text.len());
                let near: String = text.chars().skip(at).take(160).collect();
                return Some(format!("a 200 whose body is not JSON ({e}): …{near}…"));
            }
        }
        let first = reply.iter().find(|b| !b.is_ascii_whitespace()).copied();
        let review = endpoint.path.starts_with("/mutate") || endpoint.path.starts_with("/validate");
        // Prioritize answers a HostPriorityList, filter and bind an object.
        let shaped = if review {
            serde_json::from_slice::<Value>(reply)
                .is_ok_and(|v| v["response"]["allowed"].is_boolean())
        } else if endpoint.path.ends_with("/prioritize") {
            first == Some(b'[')
        } else {
            first == Some(b'{')
        };
        if !shaped {
            return Some(format!(
                "a 200 that is no answer of {}: {}",
                endpoint.name,
                String::from_utf8_lossy(&reply[..reply.len().min(300)])
            ));
        }
    } else if reply.is_empty() {
        return Some(format!("a {status} without a reason"));
    }
    None
}

async fn run_endpoint(
    endpoint: Arc<Endpoint>,
    seed: u64,
    bodies: u64,
    only: Option<u64>,
    tls: TlsConnector,
    running: (SocketAddr, SocketAddr),
) -> Tally {
    let tallies = (0..connections() as u64).map(|k| {
        let (endpoint, tls) = (endpoint.clone(), tls.clone());
        tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut conn = None;
            let indexes: Box<dyn Iterator<Item = u64> + Send> = match only {
                Some(i) if k == 0 => Box::new(std::iter::once(i)),
                Some(_) => Box::new(std::iter::empty()),
                None => Box::new((k..bodies).step_by(connections())),
            };
            for i in indexes {
                let (path, result, took) = if endpoint.probe {
                    let path = probe_path(seed, i);
                    let started = Instant::now();
                    let r = probe(running.1, &path).await;
                    (path, r, started.elapsed())
                } else {
                    // Made off the runtime's threads, so that a long one delays no reply.
                    let e = endpoint.clone();
                    let b = tokio::task::spawn_blocking(move || body(seed, &e, i))
                        .await
                        .expect("a body is made");
                    let started = Instant::now();
                    let r = exchange(&mut conn, &tls, running.0, endpoint.path, b).await;
                    (endpoint.path.to_string(), r, started.elapsed())
                };
                if took > tally.slowest {
                    (tally.slowest, tally.slowest_at) = (took, i);
                }
                let wrong = match result {
                    Ok((status, reply)) => {
                        *tally.by_status.entry(status).or_default() += 1;
                        judge_reply(&endpoint, &path, status, &reply)
                    }
                    Err(e) => Some(e),
                };
                if let Some(what) = wrong {
                    tally.failures.push(format!(
                        "{}:{i} {what} (replay: SWITCHYARD_FUZZ_SEED={seed} SWITCHYARD_FUZZ_ONLY={}:{i})",
                        endpoint.name, endpoint.name
                    ));
                }
            }
            tally
        })
    });
    let mut total = Tally::default();
    for t in tallies.collect::<Vec<_>>() {
        let t = t.await.expect("a connection's task ends");
        for (s, n) in t.by_status {
            *total.by_status.entry(s).or_default() += n;
        }
        if t.slowest > total.slowest {
            (total.slowest, total.slowest_at) = (t.slowest, t.slowest_at);
        }
        total.failures.extend(t.failures);
    }
    total
}

/// The server's memory once what it freed has gone back to the system. mimalloc hands a
/// thread's freed pages back from that thread's next allocation, so a worker thread that went
/// idle right after the largest bodies keeps them (seen: 130 MiB resident for 20 s after the
/// warm-up, 80 MiB after the first few requests). A serving webhook is never idle for long: the
/// same few ordinary bodies on every endpoint, then a few looks.
///
/// `SWITCHYARD_FUZZ_SETTLE_SECS` waits that long first: past the extender's pod caches' 300 s,
/// the pods the campaign left in them are gone before and after alike, and the heap compares
/// the server's own state only (the full-size command sets it; CI does not wait).
async fn settle(
    server: &Server,
    endpoints: &[Arc<Endpoint>],
    tls: &TlsConnector,
    addrs: (SocketAddr, SocketAddr),
) -> Memory {
    tokio::time::sleep(Duration::from_secs(env_u64(
        "SWITCHYARD_FUZZ_SETTLE_SECS",
        0,
    )))
    .await;
    for e in endpoints {
        run_endpoint(e.clone(), SETTLING_SEED, 16, None, tls.clone(), addrs).await;
    }
    Memory {
        resident: server.settled_rss().await,
        heap: server.heap().await,
    }
}

/// What the server holds: `heap`, the bytes allocated and not freed (from its `/metrics`), is
/// what a leak grows; `resident` adds its code and what its allocator keeps for reuse.
#[derive(Clone, Copy)]
struct Memory {
    resident: u64,
    heap: u64,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "heap {:.1} MiB, resident {:.1} MiB",
            self.heap as f64 / 1048576.0,
            self.resident as f64 / 1048576.0
        )
    }
}

/// The seed of [`settle`]'s bodies: the same before and after the campaign.
const SETTLING_SEED: u64 = 7;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_surface_takes_any_body_without_a_panic_a_hang_or_a_5xx() {
    switchyard::install_crypto_provider();
    let seed = env_u64("SWITCHYARD_FUZZ_SEED", 20261126);
    let bodies = env_u64("SWITCHYARD_FUZZ_BODIES", 300);
    let endpoints_wanted = std::env::var("SWITCHYARD_FUZZ_ENDPOINTS").ok();
    let only: Option<(String, u64)> = std::env::var("SWITCHYARD_FUZZ_ONLY").ok().and_then(|v| {
        let (name, i) = v.split_once(':')?;
        Some((name.to_string(), i.parse().ok()?))
    });

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let addrs = (server.https, server.probe);
    let tls = connector_from_dir(&dir.path().join("pki"));
    let endpoints: Vec<Arc<Endpoint>> = endpoints().into_iter().map(Arc::new).collect();

    // The warm-up is a campaign of its own (up to 20,000 bodies per endpoint, another seed):
    // the allocator's arenas reach the sizes such bodies need, and what remains to see is
    // whether the same work again keeps growing the process (a leak) or not.
    for e in &endpoints {
        let warm = bodies.min(20_000);
        run_endpoint(e.clone(), seed ^ 1, warm, None, tls.clone(), addrs).await;
    }
    let before = settle(&server, &endpoints, &tls, addrs).await;
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut vacuous = Vec::new();
    println!("fuzz campaign: seed {seed}, {bodies} bodies per endpoint");
    for e in &endpoints {
        let only_here = match &only {
            Some((name, i)) if name == e.name => Some(*i),
            Some(_) => continue,
            None => None,
        };
        if endpoints_wanted
            .as_ref()
            .is_some_and(|w| !w.split(',').any(|n| n == e.name))
        {
            continue;
        }
        let t0 = Instant::now();
        let tally = run_endpoint(e.clone(), seed, bodies, only_here, tls.clone(), addrs).await;
        println!(
            "  {:<10} {:>8} bodies in {:>7.1?}, slowest reply {:?} (body {}), statuses {:?}, heap {:.1} MiB, resident {:.1} MiB",
            e.name,
            tally.by_status.values().sum::<u64>(),
            t0.elapsed(),
            tally.slowest,
            tally.slowest_at,
            tally.by_status,
            server.heap().await as f64 / 1048576.0,
            server.rss() as f64 / 1048576.0
        );
        // A campaign that never gets a body through, or never one refused, tests little.
        let through = tally.by_status.range(200..300).count() > 0;
        let refused = tally.by_status.range(400..500).count() > 0;
        if only.is_none() && bodies >= 100 && !(through && (refused || e.probe)) {
            vacuous.push(format!("{}: {:?}", e.name, tally.by_status));
        }
        failures.extend(tally.failures);
    }
    let after = settle(&server, &endpoints, &tls, addrs).await;
    let panics = server.panics();
    println!(
        "  {:.1?} in all; the server's memory before: {before}; after: {after}; {} panics",
        started.elapsed(),
        panics.len()
    );
    assert!(
        failures.is_empty(),
        "{} bodies went wrong, the first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
    assert!(panics.is_empty(), "the server panicked: {panics:?}");
    // The heap within 10 % of before. It holds the extender's pod caches, whose contents are
    // whatever pods came last (bounded, and lapsing after 30 s and 300 s), so a short run may
    // differ by what a few hundred pods hold: 2 MiB more are allowed, less than a KiB for each
    // of the CI run's bodies.
    let allowed = before.heap + before.heap / 10 + 2 * 1024 * 1024;
    assert!(
        after.heap <= allowed,
        "the server's heap grew from {} to {} bytes over the campaign",
        before.heap,
        after.heap
    );
    // Resident memory also counts what mimalloc keeps for reuse, which varies by tens of MiB
    // with what the last requests were; only a gross growth is a failure.
    assert!(
        after.resident <= before.resident + before.resident / 2,
        "the server's resident memory grew from {} to {} bytes over the campaign",
        before.resident,
        after.resident
    );
    assert!(
        vacuous.is_empty(),
        "every endpoint takes some bodies and refuses others (the probes: some found): {vacuous:?}"
    );
}
