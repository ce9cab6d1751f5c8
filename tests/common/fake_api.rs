//! A small kube-apiserver stand-in on loopback that speaks list and watch the way the real one
//! does (shapes from tests/fixtures/kube-api: list metadata.resourceVersion, one JSON object
//! per chunk in watches, ERROR events carrying a 410 Status, streams that end at
//! timeoutSeconds), with knobs to break it: fail lists, expire watches, hang.

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

/// The collections served, by path.
pub const NODES: &str = "/api/v1/nodes";
pub const PODS: &str = "/api/v1/pods";
pub const NRTS: &str = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies";

#[derive(Default)]
struct Collection {
    objects: BTreeMap<String, Value>,
    /// (resourceVersion, event line) for replay to watches that start behind.
    log: Vec<(u64, String)>,
}

struct State {
    rv: u64,
    collections: HashMap<&'static str, Collection>,
    live: broadcast::Sender<(&'static str, u64, String)>,
    fail_lists: u32,
    expire_watches: HashMap<&'static str, u32>,
    hang: bool,
    nrt_missing: bool,
    /// Longest a watch stays open (the real server uses timeoutSeconds; tests want it short).
    max_watch: Duration,
    pub requests: Vec<String>,
}

#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    pub addr: SocketAddr,
}

fn kind_of(path: &str) -> (&'static str, &'static str, &'static str) {
    match path {
        NODES => ("Node", "NodeList", "v1"),
        PODS => ("Pod", "PodList", "v1"),
        _ => (
            "NodeResourceTopology",
            "NodeResourceTopologyList",
            "topology.node.k8s.io/v1alpha2",
        ),
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn full(status: u16, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

impl FakeApi {
    pub async fn start() -> Self {
        let (live, _) = broadcast::channel(1024);
        let mut collections = HashMap::new();
        for p in [NODES, PODS, NRTS] {
            collections.insert(p, Collection::default());
        }
        let state = Arc::new(Mutex::new(State {
            rv: 100,
            collections,
            live,
            fail_lists: 0,
            expire_watches: HashMap::new(),
            hang: false,
            nrt_missing: false,
            max_watch: Duration::from_secs(2),
            requests: Vec::new(),
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let api = FakeApi { state, addr };
        let server = api.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let api = server.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let api = api.clone();
                        async move { Ok::<_, Infallible>(api.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        api
    }

    /// A kubeconfig-free client for this server (plain HTTP on loopback).
    pub fn client(&self) -> kube::Client {
        switchyard::install_crypto_provider();
        let config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    fn emit(&self, path: &'static str, kind: &str, mut obj: Value) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let (k, _, api_version) = kind_of(path);
        obj["kind"] = json!(k);
        obj["apiVersion"] = json!(api_version);
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let col = s.collections.get_mut(path).unwrap();
        let ty = match kind {
            "DELETED" => {
                col.objects.remove(&name);
                "DELETED"
            }
            _ if col.objects.contains_key(&name) => "MODIFIED",
            _ => "ADDED",
        };
        if ty != "DELETED" {
            col.objects.insert(name, obj.clone());
        }
        let line = json!({"type": ty, "object": obj}).to_string() + "\n";
        col.log.push((rv, line.clone()));
        let _ = s.live.send((path, rv, line));
    }

    pub fn upsert(&self, path: &'static str, obj: Value) {
        self.emit(path, "UPSERT", obj);
    }

    pub fn delete(&self, path: &'static str, name: &str) {
        let obj = self.state.lock().unwrap().collections[path]
            .objects
            .get(name)
            .cloned();
        if let Some(obj) = obj {
            self.emit(path, "DELETED", obj);
        }
    }

    pub fn fail_next_lists(&self, n: u32) {
        self.state.lock().unwrap().fail_lists = n;
    }
    /// The next `n` watches of `path` get a 410 Expired ERROR event, as after compaction.
    pub fn expire_next_watches(&self, path: &'static str, n: u32) {
        self.state.lock().unwrap().expire_watches.insert(path, n);
    }
    pub fn set_hang(&self, hang: bool) {
        self.state.lock().unwrap().hang = hang;
    }
    pub fn set_nrt_missing(&self, missing: bool) {
        self.state.lock().unwrap().nrt_missing = missing;
    }
    pub fn requests(&self) -> Vec<String> {
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
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (hang, nrt_missing) = {
            let mut s = self.state.lock().unwrap();
            s.requests.push(req.uri().to_string());
            (s.hang, s.nrt_missing)
        };
        if hang {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        if path == "/version" {
            return full(
                200,
                json!({"major": "1", "minor": "36", "gitVersion": "v1.36.2",
                "gitCommit": "fake", "gitTreeState": "clean", "buildDate": "2026-11-01T00:00:00Z",
                "goVersion": "go1.25", "compiler": "gc", "platform": "linux/amd64"}),
            );
        }
        let collection: &'static str = match path.as_str() {
            NODES => NODES,
            PODS => PODS,
            NRTS if !nrt_missing => NRTS,
            _ => {
                return full(
                    404,
                    status(
                        404,
                        "NotFound",
                        "the server could not find the requested resource",
                    ),
                )
            }
        };
        if query.get("watch").map(String::as_str) == Some("true") {
            return self.watch(collection, &query);
        }
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
        let (_, list_kind, api_version) = kind_of(collection);
        let items: Vec<Value> = s.collections[collection]
            .objects
            .values()
            .cloned()
            .collect();
        full(
            200,
            json!({"kind": list_kind, "apiVersion": api_version,
                         "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
        )
    }

    fn watch(&self, collection: &'static str, query: &HashMap<String, String>) -> Response<Body> {
        let from: u64 = query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut s = self.state.lock().unwrap();
        let pending = s.expire_watches.get(collection).copied().unwrap_or(0);
        let expired = pending > 0;
        if expired {
            s.expire_watches.insert(collection, pending - 1);
        }
        let replay: Vec<String> = s.collections[collection]
            .log
            .iter()
            .filter(|(rv, _)| *rv > from)
            .map(|(_, l)| l.clone())
            .collect();
        let mut live = s.live.subscribe();
        let max = s.max_watch;
        drop(s);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
        tokio::spawn(async move {
            if expired {
                let line = json!({"type": "ERROR", "object": status(410, "Expired", &format!("too old resource version: {from} ({})", from + 1000))}).to_string() + "\n";
                let _ = tx.send(Ok(Frame::data(Bytes::from(line)))).await;
                return;
            }
            for line in replay {
                if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                    return;
                }
            }
            let deadline = tokio::time::sleep(max);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = &mut deadline => return,
                    ev = live.recv() => match ev {
                        Ok((path, rv, line)) if path == collection && rv > from => {
                            if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
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
