//! The kube-scheduler extender (k8s.io/kube-scheduler/extender/v1) over the placement engine.
//!
//! The Go types carry no JSON tags, so the wire names are PascalCase (`Pod`, `NodeNames`,
//! `FailedAndUnresolvableNodes`, `Host`, `Score`); any casing is accepted on input. A name that
//! is a cluster's virtual node (`switchyard-<cluster>`) is judged as the whole cluster for a
//! gang of `switchyard.dev/gang-size` pods; other names are real nodes of the inventory.

pub mod http;

use crate::inventory::{Inventory, InventoryStore};
use crate::placement::inflight::{InFlight, Reservation};
use crate::placement::{
    fit_cluster, fit_node, BoundPod, EngineConfig, Misfit, NodeJudge, NodeState, PodShape, PodView,
};
use serde::Serialize;
use serde_json::value::RawValue;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const FILTER_PATH: &str = "/scheduler/filter";
pub const PRIORITIZE_PATH: &str = "/scheduler/prioritize";
pub const BIND_PATH: &str = "/scheduler/bind";

#[derive(Debug, Clone)]
pub struct ExtenderConfig {
    pub engine: EngineConfig,
    /// Virtual node names are this prefix followed by the cluster name.
    pub virtual_node_prefix: String,
    /// How long a bound placement is held in the in-flight accounting.
    pub inflight_ttl: Duration,
}

impl Default for ExtenderConfig {
    fn default() -> Self {
        Self {
            engine: EngineConfig::default(),
            virtual_node_prefix: "switchyard-".into(),
            inflight_ttl: Duration::from_secs(30),
        }
    }
}

/// A node's verdict, as the extender reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Fits { score: i64 },
    Fails { reason: String, unresolvable: bool },
}

/// Below this many candidates a filter runs on the calling thread: a thread costs more than
/// judging a few hundred nodes.
const PARALLEL_MIN: usize = 512;

/// The pure filter: every candidate name judged against one inventory snapshot. Long lists
/// are split over the machine's cores (kube-scheduler waits for each call, so they are idle);
/// the verdicts come back in the order of `names`.
pub fn judge(
    inventory: &Inventory,
    inflight: &InFlight,
    shape: &PodShape,
    names: &[String],
    config: &ExtenderConfig,
    now: Instant,
) -> Vec<Verdict> {
    let bound = shape.bind(&inventory.resources);
    let strategy = shape.strategy(config.engine.strategy);
    let gang = shape.gang_size();
    let chunk = |names: &[String]| -> Vec<Verdict> {
        let mut nodes = NodeJudge::new(
            &inventory.resources,
            shape,
            &bound,
            &config.engine,
            strategy,
        );
        names
            .iter()
            .map(|name| {
                judge_name(
                    inventory, inflight, shape, &bound, &gang, &mut nodes, name, config, now,
                )
            })
            .collect()
    };
    let threads = parallelism().min(names.len() / PARALLEL_MIN).max(1);
    if threads == 1 {
        return chunk(names);
    }
    let per = names.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let mut parts = names.chunks(per);
        let first = parts.next().unwrap_or_default();
        let rest: Vec<_> = parts.map(|p| scope.spawn(move || chunk(p))).collect();
        let mut out = chunk(first);
        for handle in rest {
            match handle.join() {
                Ok(v) => out.extend(v),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

/// The cores this process may use, read once.
fn parallelism() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// One candidate: a virtual node judged as its whole cluster, else a real node.
#[allow(clippy::too_many_arguments)]
fn judge_name(
    inventory: &Inventory,
    inflight: &InFlight,
    shape: &PodShape,
    bound: &BoundPod,
    gang: &Result<usize, String>,
    nodes: &mut NodeJudge<'_>,
    name: &str,
    config: &ExtenderConfig,
    now: Instant,
) -> Verdict {
    let fails = |m: Misfit| Verdict::Fails {
        unresolvable: m.unresolvable(),
        reason: m.to_string(),
    };
    let cluster = name
        .strip_prefix(config.virtual_node_prefix.as_str())
        .and_then(|c| inventory.cluster(c));
    if let Some(cluster) = cluster {
        let n = match gang {
            Ok(n) => *n,
            Err(e) => return fails(Misfit::BadPod(e.clone())),
        };
        let cluster = inflight.cluster(cluster, &inventory.resources, now);
        let fit = fit_cluster(
            &cluster,
            &inventory.resources,
            shape,
            bound,
            n,
            &config.engine,
            shape.strategy(config.engine.strategy),
        );
        return match fit.misfit {
            None => Verdict::Fits { score: fit.score },
            Some(m) => fails(m),
        };
    }
    let Some((cluster, node)) = inventory.node(name) else {
        return fails(Misfit::UnknownNode(name.to_string()));
    };
    if let Some(why) = &cluster.unavailable {
        return fails(Misfit::Unavailable(why.clone()));
    }
    match nodes.judge(&inflight.node(node, now)) {
        Ok(score) => Verdict::Fits { score },
        Err(m) => Verdict::Fails {
            unresolvable: m.unresolvable(),
            reason: m.on_the_node(),
        },
    }
}

/// The extender's state, shared by its handlers.
pub struct Extender {
    pub store: Arc<InventoryStore>,
    pub config: ExtenderConfig,
    inflight: Mutex<InFlight>,
    /// Pod analysis and filter verdicts by (uid, resourceVersion): prioritize follows filter
    /// for the same pod within milliseconds and reuses both.
    memo: moka::sync::Cache<(String, String), Arc<Memo>>,
    /// The last analysis of each pod by uid, for bind (which carries no resourceVersion).
    by_uid: moka::sync::Cache<String, Arc<PodShape>>,
    client: Option<kube::Client>,
}

struct Memo {
    shape: Arc<PodShape>,
    scores: Mutex<HashMap<String, i64>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExtenderError {
    #[error("{0}")]
    BadRequest(String),
}

/// The top-level keys of an extender request, lower-cased, each value still the request's
/// own bytes.
type Fields<'b> = HashMap<String, &'b RawValue>;

/// Reads the top-level keys of an extender request in any casing.
fn fields(body: &[u8]) -> Result<Fields<'_>, ExtenderError> {
    let map: BTreeMap<String, &RawValue> = serde_json::from_slice(body).map_err(|e| {
        ExtenderError::BadRequest(format!("body is not a JSON extender request: {e}"))
    })?;
    Ok(map
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect())
}

fn field<'a>(f: &Fields<'a>, name: &str) -> Option<&'a RawValue> {
    f.get(name).copied().filter(|v| v.get().trim() != "null")
}

#[derive(serde::Deserialize)]
struct NodeItemName {
    #[serde(default)]
    metadata: NodeItemMeta,
}

#[derive(serde::Deserialize, Default)]
struct NodeItemMeta {
    #[serde(default)]
    name: String,
}

/// The candidate nodes of a request, in whichever form they came.
enum Candidates {
    Names(Vec<String>),
    /// Full Node objects, kept verbatim to be answered verbatim.
    Nodes {
        names: Vec<String>,
        items: Vec<Box<RawValue>>,
        list_meta: Option<Box<RawValue>>,
    },
}

impl Candidates {
    fn names(&self) -> &[String] {
        match self {
            Candidates::Names(n) | Candidates::Nodes { names: n, .. } => n,
        }
    }
}

fn candidates(f: &Fields<'_>) -> Result<Candidates, ExtenderError> {
    if let Some(raw) = field(f, "nodenames") {
        let names: Vec<String> = serde_json::from_str(raw.get()).map_err(|e| {
            ExtenderError::BadRequest(format!("NodeNames is not a list of names: {e}"))
        })?;
        return Ok(Candidates::Names(names));
    }
    if let Some(raw) = field(f, "nodes") {
        let list: BTreeMap<String, Box<RawValue>> = serde_json::from_str(raw.get())
            .map_err(|e| ExtenderError::BadRequest(format!("Nodes is not a NodeList: {e}")))?;
        let items: Vec<Box<RawValue>> = match list.get("items") {
            Some(v) if v.get().trim() != "null" => serde_json::from_str(v.get()).map_err(|e| {
                ExtenderError::BadRequest(format!("Nodes.items is not a list: {e}"))
            })?,
            _ => Vec::new(),
        };
        let names = items
            .iter()
            .map(|i| {
                serde_json::from_str::<NodeItemName>(i.get())
                    .map(|n| n.metadata.name)
                    .map_err(|e| {
                        ExtenderError::BadRequest(format!(
                            "a node in Nodes.items is not a Node: {e}"
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        return Ok(Candidates::Nodes {
            names,
            items,
            list_meta: list.get("metadata").cloned(),
        });
    }
    Ok(Candidates::Names(Vec::new()))
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct FilterResult<'a> {
    nodes: Option<NodeListOut<'a>>,
    node_names: Vec<&'a str>,
    failed_nodes: NodeReasons<'a>,
    failed_and_unresolvable_nodes: NodeReasons<'a>,
    error: String,
}

/// Node name to reason, written as a JSON object in the order of the request's names (a
/// map would sort thousands of names for nothing: kube-scheduler reads them into a Go map).
#[derive(Default)]
struct NodeReasons<'a>(Vec<(&'a str, String)>);

impl Serialize for NodeReasons<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

#[derive(Serialize)]
struct NodeListOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a RawValue>,
    items: Vec<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct HostPriority<'a> {
    host: &'a str,
    score: i64,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct BindingResult {
    error: String,
}

impl Extender {
    pub fn new(
        store: Arc<InventoryStore>,
        config: ExtenderConfig,
        client: Option<kube::Client>,
    ) -> Self {
        Self {
            store,
            inflight: Mutex::new(InFlight::new(config.inflight_ttl)),
            config,
            memo: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(30))
                .build(),
            by_uid: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(300))
                .build(),
            client,
        }
    }

    fn pod(&self, f: &Fields<'_>) -> Result<Arc<Memo>, ExtenderError> {
        let raw = field(f, "pod")
            .ok_or_else(|| ExtenderError::BadRequest("request has no Pod".into()))?;
        let view: PodView = serde_json::from_str(raw.get())
            .map_err(|e| ExtenderError::BadRequest(format!("Pod could not be read: {e}")))?;
        let key = view
            .metadata
            .uid
            .clone()
            .zip(view.metadata.resource_version.clone());
        if let Some(memo) = key.as_ref().and_then(|k| self.memo.get(k)) {
            return Ok(memo);
        }
        let shape = Arc::new(
            PodShape::from_view(&view).map_err(|e| ExtenderError::BadRequest(e.to_string()))?,
        );
        let memo = Arc::new(Memo {
            shape: shape.clone(),
            scores: Mutex::new(HashMap::new()),
        });
        if let Some(k) = key {
            self.by_uid.insert(k.0.clone(), shape);
            self.memo.insert(k, memo.clone());
        }
        Ok(memo)
    }

    fn verdicts(&self, shape: &PodShape, names: &[String], now: Instant) -> Vec<Verdict> {
        let inventory = self.store.snapshot();
        let inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        judge(&inventory, &inflight, shape, names, &self.config, now)
    }

    /// `POST /scheduler/filter`: the reply body.
    pub fn filter(&self, body: &[u8], now: Instant) -> Result<Vec<u8>, ExtenderError> {
        let f = fields(body)?;
        let candidates = candidates(&f)?;
        let names = candidates.names();
        let (verdicts, memo) = match self.pod(&f) {
            Ok(memo) => (self.verdicts(&memo.shape, names, now), Some(memo)),
            // A pod whose requests cannot be read fits nowhere; say why on every node.
            Err(ExtenderError::BadRequest(reason)) if field(&f, "pod").is_some() => (
                names
                    .iter()
                    .map(|_| Verdict::Fails {
                        reason: reason.clone(),
                        unresolvable: true,
                    })
                    .collect(),
                None,
            ),
            Err(e) => return Err(e),
        };
        let mut result = FilterResult {
            nodes: None,
            node_names: Vec::new(),
            failed_nodes: NodeReasons::default(),
            failed_and_unresolvable_nodes: NodeReasons::default(),
            error: String::new(),
        };
        let mut passed = Vec::new();
        let mut scores = HashMap::with_capacity(names.len());
        for (i, (name, verdict)) in names.iter().zip(verdicts).enumerate() {
            match verdict {
                Verdict::Fits { score } => {
                    result.node_names.push(name);
                    passed.push(i);
                    scores.insert(name.clone(), score);
                }
                Verdict::Fails {
                    reason,
                    unresolvable: true,
                } => {
                    result.failed_and_unresolvable_nodes.0.push((name, reason));
                }
                Verdict::Fails { reason, .. } => {
                    result.failed_nodes.0.push((name, reason));
                }
            }
        }
        if let Some(memo) = memo {
            *memo.scores.lock().unwrap_or_else(|p| p.into_inner()) = scores;
        }
        if let Candidates::Nodes {
            items, list_meta, ..
        } = &candidates
        {
            result.nodes = Some(NodeListOut {
                metadata: list_meta.as_deref(),
                items: passed
                    .iter()
                    .filter_map(|i| items.get(*i).map(Box::as_ref))
                    .collect(),
            });
        }
        serde_json::to_vec(&result).map_err(|e| ExtenderError::BadRequest(e.to_string()))
    }

    /// `POST /scheduler/prioritize`: a score 0–10 for every candidate, reusing filter's
    /// verdicts for the same pod version when it has them.
    pub fn prioritize(&self, body: &[u8], now: Instant) -> Result<Vec<u8>, ExtenderError> {
        let f = fields(body)?;
        let candidates = candidates(&f)?;
        let names = candidates.names();
        let memo = self.pod(&f)?;
        let known = memo
            .scores
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let missing: Vec<String> = names
            .iter()
            .filter(|n| !known.contains_key(*n))
            .cloned()
            .collect();
        let mut computed = HashMap::new();
        if !missing.is_empty() {
            for (name, v) in missing
                .iter()
                .zip(self.verdicts(&memo.shape, &missing, now))
            {
                computed.insert(
                    name.clone(),
                    match v {
                        Verdict::Fits { score } => score,
                        Verdict::Fails { .. } => 0,
                    },
                );
            }
        }
        let list: Vec<HostPriority> = names
            .iter()
            .map(|n| HostPriority {
                host: n,
                score: known
                    .get(n)
                    .or_else(|| computed.get(n))
                    .copied()
                    .unwrap_or(0),
            })
            .collect();
        serde_json::to_vec(&list).map_err(|e| ExtenderError::BadRequest(e.to_string()))
    }

    /// `POST /scheduler/bind`: records the placement in the in-flight accounting, then posts
    /// the Binding when a Kubernetes API connection exists.
    pub async fn bind(&self, body: &[u8], now: Instant) -> Result<Vec<u8>, ExtenderError> {
        let f = fields(body)?;
        let text = |k: &str| -> Result<String, ExtenderError> {
            let raw = field(&f, k)
                .ok_or_else(|| ExtenderError::BadRequest(format!("binding request has no {k}")))?;
            serde_json::from_str::<String>(raw.get())
                .map_err(|e| ExtenderError::BadRequest(format!("binding field {k}: {e}")))
        };
        let (name, namespace, uid, node) = (
            text("podname")?,
            text("podnamespace")?,
            text("poduid")?,
            text("node")?,
        );
        let mut error = String::new();
        if let Some(shape) = self.by_uid.get(&uid) {
            self.reserve(&uid, &shape, &node, now);
        }
        if let Some(client) = &self.client {
            if let Err(e) = post_binding(client, &namespace, &name, &uid, &node).await {
                self.inflight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .release(&uid);
                error = format!("binding pod {namespace}/{name} to node {node}: {e}");
            }
        }
        serde_json::to_vec(&BindingResult { error })
            .map_err(|e| ExtenderError::BadRequest(e.to_string()))
    }

    fn reserve(&self, owner: &str, shape: &PodShape, node_name: &str, now: Instant) {
        let inventory = self.store.snapshot();
        let Some((_, node)) = inventory.node(node_name) else {
            return;
        };
        let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        inflight.expire(now);
        let node = inflight.node(node, now).into_owned();
        let bound = shape.bind(&inventory.resources);
        let fit = fit_node(
            &node,
            &inventory.resources,
            shape,
            &bound,
            1,
            &self.config.engine,
            false,
        );
        if fit.count == 1 {
            inflight.reserve(Reservation::between(
                owner,
                &node,
                &NodeState::of(&node),
                &fit.state,
                now + self.config.inflight_ttl,
            ));
        }
    }

    pub fn inflight_len(&self) -> usize {
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

async fn post_binding(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::Pod;
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), namespace);
    let binding = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}
    });
    let _: serde_json::Value = api
        .create_subresource("binding", name, &kube::api::PostParams::default(), &binding)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::parse_yaml;

    /// Three identical full nodes and one with a taint: the same reason for the same
    /// shortage, whatever the node is called, so that kube-scheduler's FailedScheduling event
    /// counts them on one line; the map key is what names the node.
    #[test]
    fn nodes_refused_for_the_same_reason_get_the_same_text_without_their_name() {
        let node = |name: &str, taint: &str| {
            format!(
                "      - name: {name}\n        allocatable: {{cpu: \"8\", memory: 32Gi, pods: \"110\"}}\n        requested: {{cpu: \"7\"}}\n{taint}"
            )
        };
        let yaml = format!(
            "clusters:\n  - name: eu-1\n    nodes:\n{}{}{}{}",
            node("alpha", ""),
            node("bravo", ""),
            node("charlie-with-a-long-name", ""),
            node(
                "delta",
                "        taints: [{key: dedicated, value: infra, effect: NoSchedule}]\n"
            ),
        );
        let inventory = parse_yaml(&yaml).unwrap();
        let view: PodView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}
        }))
        .unwrap();
        let shape = PodShape::from_view(&view).unwrap();
        let names: Vec<String> = ["alpha", "bravo", "charlie-with-a-long-name", "delta"]
            .map(String::from)
            .to_vec();
        let verdicts = judge(
            &inventory,
            &InFlight::new(Duration::from_secs(30)),
            &shape,
            &names,
            &ExtenderConfig::default(),
            Instant::now(),
        );
        let reasons: Vec<&str> = verdicts
            .iter()
            .map(|v| match v {
                Verdict::Fails { reason, .. } => reason.as_str(),
                Verdict::Fits { .. } => panic!("{v:?}"),
            })
            .collect();
        assert_eq!(
            reasons[0],
            "needs 2 cpu; the node has 1 free of 8 allocatable"
        );
        assert_eq!(reasons[0], reasons[1]);
        assert_eq!(reasons[0], reasons[2]);
        assert_eq!(
            reasons[3],
            "the node has taint dedicated=infra:NoSchedule that the pod does not tolerate"
        );
        for (name, reason) in names.iter().zip(&reasons) {
            assert!(!reason.contains(name.as_str()), "{reason}");
        }
    }
}
