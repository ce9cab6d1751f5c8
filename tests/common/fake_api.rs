//! A small kube-apiserver stand-in on loopback, plain HTTP or HTTPS, that answers the way the
//! real one does (shapes from the kube-api captures of a v1.36 API server): lists with
//! `metadata.resourceVersion`, watches with one JSON object per chunk, BOOKMARKs when asked
//! for, ERROR events carrying a 410 Status, streams that end at their timeout; GET, POST (409
//! AlreadyExists), PUT (409 Conflict on a stale resourceVersion), merge PATCH of an object or
//! its `status` (415 for other patch types), DELETE, 404 NotFound Status bodies, label and
//! `metadata.name` field selectors, bearer tokens (401). Knobs break it: fail lists, expire
//! watches, end the open ones, silent watches, hang, hide the NodeResourceTopology CRD; refuse,
//! delay or lose the answers of chosen requests; fence a client off after its Nth write (a
//! process that died right after it); and refuse, as kube-apiserver does, Job statuses that
//! break its rules ([`super::job_rules`]).

use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// Collections, by path.
pub const NODES: &str = "/api/v1/nodes";
pub const PODS: &str = "/api/v1/pods";
pub const NRTS: &str = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies";
pub const SECRETS: &str = "/api/v1/secrets";
pub const LEASES: &str = "/apis/coordination.k8s.io/v1/leases";
pub const WORKER_CLUSTERS: &str = "/apis/switchyard.dev/v1alpha1/workerclusters";
pub const JOBS: &str = "/apis/batch/v1/jobs";
pub const NAMESPACES: &str = "/api/v1/namespaces";
pub const DISPATCH_QUEUES: &str = "/apis/switchyard.dev/v1alpha1/dispatchqueues";
pub const PRIORITY_CLASSES: &str = "/apis/scheduling.k8s.io/v1/priorityclasses";
pub const EVENTS: &str = "/apis/events.k8s.io/v1/events";
/// Served only after [`FakeApi::serve_jobsets`], as a CRD is only once installed.
pub const JOBSETS: &str = "/apis/jobset.x-k8s.io/v1alpha2/jobsets";
const JOBSET_GROUP_VERSION: &str = "jobset.x-k8s.io/v1alpha2";

/// What a request path names.
#[derive(Debug, Clone)]
struct Target {
    /// `<prefix>/<plural>`, the key of the collection (all namespaces).
    collection: String,
    api_version: String,
    group: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_target(path: &str) -> Option<Target> {
    let (prefix, api_version, group, rest) = if let Some(rest) = path.strip_prefix("/api/v1") {
        ("/api/v1".to_string(), "v1".to_string(), String::new(), rest)
    } else {
        let rest = path.strip_prefix("/apis/")?;
        let mut parts = rest.splitn(3, '/');
        let (g, v) = (parts.next()?, parts.next()?);
        (
            format!("/apis/{g}/{v}"),
            format!("{g}/{v}"),
            g.to_string(),
            &path[("/apis/".len() + g.len() + 1 + v.len())..],
        )
    };
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, segs) = match segs.as_slice() {
        ["namespaces", ns, more @ ..] if !more.is_empty() => (Some(ns.to_string()), more.to_vec()),
        _ => (None, segs),
    };
    let (plural, name, sub) = match segs.as_slice() {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    Some(Target {
        collection: format!("{prefix}/{plural}"),
        api_version,
        group,
        plural: plural.to_string(),
        namespace,
        name,
        sub,
    })
}

/// An object's stored resourceVersion.
fn version_of(obj: &Value) -> String {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn kind_of(plural: &str) -> Option<&'static str> {
    Some(match plural {
        "nodes" => "Node",
        "pods" => "Pod",
        "secrets" => "Secret",
        "leases" => "Lease",
        "namespaces" => "Namespace",
        "workerclusters" => "WorkerCluster",
        "noderesourcetopologies" => "NodeResourceTopology",
        "jobs" => "Job",
        "jobsets" => "JobSet",
        "localqueues" => "LocalQueue",
        "clusterqueues" => "ClusterQueue",
        "workloads" => "Workload",
        "dispatchqueues" => "DispatchQueue",
        "priorityclasses" => "PriorityClass",
        "events" => "Event",
        _ => return None,
    })
}

/// Kinds whose `status` only the status subresource writes.
fn has_status_subresource(plural: &str) -> bool {
    matches!(
        plural,
        "nodes" | "pods" | "workerclusters" | "jobs" | "jobsets" | "dispatchqueues"
    )
}

pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn object_status(t: &Target, name: &str, code: u16, reason: &str, message: String) -> Value {
    let mut details = json!({"name": name, "kind": t.plural});
    if !t.group.is_empty() {
        details["group"] = json!(t.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "details": details, "code": code})
}

fn resource(t: &Target) -> String {
    if t.group.is_empty() {
        t.plural.clone()
    } else {
        format!("{}.{}", t.plural, t.group)
    }
}

fn full(status: u16, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Label selector terms: `k=v`, `k==v`, `k!=v`, `k`, `!k`.
fn labels_match(selector: &str, obj: &Value) -> bool {
    let labels = &obj["metadata"]["labels"];
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k].as_str() != Some(v)
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels[k].as_str() == Some(v)
        } else if let Some(k) = term.strip_prefix('!') {
            labels.get(k).is_none()
        } else {
            labels.get(term).is_some()
        }
    })
}

/// Field selectors: `metadata.name` and `metadata.namespace`; other fields are not checked.
fn fields_match(selector: &str, obj: &Value) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let Some((k, v)) = term.split_once('=') else {
            return true;
        };
        if k.ends_with('!') {
            return true;
        }
        match k {
            "metadata.name" => obj["metadata"]["name"].as_str() == Some(v),
            "metadata.namespace" => obj["metadata"]["namespace"].as_str() == Some(v),
            _ => true,
        }
    })
}

/// What a write expects to find stored under its object's key (see `FakeApi::emit_if`).
enum Expect {
    Any,
    Absent,
    /// The object at this resourceVersion.
    Version(String),
}

/// The object changed (or went, or came) between a handler's read and its write.
#[derive(Debug)]
struct Moved;

struct Filter {
    namespace: Option<String>,
    labels: Option<String>,
    fields: Option<String>,
}

impl Filter {
    fn matches(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns))
            && self.labels.as_deref().is_none_or(|s| labels_match(s, obj))
            && self.fields.as_deref().is_none_or(|s| fields_match(s, obj))
    }
}

#[derive(Default)]
struct Collection {
    /// By (namespace, name); cluster-scoped objects have namespace "".
    objects: BTreeMap<(String, String), Value>,
    /// (resourceVersion, object, event line) for replay to watches that start behind.
    log: Vec<(u64, Value, String)>,
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub uri: String,
    pub authorization: Option<String>,
    pub content_type: Option<String>,
    pub body: Option<Value>,
    /// The status code answered (`None` while the request is still being answered).
    pub status: Option<u16>,
    /// The client's [`REPLICA_HEADER`], if it sent one.
    pub replica: Option<String>,
    /// When it arrived.
    pub at: std::time::Instant,
}

struct State {
    rv: u64,
    uid: u64,
    collections: HashMap<String, Collection>,
    live: broadcast::Sender<(String, u64, Value, String)>,
    fail_lists: u32,
    expire_watches: HashMap<String, u32>,
    hang: bool,
    /// Hang every request but `GET /version`: a server that answers probes but not lists.
    hang_collections: bool,
    nrt_missing: bool,
    /// When set, only this bearer token is accepted.
    token: Option<String>,
    /// Longest a watch stays open (the real server uses timeoutSeconds; tests want it short).
    max_watch: Duration,
    /// How often a watch that asked for bookmarks gets one (the real server: about every
    /// minute, and once more just before it ends the watch).
    bookmark_every: Duration,
    /// Watches of these collections are accepted (200) and then sent nothing, ever.
    hang_watches: std::collections::HashSet<String>,
    /// No bookmark ever, asked for or not: kube-apiserver 1.36 on a collection where nothing
    /// changes (its watches end at timeoutSeconds without a line).
    withhold_bookmarks: bool,
    /// Every watch served, in order.
    watches: Vec<WatchRecord>,
    requests: Vec<Recorded>,
    /// Creates in a namespace that is not stored get 404, as on a real server.
    require_namespaces: bool,
    /// Requests refused with a Status: (method, plural, subresource, code, reason, message).
    refusals: Vec<Refusal>,
    /// The identity whose RBAC (src/rbac.rs) every request must be covered by, and the
    /// features the chart enabled.
    rbac: Option<(switchyard::rbac::Role, Vec<switchyard::rbac::Feature>)>,
    /// The JobSet CRD is installed.
    jobsets: bool,
    uncovered: Vec<String>,
    /// Delay before answering writes (a slow API server).
    write_delay: Duration,
    /// Requests refused, delayed or whose answer is lost, a given number of times each.
    failures: Vec<Failure>,
    /// Bumped to end every open watch at once.
    kick: tokio::sync::watch::Sender<u64>,
    /// Set once the server is shut down: it accepts nothing more and drops its connections.
    down: tokio::sync::watch::Sender<bool>,
    /// Refuse manager Job status writes that break the API server's rules, and keep them.
    job_status_rules: bool,
    status_violations: Vec<String>,
    /// Clients fenced off after a number of writes (see [`Tripwire`]).
    trips: Vec<Arc<Tripwire>>,
    /// Requests naming a replica ([`REPLICA_HEADER`]) are refused: the server is out of its
    /// reach, while the test (the worker's own controllers) still gets through.
    partitioned: bool,
}

/// What happens to the next `times` requests whose URI and body contain the given text.
struct Failure {
    method: String,
    uri_contains: String,
    body_contains: Option<String>,
    times: u32,
    what: Mishap,
}

/// What a matching request meets.
#[derive(Debug, Clone)]
enum Mishap {
    /// Refused with this Status, nothing applied.
    Refuse(Refusal),
    /// Applied after this long (the client may have given up by then).
    Late(Duration),
    /// Applied at once, and then the answer is lost: see [`Loss`].
    Lost(Loss),
}

/// How the answer of a write that was applied gets lost.
#[derive(Debug, Clone, Copy)]
pub enum Loss {
    /// The client is told 500 InternalError (as when etcd committed but the API server
    /// timed out waiting for it).
    Error,
    /// The answer comes only after this long (the client times out first).
    Hang(Duration),
}

/// The request header naming the client (a dispatcher replica) for [`Tripwire`]s.
pub const REPLICA_HEADER: &str = "x-switchyard-replica";

/// A client that "dies" right after its Nth write to a path containing `/jobs`, counted across
/// every server the tripwire is set on ([`FakeApi::set_tripwire`]): from then on, when
/// `fence` is set, its requests are refused before they are applied, as a dead process sends
/// none. The write that trips it lands.
pub struct Tripwire {
    replica: String,
    fence: bool,
    state: Mutex<TripState>,
}

#[derive(Default)]
struct TripState {
    left: Option<u32>,
    fired: bool,
}

impl Tripwire {
    /// For the client that sends `REPLICA_HEADER: replica`; `fence`: refuse its requests
    /// once fired (a crash), or only say it fired (a lease lost).
    pub fn new(replica: &str, fence: bool) -> Arc<Self> {
        Arc::new(Tripwire {
            replica: replica.to_string(),
            fence,
            state: Mutex::new(TripState::default()),
        })
    }
    /// Fires right after the `writes`th next write (≥ 1).
    pub fn arm(&self, writes: u32) {
        self.state.lock().unwrap().left = Some(writes.max(1));
    }
    pub fn disarm(&self) {
        self.state.lock().unwrap().left = None;
    }
    pub fn fired(&self) -> bool {
        self.state.lock().unwrap().fired
    }
    fn fenced(&self, replica: Option<&str>) -> bool {
        self.fence && replica == Some(self.replica.as_str()) && self.fired()
    }
    /// Counts a write that landed; fires at the armed count.
    fn wrote(&self, replica: Option<&str>) {
        if replica != Some(self.replica.as_str()) {
            return;
        }
        let mut s = self.state.lock().unwrap();
        if let Some(left) = s.left {
            if left <= 1 {
                s.left = None;
                s.fired = true;
            } else {
                s.left = Some(left - 1);
            }
        }
    }
}

/// One watch as the server served it.
#[derive(Debug, Clone)]
pub struct WatchRecord {
    pub collection: String,
    /// The `resourceVersion` it was asked to start from.
    pub from: u64,
    /// The resourceVersion of the last event or bookmark it sent, if any.
    pub last_sent: Option<u64>,
    /// When it last told the client anything: a line, or its end at the watch timeout. A
    /// silent watch never does.
    pub last_word: Option<std::time::Instant>,
}

/// A request the server refuses, until cleared.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub method: &'static str,
    pub plural: &'static str,
    pub sub: Option<&'static str>,
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    pub addr: SocketAddr,
    /// The CA that signed the serving certificate, when serving HTTPS.
    pub ca_pem: Option<String>,
}

impl FakeApi {
    /// Plain HTTP on loopback.
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// HTTPS on loopback with a fresh CA and a certificate for 127.0.0.1 and localhost: a
    /// worker as a safe kubeconfig reaches it.
    pub async fn start_tls() -> Self {
        switchyard::install_crypto_provider();
        let generated = switchyard::certs::generate(
            &["localhost".to_string()],
            &[std::net::IpAddr::from([127, 0, 0, 1])],
        )
        .unwrap();
        Self::start_with(Some(generated)).await
    }

    async fn start_with(tls: Option<switchyard::certs::Generated>) -> Self {
        let (live, _) = broadcast::channel(4096);
        let state = Arc::new(Mutex::new(State {
            rv: 100,
            uid: 0,
            collections: HashMap::new(),
            live,
            fail_lists: 0,
            expire_watches: HashMap::new(),
            hang: false,
            hang_collections: false,
            nrt_missing: false,
            token: None,
            max_watch: Duration::from_secs(2),
            bookmark_every: Duration::from_millis(500),
            hang_watches: Default::default(),
            withhold_bookmarks: false,
            watches: Vec::new(),
            requests: Vec::new(),
            require_namespaces: false,
            refusals: Vec::new(),
            rbac: None,
            jobsets: false,
            uncovered: Vec::new(),
            write_delay: Duration::ZERO,
            failures: Vec::new(),
            kick: tokio::sync::watch::channel(0).0,
            down: tokio::sync::watch::channel(false).0,
            job_status_rules: false,
            status_violations: Vec::new(),
            trips: Vec::new(),
            partitioned: false,
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tls.as_ref().map(|g| {
            use rustls::pki_types::pem::PemObject;
            use rustls::pki_types::{CertificateDer, PrivateKeyDer};
            let certs: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(g.cert_pem.as_bytes())
                    .map(Result::unwrap)
                    .collect();
            let key = PrivateKeyDer::from_pem_slice(g.key_pem.as_bytes()).unwrap();
            let mut config = rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        let api = FakeApi {
            state,
            addr,
            ca_pem: tls.map(|g| g.ca_cert_pem),
        };
        let server = api.clone();
        let mut down = api.state.lock().unwrap().down.subscribe();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = down.wait_for(|d| *d) => return,
                };
                let Ok((tcp, _)) = accepted else {
                    return;
                };
                let api = server.clone();
                let acceptor = acceptor.clone();
                let mut down = down.clone();
                tokio::spawn(async move {
                    let connection = async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let api = api.clone();
                            async move { Ok::<_, Infallible>(api.handle(req).await) }
                        });
                        let builder = hyper::server::conn::http1::Builder::new();
                        match acceptor {
                            None => {
                                let _ = builder
                                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                                    .await;
                            }
                            Some(acceptor) => {
                                let Ok(tls) = acceptor.accept(tcp).await else {
                                    return;
                                };
                                let _ = builder
                                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                                    .await;
                            }
                        }
                    };
                    tokio::select! {
                        _ = connection => {}
                        _ = down.wait_for(|d| *d) => {}
                    }
                });
            }
        });
        api
    }

    /// Stops the server: the listener closes and every connection is dropped, its watches
    /// with it. A test process that starts many servers shuts each down when done.
    pub fn shut_down(&self) {
        let s = self.state.lock().unwrap();
        s.down.send_replace(true);
        s.kick.send_modify(|n| *n += 1);
    }

    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// A kubeconfig-free client for this server (plain HTTP on loopback).
    pub fn client(&self) -> kube::Client {
        switchyard::install_crypto_provider();
        let config = kube::Config::new(self.url().parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    /// A safe kubeconfig for this (HTTPS) server: the CA embedded, a bearer token.
    pub fn kubeconfig(&self, token: &str) -> String {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(
            self.ca_pem
                .as_deref()
                .expect("kubeconfig() needs start_tls()"),
        );
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: worker\nclusters:\n  - name: worker\n    cluster:\n      server: {}\n      certificate-authority-data: {ca}\nusers:\n  - name: switchyard\n    user:\n      token: {token}\ncontexts:\n  - name: worker\n    context: {{cluster: worker, user: switchyard}}\n",
            self.url()
        )
    }

    fn collection_of(path: &str) -> String {
        parse_target(path).map_or_else(|| path.to_string(), |t| t.collection)
    }

    fn emit(&self, path: &str, kind: &str, obj: Value) -> Value {
        self.emit_if(path, kind, Expect::Any, obj)
            .expect("an unconditional write lands")
    }

    /// Writes `obj` if the object stored under its key is as `expect`s, checked under the same
    /// lock as the write, as etcd's compare-and-swap does: a write computed from an object read
    /// before never lands over a change (or a deletion) made since. `Err(Moved)`: read again.
    fn emit_if(
        &self,
        path: &str,
        kind: &str,
        expect: Expect,
        mut obj: Value,
    ) -> Result<Value, Moved> {
        let t = parse_target(path).expect("a collection path");
        let mut s = self.state.lock().unwrap();
        let key = (
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
        {
            let stored = s
                .collections
                .get(&t.collection)
                .and_then(|c| c.objects.get(&key))
                .map(|o| o["metadata"]["resourceVersion"].as_str().unwrap_or(""));
            let holds = match &expect {
                Expect::Any => true,
                Expect::Absent => stored.is_none(),
                Expect::Version(rv) => stored == Some(rv.as_str()),
            };
            if !holds {
                return Err(Moved);
            }
        }
        s.rv += 1;
        let rv = s.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        if obj["metadata"]["uid"].is_null() {
            s.uid += 1;
            obj["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{:012x}", s.uid));
        }
        if obj["metadata"]["creationTimestamp"].is_null() {
            obj["metadata"]["creationTimestamp"] = json!("2026-11-22T03:52:38Z");
        }
        obj["kind"] = json!(kind_of(&t.plural).unwrap_or("Unknown"));
        obj["apiVersion"] = json!(t.api_version);
        let col = s.collections.entry(t.collection.clone()).or_default();
        let ty = match kind {
            "DELETED" => {
                col.objects.remove(&key);
                "DELETED"
            }
            _ if col.objects.contains_key(&key) => "MODIFIED",
            _ => "ADDED",
        };
        if ty != "DELETED" {
            col.objects.insert(key, obj.clone());
        }
        let line = json!({"type": ty, "object": obj}).to_string() + "\n";
        col.log.push((rv, obj.clone(), line.clone()));
        let _ = s.live.send((t.collection, rv, obj.clone(), line));
        Ok(obj)
    }

    /// Creates or replaces an object (its namespace from `metadata.namespace`).
    pub fn upsert(&self, path: &str, obj: Value) -> Value {
        self.emit(path, "UPSERT", obj)
    }

    /// Deletes an object by name (in whatever namespace), or as `namespace/name`.
    pub fn delete(&self, path: &str, name: &str) {
        let obj = match name.split_once('/') {
            Some((ns, name)) => self.get(path, ns, name),
            None => self
                .list(path)
                .into_iter()
                .find(|o| o["metadata"]["name"].as_str() == Some(name)),
        };
        if let Some(obj) = obj {
            self.emit(path, "DELETED", obj);
        }
    }

    pub fn get(&self, path: &str, namespace: &str, name: &str) -> Option<Value> {
        let s = self.state.lock().unwrap();
        s.collections
            .get(&Self::collection_of(path))?
            .objects
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    pub fn list(&self, path: &str) -> Vec<Value> {
        let s = self.state.lock().unwrap();
        s.collections
            .get(&Self::collection_of(path))
            .map(|c| c.objects.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn fail_next_lists(&self, n: u32) {
        self.state.lock().unwrap().fail_lists = n;
    }
    /// The next `n` watches of `path` get a 410 Expired ERROR event, as after compaction.
    pub fn expire_next_watches(&self, path: &str, n: u32) {
        self.state
            .lock()
            .unwrap()
            .expire_watches
            .insert(Self::collection_of(path), n);
    }
    pub fn set_hang(&self, hang: bool) {
        self.state.lock().unwrap().hang = hang;
    }
    /// New watches of `path` are accepted and then silent (no event, no bookmark, no end),
    /// as through a proxy that lost its upstream; lists and other requests still answer.
    pub fn hang_watches(&self, path: &str, hang: bool) {
        let c = Self::collection_of(path);
        let mut s = self.state.lock().unwrap();
        if hang {
            s.hang_watches.insert(c);
        } else {
            s.hang_watches.remove(&c);
        }
    }
    /// Sends no bookmark on any watch, as kube-apiserver does where nothing changes.
    pub fn withhold_bookmarks(&self, withhold: bool) {
        self.state.lock().unwrap().withhold_bookmarks = withhold;
    }
    pub fn set_hang_collections(&self, hang: bool) {
        self.state.lock().unwrap().hang_collections = hang;
    }
    pub fn set_nrt_missing(&self, missing: bool) {
        self.state.lock().unwrap().nrt_missing = missing;
    }
    /// Accept only `Authorization: Bearer <token>` (others get 401).
    pub fn require_token(&self, token: &str) {
        self.state.lock().unwrap().token = Some(token.to_string());
    }
    /// Creates into a namespace that does not exist here get 404 NotFound.
    pub fn require_namespaces(&self) {
        self.state.lock().unwrap().require_namespaces = true;
    }
    /// Refuses matching requests with a Status until [`FakeApi::clear_refusals`].
    pub fn refuse(&self, refusal: Refusal) {
        self.state.lock().unwrap().refusals.push(refusal);
    }
    /// Refuses the next `times` requests with this method whose URI contains `uri_contains`
    /// (and whose JSON body contains `body_contains`, when given).
    pub fn fail_next(
        &self,
        method: &str,
        uri_contains: &str,
        body_contains: Option<&str>,
        times: u32,
        refusal: Refusal,
    ) {
        self.state.lock().unwrap().failures.push(Failure {
            method: method.to_string(),
            uri_contains: uri_contains.to_string(),
            body_contains: body_contains.map(str::to_string),
            times,
            what: Mishap::Refuse(refusal),
        });
    }
    /// Applies the next `times` requests with this method whose URI contains `uri_contains`
    /// only after `delay` (slower than the client waits, the write still lands, late).
    pub fn delay_next(&self, method: &str, uri_contains: &str, times: u32, delay: Duration) {
        self.push_failure(method, uri_contains, times, Mishap::Late(delay));
    }
    /// Applies the next `times` matching requests at once and loses their answers.
    pub fn lose_next(&self, method: &str, uri_contains: &str, times: u32, loss: Loss) {
        self.push_failure(method, uri_contains, times, Mishap::Lost(loss));
    }
    fn push_failure(&self, method: &str, uri_contains: &str, times: u32, what: Mishap) {
        self.state.lock().unwrap().failures.push(Failure {
            method: method.to_string(),
            uri_contains: uri_contains.to_string(),
            body_contains: None,
            times,
            what,
        });
    }
    /// Clears the refusals, and the refusals, delays and losses still due from
    /// [`FakeApi::fail_next`], [`FakeApi::delay_next`] and [`FakeApi::lose_next`].
    pub fn clear_refusals(&self) {
        let mut s = self.state.lock().unwrap();
        s.refusals.clear();
        s.failures.clear();
    }
    /// Ends every open watch now, as an API server restart or a proxy's idle timeout does:
    /// clients watch again from their last resourceVersion (see
    /// [`FakeApi::expire_next_watches`] for the 410 they may get then).
    pub fn end_watches(&self) {
        self.state.lock().unwrap().kick.send_modify(|n| *n += 1);
    }
    /// Cuts the server off from every client that names a replica (or joins it again): their
    /// requests are refused and their open watches end.
    pub fn set_partitioned(&self, partitioned: bool) {
        let mut s = self.state.lock().unwrap();
        s.partitioned = partitioned;
        s.kick.send_modify(|n| *n += 1);
    }
    /// How long a watch stays open before the server ends it (2 s unless set).
    pub fn set_watch_timeout(&self, timeout: Duration) {
        self.state.lock().unwrap().max_watch = timeout;
    }
    /// From now on, a write to a Job's `status` (of a `managedBy` Job, as the dispatcher's
    /// are) whose result breaks the API server's Job status rules, or to a JobSet's `status`
    /// that the JobSet CRD's schema refuses ([`super::jobset_rules`]), is refused with 422
    /// Invalid, and kept for [`FakeApi::status_violations`].
    pub fn enforce_job_status_rules(&self) {
        self.state.lock().unwrap().job_status_rules = true;
    }
    /// The Job status writes refused by [`FakeApi::enforce_job_status_rules`]: the Job, the
    /// rule, the status before and the status the write would have made.
    pub fn status_violations(&self) -> Vec<String> {
        self.state.lock().unwrap().status_violations.clone()
    }
    /// Counts this server's writes for `trip`, and fences its client off once it fires.
    pub fn set_tripwire(&self, trip: Arc<Tripwire>) {
        self.state.lock().unwrap().trips.push(trip);
    }
    /// A client for this server (plain HTTP) that names itself `replica` in every request,
    /// for [`Tripwire`]s.
    pub fn client_as(&self, replica: &str) -> kube::Client {
        switchyard::install_crypto_provider();
        let mut config = kube::Config::new(self.url().parse().unwrap());
        config.headers.push((
            hyper::header::HeaderName::from_static(REPLICA_HEADER),
            hyper::header::HeaderValue::from_str(replica).unwrap(),
        ));
        kube::Client::try_from(config).unwrap()
    }
    /// Checks every later request against the RBAC table for `role`.
    pub fn check_rbac(&self, role: switchyard::rbac::Role) {
        self.state.lock().unwrap().rbac = Some((role, Vec::new()));
    }
    /// The RBAC checked is the chart's with Kueue read access on (a Kueue worker).
    pub fn allow_kueue_reads(&self) {
        if let Some((_, features)) = &mut self.state.lock().unwrap().rbac {
            features.push(switchyard::rbac::Feature::Kueue);
        }
    }
    /// Installs the JobSet CRD: `jobset.x-k8s.io/v1alpha2` is served (discovery, jobsets and
    /// their status), and the RBAC checked is the chart's with JobSets on.
    pub fn serve_jobsets(&self) {
        let mut s = self.state.lock().unwrap();
        s.jobsets = true;
        if let Some((_, features)) = &mut s.rbac {
            features.push(switchyard::rbac::Feature::JobSet);
        }
    }
    /// Requests the RBAC table does not allow (see [`FakeApi::check_rbac`]).
    pub fn uncovered(&self) -> Vec<String> {
        self.state.lock().unwrap().uncovered.clone()
    }
    /// Answers writes (POST, PUT, PATCH, DELETE) only after `delay`.
    pub fn set_write_delay(&self, delay: Duration) {
        self.state.lock().unwrap().write_delay = delay;
    }
    /// The watches of `path` served so far, in order.
    pub fn watches(&self, path: &str) -> Vec<WatchRecord> {
        let c = Self::collection_of(path);
        let s = self.state.lock().unwrap();
        s.watches
            .iter()
            .filter(|w| w.collection == c)
            .cloned()
            .collect()
    }

    /// When a watch of `path` last told its client anything (see [`WatchRecord::last_word`]).
    /// A client that takes every word as proof that `path` is current was last proved current
    /// by its watches no earlier than this.
    pub fn last_watch_word(&self, path: &str) -> Option<std::time::Instant> {
        self.watches(path).iter().filter_map(|w| w.last_word).max()
    }

    /// Requests with this method whose path contains `fragment`.
    pub fn count(&self, method: &str, fragment: &str) -> usize {
        let s = self.state.lock().unwrap();
        s.requests
            .iter()
            .filter(|r| r.method == method && r.uri.contains(fragment))
            .count()
    }

    /// The request URIs, in order.
    pub fn requests(&self) -> Vec<String> {
        let s = self.state.lock().unwrap();
        s.requests.iter().map(|r| r.uri.clone()).collect()
    }
    pub fn recorded(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        let query: HashMap<String, String> = req
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), decode(v)))
            .collect();
        let method = req.method().as_str().to_string();
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let authorization = header("authorization");
        let content_type = header("content-type");
        let replica = header(REPLICA_HEADER);
        let uri = req.uri().to_string();
        let bytes = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Option<Value> = serde_json::from_slice(&bytes).ok();
        let (index, hang, hang_collections, nrt_missing, token, delay, jobsets, trips, cut_off) = {
            let mut s = self.state.lock().unwrap();
            if let Some((role, features)) = &s.rbac {
                let pq = uri
                    .split_once("://")
                    .and_then(|(_, rest)| rest.find('/').map(|i| rest[i..].to_string()))
                    .unwrap_or_else(|| uri.clone());
                if !switchyard::rbac::request_is_covered_with(*role, features, &method, &pq) {
                    s.uncovered.push(format!("{method} {pq}"));
                }
            }
            s.requests.push(Recorded {
                method: method.clone(),
                uri: uri.clone(),
                authorization: authorization.clone(),
                content_type: content_type.clone(),
                body: body.clone(),
                status: None,
                replica: replica.clone(),
                at: std::time::Instant::now(),
            });
            let index = s.requests.len() - 1;
            let delay = if method == "GET" {
                Duration::ZERO
            } else {
                s.write_delay
            };
            (
                index,
                s.hang,
                s.hang_collections,
                s.nrt_missing,
                s.token.clone(),
                delay,
                s.jobsets,
                s.trips.clone(),
                s.partitioned && replica.is_some(),
            )
        };
        let write = method != "GET" && uri.contains("/jobs");
        let response = async {
            if cut_off {
                return full(
                    503,
                    status(503, "ServiceUnavailable", "dial tcp: connection refused"),
                );
            }
            if trips.iter().any(|t| t.fenced(replica.as_deref())) {
                return full(
                    503,
                    status(503, "ServiceUnavailable", "fenced: this client is dead"),
                );
            }
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if hang || (hang_collections && path != "/version") {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            if let Some(token) = token {
                if authorization.as_deref() != Some(&format!("Bearer {token}")) {
                    return full(401, status(401, "Unauthorized", "Unauthorized"));
                }
            }
            if path == "/version" {
                return full(
                    200,
                    json!({"major": "1", "minor": "36", "gitVersion": "v1.36.2",
                    "gitCommit": "fake", "gitTreeState": "clean", "buildDate": "2026-11-01T00:00:00Z",
                    "goVersion": "go1.25", "compiler": "gc", "platform": "linux/amd64"}),
                );
            }
            let not_served = || {
                full(
                    404,
                    status(
                        404,
                        "NotFound",
                        "the server could not find the requested resource",
                    ),
                )
            };
            if path.trim_end_matches('/') == format!("/apis/{JOBSET_GROUP_VERSION}") && jobsets {
                return full(
                    200,
                    json!({"kind": "APIResourceList", "apiVersion": "v1",
                        "groupVersion": JOBSET_GROUP_VERSION,
                        "resources": [
                            {"name": "jobsets", "singularName": "jobset", "namespaced": true,
                             "kind": "JobSet", "verbs": ["delete", "deletecollection", "get",
                             "list", "patch", "create", "update", "watch"]},
                            {"name": "jobsets/status", "singularName": "", "namespaced": true,
                             "kind": "JobSet", "verbs": ["get", "patch", "update"]}]}),
                );
            }
            let Some(t) = parse_target(&path) else {
                return not_served();
            };
            if kind_of(&t.plural).is_none()
                || (t.collection == NRTS && nrt_missing)
                || (t.collection == JOBSETS && !jobsets)
            {
                return not_served();
            }
            let mishap = {
                let mut s = self.state.lock().unwrap();
                let text = body.as_ref().map(Value::to_string).unwrap_or_default();
                let once = s.failures.iter_mut().find(|f| {
                    f.times > 0
                        && f.method == method
                        && uri.contains(&f.uri_contains)
                        && f.body_contains.as_deref().is_none_or(|b| text.contains(b))
                });
                match once {
                    Some(f) => {
                        f.times -= 1;
                        Some(f.what.clone())
                    }
                    None => s
                        .refusals
                        .iter()
                        .find(|r| {
                            r.method == method && r.plural == t.plural && r.sub == t.sub.as_deref()
                        })
                        .cloned()
                        .map(Mishap::Refuse),
                }
            };
            let loss = match mishap {
                Some(Mishap::Refuse(r)) => {
                    let mut body = status(r.code, r.reason, &r.message);
                    if let Some(name) = &t.name {
                        body["details"] = json!({"name": name, "kind": t.plural});
                    }
                    return full(r.code, body);
                }
                Some(Mishap::Late(d)) => {
                    tokio::time::sleep(d).await;
                    None
                }
                Some(Mishap::Lost(loss)) => Some(loss),
                None => None,
            };
            let answer = self.answer(&t, &method, &query, content_type.as_deref(), body);
            if write && answer.status().is_success() {
                for trip in &trips {
                    trip.wrote(replica.as_deref());
                }
            }
            match loss {
                None => answer,
                Some(Loss::Error) => full(
                    500,
                    status(
                        500,
                        "InternalError",
                        "Internal error occurred: the server was unable to return a response in the time allotted, but may still be processing the request",
                    ),
                ),
                Some(Loss::Hang(d)) => {
                    tokio::time::sleep(d).await;
                    answer
                }
            }
        }
        .await;
        let code = response.status().as_u16();
        if let Some(r) = self.state.lock().unwrap().requests.get_mut(index) {
            r.status = Some(code);
        }
        response
    }

    /// The answer to a request that reached the objects.
    fn answer(
        &self,
        t: &Target,
        method: &str,
        query: &HashMap<String, String>,
        content_type: Option<&str>,
        body: Option<Value>,
    ) -> Response<Body> {
        match (method, &t.name) {
            ("GET", None) if query.get("watch").map(String::as_str) == Some("true") => {
                self.watch(t, query)
            }
            ("GET", None) => self.list_objects(t, query),
            ("GET", Some(name)) => {
                match self.get(&t.collection, t.namespace.as_deref().unwrap_or(""), name) {
                    Some(obj) => full(200, obj),
                    None => self.not_found(t, name),
                }
            }
            ("POST", None) => self.retried(|| self.create(t, body.clone())),
            ("PUT", Some(name)) => self.retried(|| self.replace(t, name, body.clone())),
            ("PATCH", Some(name)) => {
                self.retried(|| self.patch(t, name, content_type, body.clone()))
            }
            ("DELETE", Some(name)) => self.retried(|| self.delete_named(t, name, body.as_ref())),
            _ => full(
                405,
                status(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                ),
            ),
        }
    }

    /// A write handler's answer, read and written again while the object moves under it, as
    /// kube-apiserver retries an update whose compare-and-swap lost.
    fn retried(&self, mut write: impl FnMut() -> Result<Response<Body>, Moved>) -> Response<Body> {
        for _ in 0..1000 {
            if let Ok(r) = write() {
                return r;
            }
        }
        panic!("an object changed under 1000 writes in a row");
    }

    fn delete_named(
        &self,
        t: &Target,
        name: &str,
        body: Option<&Value>,
    ) -> Result<Response<Body>, Moved> {
        let ns = t.namespace.clone().unwrap_or_default();
        let Some(obj) = self.get(&t.collection, &ns, name) else {
            return Ok(self.not_found(t, name));
        };
        let want = body.and_then(|b| b["preconditions"]["uid"].as_str());
        let have = obj["metadata"]["uid"].as_str().unwrap_or_default();
        if let Some(want) = want.filter(|w| *w != have) {
            return Ok(full(
                409,
                object_status(
                    t,
                    name,
                    409,
                    "Conflict",
                    format!("Operation cannot be fulfilled on {}.{} {name:?}: the UID in the precondition ({want}) does not match the UID in record ({have}). The object might have been deleted and then recreated", kind_of(&t.plural).unwrap_or_default(), t.group),
                ),
            ));
        }
        let at = Expect::Version(version_of(&obj));
        Ok(full(200, self.emit_if(&t.collection, "DELETED", at, obj)?))
    }

    fn not_found(&self, t: &Target, name: &str) -> Response<Body> {
        full(
            404,
            object_status(
                t,
                name,
                404,
                "NotFound",
                format!("{} {name:?} not found", resource(t)),
            ),
        )
    }

    fn filter(t: &Target, query: &HashMap<String, String>) -> Filter {
        Filter {
            namespace: t.namespace.clone(),
            labels: query.get("labelSelector").cloned(),
            fields: query.get("fieldSelector").cloned(),
        }
    }

    fn list_objects(&self, t: &Target, query: &HashMap<String, String>) -> Response<Body> {
        let mut s = self.state.lock().unwrap();
        if s.fail_lists > 0 {
            s.fail_lists -= 1;
            return full(
                500,
                status(
                    500,
                    "InternalError",
                    "Internal error occurred: etcdserver: request timed out",
                ),
            );
        }
        let filter = Self::filter(t, query);
        let kind = kind_of(&t.plural).unwrap_or("Unknown");
        let items: Vec<Value> = s
            .collections
            .get(&t.collection)
            .map(|c| {
                c.objects
                    .values()
                    .filter(|o| filter.matches(o))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        full(
            200,
            json!({"kind": format!("{kind}List"), "apiVersion": t.api_version,
                   "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
        )
    }

    fn create(&self, t: &Target, body: Option<Value>) -> Result<Response<Body>, Moved> {
        let Some(mut obj) = body.filter(Value::is_object) else {
            return Ok(full(
                400,
                status(
                    400,
                    "BadRequest",
                    "the body of the request could not be decoded",
                ),
            ));
        };
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if let Some(ns) = &t.namespace {
            obj["metadata"]["namespace"] = json!(ns);
        }
        let ns = t.namespace.clone().unwrap_or_default();
        let require = self.state.lock().unwrap().require_namespaces;
        if require && !ns.is_empty() && self.get(NAMESPACES, "", &ns).is_none() {
            return Ok(full(
                404,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": format!("namespaces {ns:?} not found"), "reason": "NotFound",
                       "details": {"name": ns, "kind": "namespaces"}, "code": 404}),
            ));
        }
        if self.get(&t.collection, &ns, &name).is_some() {
            return Ok(full(
                409,
                object_status(
                    t,
                    &name,
                    409,
                    "AlreadyExists",
                    format!("{} {name:?} already exists", resource(t)),
                ),
            ));
        }
        if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("resourceVersion");
        }
        Ok(full(
            201,
            self.emit_if(&t.collection, "ADDED", Expect::Absent, obj)?,
        ))
    }

    fn replace(
        &self,
        t: &Target,
        name: &str,
        body: Option<Value>,
    ) -> Result<Response<Body>, Moved> {
        let ns = t.namespace.clone().unwrap_or_default();
        let Some(old) = self.get(&t.collection, &ns, name) else {
            return Ok(self.not_found(t, name));
        };
        let Some(mut obj) = body.filter(Value::is_object) else {
            return Ok(full(
                400,
                status(
                    400,
                    "BadRequest",
                    "the body of the request could not be decoded",
                ),
            ));
        };
        let sent = obj["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        if sent.is_some_and(|rv| Some(rv.as_str()) != old["metadata"]["resourceVersion"].as_str()) {
            return Ok(full(
                409,
                object_status(
                    t,
                    name,
                    409,
                    "Conflict",
                    format!("Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again", resource(t)),
                ),
            ));
        }
        obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
        obj["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
        if !ns.is_empty() {
            obj["metadata"]["namespace"] = json!(ns);
        }
        if has_status_subresource(&t.plural) {
            obj["status"] = old["status"].clone();
        }
        let at = Expect::Version(version_of(&old));
        Ok(full(200, self.emit_if(&t.collection, "MODIFIED", at, obj)?))
    }

    fn patch(
        &self,
        t: &Target,
        name: &str,
        content_type: Option<&str>,
        body: Option<Value>,
    ) -> Result<Response<Body>, Moved> {
        if content_type != Some("application/merge-patch+json") {
            return Ok(full(
                415,
                status(415, "UnsupportedMediaType", "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"),
            ));
        }
        let ns = t.namespace.clone().unwrap_or_default();
        let Some(old) = self.get(&t.collection, &ns, name) else {
            return Ok(self.not_found(t, name));
        };
        let Some(patch) = body else {
            return Ok(full(
                400,
                status(
                    400,
                    "BadRequest",
                    "the body of the request could not be decoded",
                ),
            ));
        };
        if let Some(rv) = patch["metadata"]["resourceVersion"].as_str() {
            if Some(rv) != old["metadata"]["resourceVersion"].as_str() {
                return Ok(full(
                    409,
                    object_status(
                        t,
                        name,
                        409,
                        "Conflict",
                        format!("Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again", resource(t)),
                    ),
                ));
            }
        }
        let mut obj = old.clone();
        match t.sub.as_deref() {
            Some("status") => {
                let mut st = old["status"].clone();
                json_patch::merge(&mut st, &patch["status"]);
                obj["status"] = st;
                if let Some(labels) = patch["metadata"].get("labels") {
                    json_patch::merge(&mut obj["metadata"]["labels"], labels);
                }
            }
            Some(_) => return Ok(self.not_found(t, name)),
            None => {
                json_patch::merge(&mut obj, &patch);
                if has_status_subresource(&t.plural) {
                    obj["status"] = old["status"].clone();
                }
            }
        }
        obj["metadata"]["name"] = json!(name);
        if let Some(refused) = self.status_rules(t, name, &old, &obj) {
            return Ok(refused);
        }
        let at = Expect::Version(version_of(&old));
        Ok(full(200, self.emit_if(&t.collection, "MODIFIED", at, obj)?))
    }

    /// The 422 the API server answers a Job status write that breaks its rules, when they
    /// are enforced; the violation is kept.
    fn status_rules(
        &self,
        t: &Target,
        name: &str,
        old: &Value,
        new: &Value,
    ) -> Option<Response<Body>> {
        if !["jobs", "jobsets"].contains(&t.plural.as_str()) || t.sub.as_deref() != Some("status") {
            return None;
        }
        let mut s = self.state.lock().unwrap();
        if !s.job_status_rules {
            return None;
        }
        let (kind, rule) = if t.plural == "jobs" {
            let suspended = new["spec"]["suspend"] == true;
            let rule = super::job_rules::violation(&old["status"], &new["status"], suspended);
            ("Job", rule?)
        } else {
            ("JobSet", super::jobset_rules::violation(&new["status"])?)
        };
        s.status_violations.push(format!(
            "{kind} {name}: {rule}\n  before: {}\n  after:  {}",
            old["status"], new["status"]
        ));
        Some(full(
            422,
            object_status(
                t,
                name,
                422,
                "Invalid",
                match kind {
                    "Job" => format!("Job.batch {name:?} is invalid: {rule}"),
                    _ => format!("JobSet.jobset.x-k8s.io {name:?} is invalid: {rule}"),
                },
            ),
        ))
    }

    fn watch(&self, t: &Target, query: &HashMap<String, String>) -> Response<Body> {
        let from: u64 = query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let asked = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
        let filter = Self::filter(t, query);
        let mut s = self.state.lock().unwrap();
        let bookmarks = asked && !s.withhold_bookmarks;
        let silent = s.hang_watches.contains(&t.collection);
        let pending = s.expire_watches.get(&t.collection).copied().unwrap_or(0);
        let expired = pending > 0 && !silent;
        if expired {
            s.expire_watches.insert(t.collection.clone(), pending - 1);
        }
        let replay: Vec<(u64, String)> = s
            .collections
            .get(&t.collection)
            .map(|c| {
                c.log
                    .iter()
                    .filter(|(rv, obj, _)| *rv > from && filter.matches(obj))
                    .map(|(rv, _, l)| (*rv, l.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let index = s.watches.len();
        s.watches.push(WatchRecord {
            collection: t.collection.clone(),
            from,
            last_sent: None,
            last_word: None,
        });
        let mut live = s.live.subscribe();
        let mut kick = s.kick.subscribe();
        // Everything up to here is either replayed or not this watch's: a bookmark may say so.
        let mut seen = s.rv.max(from);
        let max = s.max_watch;
        let bookmark_every = s.bookmark_every;
        drop(s);
        let collection = t.collection.clone();
        let kind = kind_of(&t.plural).unwrap_or("Unknown").to_string();
        let api_version = t.api_version.clone();
        let bookmark = move |rv: u64| {
            json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
                   "metadata": {"resourceVersion": rv.to_string()}}})
            .to_string()
                + "\n"
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
        let state = self.state.clone();
        let held = tx.clone();
        // Sends one line of the stream and records its resourceVersion; false once the
        // client is gone.
        let send = move |line: String, rv: u64| {
            let tx = tx.clone();
            let state = state.clone();
            async move {
                let sent = tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_ok();
                if sent {
                    let mut s = state.lock().unwrap();
                    s.watches[index].last_sent = Some(rv);
                    s.watches[index].last_word = Some(std::time::Instant::now());
                }
                sent
            }
        };
        let ends = {
            let state = self.state.clone();
            move || state.lock().unwrap().watches[index].last_word = Some(std::time::Instant::now())
        };
        tokio::spawn(async move {
            if silent {
                // Hold the stream open without a byte until the client gives up, or the
                // server ends every watch (`end_watches`: a restart ends silent ones too).
                tokio::select! {
                    _ = held.closed() => {}
                    _ = kick.changed() => {}
                }
                return;
            }
            drop(held);
            if expired {
                let line = json!({"type": "ERROR", "object": status(410, "Expired", &format!("too old resource version: {from} ({})", from + 1000))}).to_string() + "\n";
                send(line, from).await;
                return;
            }
            for (rv, line) in replay {
                if !send(line, rv).await {
                    return;
                }
            }
            let deadline = tokio::time::sleep(max);
            tokio::pin!(deadline);
            let mut ticker = tokio::time::interval(bookmark_every);
            ticker.tick().await;
            loop {
                tokio::select! {
                    _ = &mut deadline => {
                        if bookmarks {
                            send(bookmark(seen), seen).await;
                        }
                        ends();
                        return;
                    }
                    _ = kick.changed() => return,
                    _ = ticker.tick(), if bookmarks => {
                        if !send(bookmark(seen), seen).await {
                            return;
                        }
                    }
                    ev = live.recv() => match ev {
                        Ok((c, rv, obj, line)) => {
                            seen = seen.max(rv);
                            if c == collection && rv > from && filter.matches(&obj)
                                && !send(line, rv).await
                            {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            }
        });
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(StreamBody::new(stream).boxed())
            .unwrap()
    }
}

/// A Node as the API server returns it, with `cpu` CPUs and `gpus` GPUs allocatable.
pub fn node(name: &str, cpu: u32, gpus: u32) -> Value {
    json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": "2026-11-22T03:52:38Z",
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "spec": {},
        "status": {
            "capacity": {"cpu": cpu.to_string(), "memory": "128Gi", "nvidia.com/gpu": gpus.to_string(), "pods": "110"},
            "allocatable": {"cpu": cpu.to_string(), "memory": "128Gi", "nvidia.com/gpu": gpus.to_string(), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": "2026-11-22T03:52:38Z", "lastTransitionTime": "2026-11-22T03:52:38Z"}]
        }
    })
}

/// A running pod bound to `node`, requesting `cpu` CPUs.
pub fn pod(name: &str, node: &str, cpu: u32) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "creationTimestamp": "2026-11-22T03:52:38Z"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox",
                 "resources": {"requests": {"cpu": cpu.to_string(), "memory": "1Gi"}}}]},
        "status": {"phase": "Running"}
    })
}

/// A NodeResourceTopology for `node`: two zones with `free` GPUs each, single-numa-node.
pub fn nrt(node: &str, free: (u32, u32)) -> Value {
    let zone = |i: u32, f: u32| {
        json!({"name": format!("node-{i}"), "type": "Node", "resources": [
        {"name": "nvidia.com/gpu", "capacity": "4", "allocatable": "4", "available": f.to_string()}]})
    };
    json!({
        "metadata": {"name": node, "uid": format!("nrt-{node}")},
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                       {"name": "topologyManagerScope", "value": "container"}],
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "zones": [zone(0, free.0), zone(1, free.1)]
    })
}

/// A Secret in `namespace` holding `kubeconfig` under the key `kubeconfig`, as the API
/// server returns Secrets (data base64-encoded).
pub fn kubeconfig_secret(namespace: &str, name: &str, kubeconfig: &str) -> Value {
    use base64::Engine;
    json!({
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": {"kubeconfig": base64::engine::general_purpose::STANDARD.encode(kubeconfig)}
    })
}

/// A WorkerCluster whose kubeconfig is the Secret `secret`, with the given labels.
pub fn worker_cluster(name: &str, secret: &str, labels: Value) -> Value {
    json!({
        "metadata": {"name": name, "generation": 1},
        "spec": {"kubeConfig": {"location": secret, "locationType": "Secret"}, "labels": labels}
    })
}
