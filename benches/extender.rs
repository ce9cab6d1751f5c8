//! Extender filter + prioritize end to end: HTTPS with keep-alive on loopback against
//! switchyard in-process, as kube-scheduler calls it (one pod at a time, `nodeCacheCapable`:
//! names only), over a generated inventory of 5,000 real nodes.
//!
//! Target: p99 under 5 ms per call, for filter and for prioritize.
//!
//!     cargo bench --bench extender                  # 300 pods after 30 warm-up pods
//!     EXT_PODS=50 cargo bench --bench extender      # quicker
//!
//! Environment (defaults in brackets):
//!   EXT_NODES [5000]    nodes in the generated inventory, all sent as NodeNames
//!   EXT_PODS [300]      measured pods (one filter and one prioritize each)
//!   EXT_WARMUP [30]     unmeasured pods first
//!   EXT_WORKERS [2]     server worker threads
//!
//! The inventory is generated deterministically (splitmix64, fixed seed): one cluster of
//! nodes with 2–8 NUMA zones, mixed single-numa-node / restricted / best-effort policies,
//! container and pod scopes, some with prefer-closest-numa-nodes and distances, a tenth
//! without NUMA data, a few tainted, CPU nodes and GPU nodes (nvidia.com/gpu), and a random
//! load on every zone.
//!
//! The pod is the captured Guaranteed GPU pod of
//! `tests/fixtures/extender/extender-filter-nodenames.json` (4 CPUs, 8 GiB, 2 GPUs), its
//! NodeNames replaced by every node of the inventory. Each pod gets a fresh uid and
//! resourceVersion so the extender's memo cannot answer filter from an earlier pod;
//! prioritize follows with the same uid/resourceVersion and the names filter passed, as
//! kube-scheduler sends them. Bodies are compact JSON, as Go's encoding/json writes them.
//!
//! The client is one keep-alive connection on its own 1-thread runtime; calls are
//! sequential. Each call is timed from send to the last byte of the reply. After the HTTPS
//! run, the same requests go straight to `Extender::filter` / `prioritize` in-process
//! (no HTTP, no TLS) to show how much of a call is the handler itself, and the pod is
//! judged by `extender::filter_names` on names already parsed (the placement engine alone).
//!
//! The process allocates with mimalloc, as the switchyard binary does (`src/main.rs`): with
//! glibc's allocator, freeing a filter's large buffers (the 350 KB reply, the name lists)
//! consolidates its free lists every call, which the server does not pay.
//!
//! Without `--bench` (`cargo test --benches`), a small run only checks the harness works.

use anyhow::{anyhow, bail, Context};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard::config::{ServeSettings, TlsSource};
use switchyard::extender::{filter_names, Extender, ExtenderConfig, FILTER_PATH, PRIORITIZE_PATH};
use switchyard::inventory::InventoryStore;
use switchyard::placement::inflight::InFlight;
use switchyard::placement::{PodShape, PodView};
use switchyard::rng::Rng;
use tokio_rustls::TlsConnector;

#[global_allocator]
static ALLOCATOR: cap::Cap<mimalloc::MiMalloc> = cap::Cap::new(mimalloc::MiMalloc, usize::MAX);

const TIMEOUT: Duration = Duration::from_secs(10);
const FIXTURE: &str = "extender-filter-nodenames";
const TARGET_P99_MS: f64 = 5.0;

type Sender = SendRequest<Full<Bytes>>;

struct Params {
    nodes: usize,
    pods: usize,
    warmup: usize,
    workers: usize,
}

fn env(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map_err(|e| anyhow!("{name}={v:?}: {e}")),
        Err(_) => Ok(default),
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// The inventory file: one cluster of `nodes` nodes.
fn inventory_yaml(nodes: usize) -> String {
    let mut rng = Rng::new(0x5EED_0001);
    let mut y = String::from("clusters:\n  - name: bench\n    nodes:\n");
    for i in 0..nodes {
        let name = node_name(i);
        let gpu_node = rng.percent(60);
        let zones = 2 + rng.below(7); // 2..=8
        let zone_cpu = [16u64, 24, 32][rng.below(3) as usize];
        let zone_mem_gi = [64u64, 128][rng.below(2) as usize];
        let zone_gpu = if gpu_node { 1 + rng.below(2) } else { 0 };
        let (mut cpu_used, mut mem_used, mut gpu_used) = (0u64, 0u64, 0u64);
        let mut zone_text = String::new();
        let policy = ["single-numa-node", "restricted", "best-effort"][rng.below(3) as usize];
        let scope = if rng.percent(50) { "container" } else { "pod" };
        let closest = policy != "single-numa-node" && rng.percent(20);
        for z in 0..zones {
            let cu = rng.below(zone_cpu + 1);
            let mu = rng.below(zone_mem_gi + 1);
            let gu = rng.below(zone_gpu + 1);
            cpu_used += cu;
            mem_used += mu;
            gpu_used += gu;
            let _ = writeln!(
                zone_text,
                "            - name: node-{z}\n              type: Node"
            );
            if closest {
                let costs: Vec<String> = (0..zones)
                    .map(|t| {
                        let d = if t == z {
                            10
                        } else {
                            12 + 4 * z.abs_diff(t) % 11
                        };
                        format!("{{name: node-{t}, value: {d}}}")
                    })
                    .collect();
                let _ = writeln!(zone_text, "              costs: [{}]", costs.join(", "));
            }
            let _ = writeln!(zone_text, "              resources:");
            let _ = writeln!(
                zone_text,
                "                - {{name: cpu, capacity: \"{zone_cpu}\", allocatable: \"{zone_cpu}\", available: \"{}\"}}",
                zone_cpu - cu
            );
            let _ = writeln!(
                zone_text,
                "                - {{name: memory, capacity: {zone_mem_gi}Gi, allocatable: {zone_mem_gi}Gi, available: {}Gi}}",
                zone_mem_gi - mu
            );
            if gpu_node {
                let _ = writeln!(
                    zone_text,
                    "                - {{name: nvidia.com/gpu, capacity: \"{zone_gpu}\", allocatable: \"{zone_gpu}\", available: \"{}\"}}",
                    zone_gpu - gu
                );
            }
        }
        let pods = 3 + rng.below(60);
        let gpu_alloc = if gpu_node {
            format!(", nvidia.com/gpu: \"{}\"", zone_gpu * zones)
        } else {
            String::new()
        };
        let gpu_req = if gpu_node {
            format!(", nvidia.com/gpu: \"{gpu_used}\"")
        } else {
            String::new()
        };
        let _ = writeln!(
            y,
            "      - name: {name}\n        labels: {{kubernetes.io/hostname: {name}}}"
        );
        if rng.percent(5) {
            let _ = writeln!(
                y,
                "        taints: [{{key: dedicated, value: infra, effect: NoSchedule}}]"
            );
        }
        let _ = writeln!(
            y,
            "        allocatable: {{cpu: \"{}\", memory: {}Gi, pods: \"110\"{gpu_alloc}}}",
            zone_cpu * zones,
            zone_mem_gi * zones
        );
        let _ = writeln!(
            y,
            "        requested: {{cpu: \"{cpu_used}\", memory: {mem_used}Gi, pods: \"{pods}\"{gpu_req}}}"
        );
        if rng.percent(10) {
            continue; // no NUMA data published
        }
        let _ = writeln!(y, "        topology:\n          attributes:");
        let _ = writeln!(
            y,
            "            - {{name: topologyManagerPolicy, value: {policy}}}\n            - {{name: topologyManagerScope, value: {scope}}}"
        );
        if closest {
            let _ = writeln!(
                y,
                "            - {{name: topologyManagerOptionPreferClosestNUMANodes, value: \"true\"}}"
            );
        }
        let _ = write!(y, "          zones:\n{zone_text}");
    }
    y
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

async fn connect(connector: TlsConnector, addr: SocketAddr) -> anyhow::Result<Sender> {
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
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

async fn post(sender: &mut Sender, path: &str, body: Bytes) -> anyhow::Result<Bytes> {
    let req = hyper::Request::post(path)
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))?;
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

/// Request bodies for pod `i`: a fresh uid and resourceVersion, every node as a candidate.
struct Bodies {
    template: Value,
}

impl Bodies {
    fn filter(&self, i: usize) -> Bytes {
        let mut v = self.template.clone();
        v["Pod"]["metadata"]["uid"] = json!(format!("00000000-bench-4000-8000-{i:012}"));
        v["Pod"]["metadata"]["resourceVersion"] = json!(format!("{}", 100_000 + i));
        Bytes::from(serde_json::to_vec(&v).expect("JSON"))
    }

    /// The prioritize request kube-scheduler sends after filter: same pod, passed names.
    fn prioritize(filter: &[u8], passed: &[String]) -> Bytes {
        let mut v: Value = serde_json::from_slice(filter).expect("JSON");
        v["NodeNames"] = json!(passed);
        Bytes::from(serde_json::to_vec(&v).expect("JSON"))
    }
}

/// What a filter reply said.
struct Filtered {
    passed: Vec<String>,
    failed: usize,
    unresolvable: usize,
}

fn read_filter(reply: &[u8]) -> anyhow::Result<Filtered> {
    let v: Value = serde_json::from_slice(reply)?;
    if let Some(e) = v["Error"].as_str().filter(|e| !e.is_empty()) {
        bail!("filter error: {e}");
    }
    let passed = v["NodeNames"]
        .as_array()
        .ok_or_else(|| anyhow!("filter reply without NodeNames"))?
        .iter()
        .filter_map(|n| n.as_str().map(String::from))
        .collect();
    let count = |k: &str| v[k].as_object().map_or(0, |m| m.len());
    Ok(Filtered {
        passed,
        failed: count("FailedNodes"),
        unresolvable: count("FailedAndUnresolvableNodes"),
    })
}

fn check_prioritize(reply: &[u8], passed: usize) -> anyhow::Result<()> {
    let v: Value = serde_json::from_slice(reply)?;
    let list = v
        .as_array()
        .ok_or_else(|| anyhow!("prioritize reply is not a list"))?;
    if list.len() != passed {
        bail!("prioritize scored {} hosts, {passed} asked", list.len());
    }
    Ok(())
}

#[derive(Default)]
struct Samples {
    filter_ns: Vec<u64>,
    prioritize_ns: Vec<u64>,
    passed: usize,
    failed: usize,
    unresolvable: usize,
    filter_bytes: usize,
    prioritize_bytes: usize,
}

/// Sequential filter + prioritize for `warmup + pods` pods over one keep-alive connection.
async fn over_https(
    connector: TlsConnector,
    addr: SocketAddr,
    bodies: Arc<Bodies>,
    p: (usize, usize),
) -> anyhow::Result<Samples> {
    let (warmup, pods) = p;
    let mut sender = connect(connector, addr).await?;
    let mut s = Samples::default();
    for i in 0..warmup + pods {
        let filter = bodies.filter(i);
        let t = Instant::now();
        let reply = post(&mut sender, FILTER_PATH, filter.clone()).await?;
        let filter_ns = t.elapsed().as_nanos() as u64;
        let f = read_filter(&reply)?;
        let prioritize = Bodies::prioritize(&filter, &f.passed);
        let t = Instant::now();
        let reply = post(&mut sender, PRIORITIZE_PATH, prioritize.clone()).await?;
        let prioritize_ns = t.elapsed().as_nanos() as u64;
        check_prioritize(&reply, f.passed.len())?;
        if i >= warmup {
            s.filter_ns.push(filter_ns);
            s.prioritize_ns.push(prioritize_ns);
        }
        (s.passed, s.failed, s.unresolvable) = (f.passed.len(), f.failed, f.unresolvable);
        (s.filter_bytes, s.prioritize_bytes) = (filter.len(), prioritize.len());
    }
    Ok(s)
}

/// The same requests straight into the handlers' pure part; and the placement engine alone
/// (`judge` on names already parsed), in `judge_ns`.
fn in_process(
    extender: &Extender,
    bodies: &Bodies,
    p: (usize, usize),
    judge_ns: &mut Vec<u64>,
) -> anyhow::Result<Samples> {
    let (warmup, pods) = p;
    let mut s = Samples::default();
    let inventory = extender.store.snapshot();
    let inflight = Arc::new(InFlight::default());
    let view: PodView = serde_json::from_value(bodies.template["Pod"].clone())?;
    let shape = Arc::new(PodShape::from_view(&view)?);
    let names: Vec<String> = serde_json::from_value(bodies.template["NodeNames"].clone())?;
    for i in 0..warmup + pods {
        let t = Instant::now();
        let verdicts = filter_names(
            &inventory,
            &inflight,
            &shape,
            &names,
            &extender.config,
            Instant::now(),
        );
        if i >= warmup {
            judge_ns.push(t.elapsed().as_nanos() as u64);
        }
        std::hint::black_box(verdicts);
    }
    for i in 0..warmup + pods {
        // Uids distinct from the HTTPS run's, so nothing is memoised from it.
        let filter = bodies.filter(1_000_000 + i);
        let t = Instant::now();
        let reply = extender
            .filter(&filter, Instant::now())
            .map_err(|e| anyhow!("{e}"))?;
        let filter_ns = t.elapsed().as_nanos() as u64;
        let f = read_filter(&reply)?;
        let prioritize = Bodies::prioritize(&filter, &f.passed);
        let t = Instant::now();
        let reply = extender
            .prioritize(&prioritize, Instant::now())
            .map_err(|e| anyhow!("{e}"))?;
        let prioritize_ns = t.elapsed().as_nanos() as u64;
        check_prioritize(&reply, f.passed.len())?;
        if i >= warmup {
            s.filter_ns.push(filter_ns);
            s.prioritize_ns.push(prioritize_ns);
        }
    }
    Ok(s)
}

/// p50, p99, max in milliseconds (nearest rank).
fn summary(ns: &[u64]) -> (f64, f64, f64) {
    let mut v = ns.to_vec();
    v.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1] as f64 / 1e6
    };
    (at(0.5), at(0.99), at(1.0))
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

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() -> anyhow::Result<()> {
    switchyard::install_crypto_provider();
    let bench = std::env::args().any(|a| a == "--bench");
    let p = if bench {
        Params {
            nodes: env("EXT_NODES", 5000)?,
            pods: env("EXT_PODS", 300)?,
            warmup: env("EXT_WARMUP", 30)?,
            workers: env("EXT_WORKERS", 2)?,
        }
    } else {
        Params {
            nodes: 200,
            pods: 3,
            warmup: 1,
            workers: 1,
        }
    };
    if p.nodes == 0 || p.pods == 0 || p.workers == 0 {
        bail!("EXT_NODES, EXT_PODS and EXT_WORKERS must be at least 1");
    }
    let load_before = loadavg();

    let dir = tempfile::tempdir()?;
    let inventory_path = dir.path().join("inventory.yaml");
    let yaml = inventory_yaml(p.nodes);
    std::fs::write(&inventory_path, &yaml)?;
    let pki = dir.path().join("pki");
    switchyard::certs::ensure_dev(&pki)?;
    let connector = connector(&pki.join("ca.crt"))?;

    let fixture_path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/extender")
        .join(format!("{FIXTURE}.json"));
    let mut template: Value = serde_json::from_slice(
        &std::fs::read(&fixture_path).with_context(|| fixture_path.display().to_string())?,
    )?;
    template["NodeNames"] = json!((0..p.nodes).map(node_name).collect::<Vec<_>>());
    let bodies = Arc::new(Bodies { template });

    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("extender-client")
        .enable_all()
        .build()?;
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let https = control.block_on(async {
        let mut settings = ServeSettings::for_tests(TlsSource::Dev(pki.clone()));
        settings.workers = p.workers;
        settings.inventory = Some(inventory_path.clone());
        let running = switchyard::server::start(settings).await?;
        let run = client
            .spawn(over_https(
                connector,
                running.https_addr,
                bodies.clone(),
                (p.warmup, p.pods),
            ))
            .await;
        tokio::time::timeout(Duration::from_secs(15), running.shutdown())
            .await
            .map_err(|_| anyhow!("switchyard did not shut down"))?;
        run.map_err(|e| anyhow!("client task: {e}"))?
    })?;
    client.shutdown_timeout(Duration::from_secs(5));

    let inventory = switchyard::inventory::load_file(&inventory_path)?.inventory;
    let extender = Extender::new(
        Arc::new(InventoryStore::new(inventory)),
        ExtenderConfig::default(),
        None,
    );
    let mut judge_ns = Vec::new();
    let direct = in_process(&extender, &bodies, (p.warmup, p.pods), &mut judge_ns)?;
    let load_after = loadavg();

    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = cpu_model();
    let rows = [
        ("filter (HTTPS)", summary(&https.filter_ns)),
        ("prioritize (HTTPS)", summary(&https.prioritize_ns)),
        ("filter (handler only)", summary(&direct.filter_ns)),
        ("prioritize (handler only)", summary(&direct.prioritize_ns)),
        ("filter_names (engine only)", summary(&judge_ns)),
    ];
    println!();
    println!("machine: {nproc} CPUs, {cpu}; load average before {load_before}, after {load_after}");
    println!(
        "{} nodes ({} KB of inventory YAML), {} pods measured after {} warm-up; server workers {}; filter body {} B, prioritize body {} B",
        p.nodes,
        yaml.len() / 1024,
        p.pods,
        p.warmup,
        p.workers,
        https.filter_bytes,
        https.prioritize_bytes
    );
    println!(
        "last filter: {} passed, {} failed, {} failed and unresolvable",
        https.passed, https.failed, https.unresolvable
    );
    println!();
    println!(
        "{:<28} {:>10} {:>10} {:>10}",
        "per call (ms)", "p50", "p99", "max"
    );
    for (label, (p50, p99, max)) in &rows {
        println!("{label:<28} {p50:>10.3} {p99:>10.3} {max:>10.3}");
    }
    let ms = |(p50, p99, max): (f64, f64, f64)| {
        let r = |v: f64| (v * 1000.0).round() / 1000.0;
        json!({"p50_ms": r(p50), "p99_ms": r(p99), "max_ms": r(max)})
    };
    let targets = json!({
        "filter_p99_under_5ms": rows[0].1 .1 < TARGET_P99_MS,
        "prioritize_p99_under_5ms": rows[1].1 .1 < TARGET_P99_MS,
    });
    println!("targets: {targets}");
    if !bench {
        println!(
            "(harness check without --bench: a tiny inventory and a few pods, not a measurement)"
        );
    }
    println!();
    let line = json!({
        "bench": "switchyard-extender",
        "machine": {"nproc": nproc, "cpu": cpu},
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "config": {
            "nodes": p.nodes,
            "pods": p.pods,
            "warmup_pods": p.warmup,
            "server_workers": p.workers,
            "client_threads": 1,
            "fixture": FIXTURE,
            "filter_body_bytes": https.filter_bytes,
            "prioritize_body_bytes": https.prioritize_bytes,
        },
        "last_filter": {"passed": https.passed, "failed": https.failed, "unresolvable": https.unresolvable},
        "https": {"filter": ms(rows[0].1), "prioritize": ms(rows[1].1)},
        "handler_only": {"filter": ms(rows[2].1), "prioritize": ms(rows[3].1)},
        "filter_names_only": ms(rows[4].1),
        "targets": targets,
    });
    println!("{line}");
    Ok(())
}
