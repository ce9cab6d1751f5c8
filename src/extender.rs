//! The kube-scheduler extender (k8s.io/kube-scheduler/extender/v1) over the placement engine.
//!
//! The Go types carry no JSON tags, so the wire names are PascalCase (`Pod`, `NodeNames`,
//! `FailedAndUnresolvableNodes`, `Host`, `Score`); any casing is accepted on input. A name that
//! is a cluster's virtual node (`switchyard-<cluster>`) is judged as the whole cluster for a
//! gang of `switchyard.dev/gang-size` pods; other names are real nodes of the inventory.

pub(crate) mod http;

use crate::inventory::{Cluster, Inventory, InventoryStore, Node};
use crate::placement::inflight::{InFlight, Reservation};
use crate::placement::parallel::{cores, share_blocks, Blocks};
use crate::placement::{
    fit_cluster, fit_node, shape_for_cluster_nodes, BoundPod, EngineConfig, Misfit, NodeJudge,
    NodeState, PodShape, PodView, Refusal,
};
use serde::Serialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const FILTER_PATH: &str = "/scheduler/filter";
pub const PRIORITIZE_PATH: &str = "/scheduler/prioritize";
pub const BIND_PATH: &str = "/scheduler/bind";

#[derive(Debug, Clone)]
pub struct ExtenderConfig {
    pub(crate) engine: EngineConfig,
    /// Virtual node names are this prefix followed by the cluster name.
    pub(crate) virtual_node_prefix: String,
    /// How long a bound placement is held in the in-flight accounting.
    pub(crate) inflight_ttl: Duration,
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
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Verdict<'a> {
    Fits { score: i64 },
    Fails { reason: &'a str, unresolvable: bool },
}

/// One node's verdict in [`Judged`]: a refusal names its reason in the table.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Fits(i64),
    Fails(u32),
}

/// Reason texts, each kept once: most refused nodes share theirs (texts leave the node's
/// name out), so a filter of thousands of nodes has a few dozen distinct ones.
#[derive(Default)]
struct Reasons {
    texts: Vec<(String, bool)>,
    /// Text to its place in `texts`, by `unresolvable`.
    index: [HashMap<String, u32>; 2],
}

/// The longest reason given for a node, in bytes: real ones are a line of a few hundred; one
/// that quotes a long value from the request (a resource name, a label) is cut, as it is
/// copied for every node it refuses.
const MAX_REASON_BYTES: usize = 512;

/// The most candidate nodes a request may list. The largest Kubernetes clusters run tens of
/// thousands of nodes, and kube-scheduler sends an extender only the nodes its own filters
/// passed; a longer list (millions of names fit the body limit) would cost gigabytes to judge
/// and answer.
const MAX_CANDIDATES: usize = 65_536;

impl Reasons {
    fn id(&mut self, text: String, unresolvable: bool) -> u32 {
        let text = if text.len() > MAX_REASON_BYTES {
            crate::text::shorten(&text, MAX_REASON_BYTES)
        } else {
            text
        };
        let index = &mut self.index[usize::from(unresolvable)];
        if let Some(id) = index.get(text.as_str()) {
            return *id;
        }
        let id = self.texts.len() as u32;
        index.insert(text.clone(), id);
        self.texts.push((text, unresolvable));
        id
    }
}

/// The verdicts of one filter, in the order of its names.
pub struct Judged {
    slots: Vec<Slot>,
    reasons: Reasons,
}

impl Judged {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn verdicts(&self) -> impl ExactSizeIterator<Item = Verdict<'_>> + '_ {
        self.slots.iter().map(|s| self.verdict(*s))
    }

    fn verdict(&self, slot: Slot) -> Verdict<'_> {
        match slot {
            Slot::Fits(score) => Verdict::Fits { score },
            Slot::Fails(id) => {
                let (text, unresolvable) = &self.reasons.texts[id as usize];
                Verdict::Fails {
                    reason: text,
                    unresolvable: *unresolvable,
                }
            }
        }
    }
}

/// Below this many candidates a filter runs on the calling thread alone.
const PARALLEL_MIN: usize = 512;

/// The names a thread takes at a time when a filter is split.
const BLOCK: usize = 256;

/// The pure filter: every candidate name judged against one inventory snapshot. Long lists
/// are split over the machine's cores (kube-scheduler waits for each call, so they are idle);
/// the verdicts come back in the order of `names`.
pub fn filter_names<S: AsRef<str>>(
    inventory: &Arc<Inventory>,
    inflight: &Arc<InFlight>,
    shape: &Arc<PodShape>,
    names: &[S],
    config: &ExtenderConfig,
    now: Instant,
) -> Judged {
    Filtering {
        inventory: inventory.clone(),
        inflight: inflight.clone(),
        shape: shape.clone(),
        names: Arc::new(NameList::copied(names)),
        targets: None,
        config: config.clone(),
        now,
    }
    .run()
}

/// One filter's inputs, owned, so that the process's helper threads can take part in it.
struct Filtering {
    inventory: Arc<Inventory>,
    inflight: Arc<InFlight>,
    shape: Arc<PodShape>,
    names: Arc<NameList>,
    /// What each name stands for, when already looked up in this very snapshot.
    targets: Option<Arc<[Target]>>,
    config: ExtenderConfig,
    now: Instant,
}

/// What one thread judged: its reason table, and its blocks' verdicts by block.
type Part = (Reasons, Vec<(usize, Vec<Slot>)>);

impl Filtering {
    fn run(self) -> Judged {
        let count = self.names.len();
        // The names are judged in blocks that each thread takes in turn, so that a thread
        // that gets no core (the machine's other work, or the caller's) leaves its share to
        // the others instead of holding the reply back.
        let helpers = cores().min(count / PARALLEL_MIN).max(1) - 1;
        let mut parts = share_blocks(count.div_ceil(BLOCK), helpers, move |blocks| {
            self.take_blocks(blocks)
        })
        .into_iter();
        let (mut reasons, mut done) = parts.next().unwrap_or_default();
        for (theirs, their_done) in parts {
            let ids: Vec<u32> = theirs
                .texts
                .into_iter()
                .map(|(text, unresolvable)| reasons.id(text, unresolvable))
                .collect();
            done.extend(their_done.into_iter().map(|(block, slots)| {
                let slots = slots
                    .into_iter()
                    .map(|s| match s {
                        Slot::Fails(id) => Slot::Fails(ids[id as usize]),
                        fits => fits,
                    })
                    .collect();
                (block, slots)
            }));
        }
        done.sort_unstable_by_key(|(block, _)| *block);
        let mut slots = Vec::with_capacity(count);
        for (_, part) in done {
            slots.extend(part);
        }
        Judged { slots, reasons }
    }

    /// One thread's share: the blocks of names it takes, judged.
    fn take_blocks(&self, blocks: &Blocks) -> Part {
        let (inventory, shape, config) = (&*self.inventory, &*self.shape, &self.config);
        let bound = shape.bind(&inventory.resources);
        let gang = shape.gang_size();
        let mut nodes = NodeJudge::new(
            &inventory.resources,
            shape,
            &bound,
            &config.engine,
            shape.strategy(config.engine.strategy),
        );
        let mut reasons = Reasons::default();
        // Each distinct refusal is spelled out once, on the first node refused for it. Most
        // nodes are looked up here, so with a fast hash (SipHash took a tenth of the filter).
        let mut refusals: HashMap<Refusal<'_>, u32, foldhash::fast::RandomState> =
            HashMap::default();
        let mut done = Vec::new();
        while let Some(block) = blocks.take() {
            let start = block * BLOCK;
            let end = (start + BLOCK).min(self.names.len());
            let slots = (start..end)
                .map(|i| {
                    let name = self.names.text(i);
                    let candidate = match self.targets.as_ref().and_then(|t| t.get(i)) {
                        Some(target) => target.get(inventory),
                        None => Candidate::of(inventory, name, config),
                    };
                    let verdict = judge_candidate(
                        inventory,
                        &self.inflight,
                        shape,
                        &bound,
                        &gang,
                        &mut nodes,
                        name,
                        candidate,
                        config,
                        self.now,
                    );
                    match verdict {
                        Ok(score) => Slot::Fits(score),
                        Err(Refused::Text(reason, unresolvable)) => {
                            Slot::Fails(reasons.id(reason, unresolvable))
                        }
                        Err(Refused::Node(refusal, node)) => {
                            Slot::Fails(match refusals.get(&refusal) {
                                Some(id) => *id,
                                None => {
                                    let misfit = refusal.misfit(node);
                                    let id =
                                        reasons.id(misfit.on_the_node(), misfit.unresolvable());
                                    refusals.insert(refusal, id);
                                    id
                                }
                            })
                        }
                    }
                })
                .collect();
            done.push((block, slots));
        }
        (reasons, done)
    }
}

/// What a candidate name stands for in an inventory snapshot.
enum Candidate<'i> {
    /// A virtual node: the whole cluster.
    Cluster(&'i Cluster),
    Node(&'i Cluster, &'i Node),
    Unknown,
}

impl<'i> Candidate<'i> {
    fn of(inventory: &'i Inventory, name: &str, config: &ExtenderConfig) -> Self {
        let cluster = name
            .strip_prefix(config.virtual_node_prefix.as_str())
            .and_then(|c| inventory.cluster(c));
        if let Some(cluster) = cluster {
            return Candidate::Cluster(cluster);
        }
        match inventory.node(name) {
            Some((cluster, node)) => Candidate::Node(cluster, node),
            None => Candidate::Unknown,
        }
    }
}

/// A [`Candidate`] by position in its snapshot, to be kept across calls.
#[derive(Debug, Clone, Copy)]
enum Target {
    Cluster(usize),
    Node(usize, usize),
    Unknown,
}

impl Target {
    fn get<'i>(&self, inventory: &'i Inventory) -> Candidate<'i> {
        let cluster = |c: usize| inventory.clusters.get(c).map(|c| &**c);
        match *self {
            Target::Cluster(c) => cluster(c).map_or(Candidate::Unknown, Candidate::Cluster),
            Target::Node(c, n) => cluster(c)
                .and_then(|c| Some(Candidate::Node(c, c.nodes.get(n)?)))
                .unwrap_or(Candidate::Unknown),
            Target::Unknown => Candidate::Unknown,
        }
    }
}

/// The targets of every name of a NodeNames list, in `inventory`.
fn resolve<S: AsRef<str>>(
    inventory: &Inventory,
    names: &[S],
    config: &ExtenderConfig,
) -> Vec<Target> {
    let at = |cluster: &Cluster| {
        inventory
            .clusters
            .iter()
            .position(|c| std::ptr::eq(&**c, cluster))
    };
    // Node address to index, per cluster, built for the clusters the names are in.
    let mut index: HashMap<usize, HashMap<usize, usize>> = HashMap::new();
    names
        .iter()
        .map(
            |name| match Candidate::of(inventory, name.as_ref(), config) {
                Candidate::Cluster(c) => at(c).map_or(Target::Unknown, Target::Cluster),
                Candidate::Node(c, node) => {
                    let Some(ci) = at(c) else {
                        return Target::Unknown;
                    };
                    index
                        .entry(ci)
                        .or_insert_with(|| {
                            c.nodes
                                .iter()
                                .enumerate()
                                .map(|(i, n)| (Arc::as_ptr(n) as usize, i))
                                .collect()
                        })
                        .get(&(node as *const Node as usize))
                        .map_or(Target::Unknown, |ni| Target::Node(ci, *ni))
                }
                Candidate::Unknown => Target::Unknown,
            },
        )
        .collect()
}

/// Candidate names, owned: a NodeNames list as it came (its raw JSON text), or names copied
/// one after the other.
///
/// The filter keeps the last NodeNames list it read: kube-scheduler sends the same
/// candidates for pod after pod, and reading thousands of names (a tenth of a filter) and
/// looking them up in the inventory's index (a cache miss or more each) need not be done
/// again for it.
struct NameList {
    /// The text the names lie in.
    raw: Box<str>,
    /// Each name of the list, in order.
    names: Vec<Spelled>,
    resolved: Mutex<Option<Resolved>>,
}

impl NameList {
    /// `names`, copied one after the other into one string.
    fn copied<S: AsRef<str>>(names: &[S]) -> Self {
        let mut raw = String::with_capacity(names.iter().map(|n| n.as_ref().len()).sum());
        let names = names
            .iter()
            .map(|name| {
                let start = raw.len();
                raw.push_str(name.as_ref());
                Spelled::At(start..raw.len())
            })
            .collect();
        Self {
            raw: raw.into(),
            names,
            resolved: Mutex::new(None),
        }
    }

    fn len(&self) -> usize {
        self.names.len()
    }

    /// The `i`th name.
    fn text(&self, i: usize) -> &str {
        match &self.names[i] {
            Spelled::At(at) => self.raw.get(at.clone()).unwrap_or_default(),
            Spelled::Escaped(text) => text,
        }
    }
}

/// What each name of a [`NameList`] stands for in one inventory snapshot.
struct Resolved {
    /// The snapshot (held weakly: compared by address only).
    inventory: std::sync::Weak<Inventory>,
    targets: Arc<[Target]>,
}

/// A name of a [`NameList`]: where it lies in the raw text, or its text when it was written
/// with escapes.
enum Spelled {
    At(std::ops::Range<usize>),
    Escaped(Box<str>),
}

impl Spelled {
    /// `name`, as parsed from `raw`.
    fn of(name: &Name<'_>, raw: &str) -> Self {
        if let Cow::Borrowed(text) = name.0 {
            // A borrowed name is a slice of `raw`: its offset is the distance between them.
            let start = (text.as_ptr() as usize).wrapping_sub(raw.as_ptr() as usize);
            let at = start..start.wrapping_add(text.len());
            if raw.get(at.clone()) == Some(text) {
                return Spelled::At(at);
            }
        }
        Spelled::Escaped(name.0.as_ref().into())
    }

    /// The name in `raw`, a JSON text equal to the one it was read from (so that a
    /// borrowed name is one without escapes, as [`Name::write_json`] takes it).
    fn name<'b>(&self, raw: &'b str) -> Name<'b> {
        match self {
            Spelled::At(at) => Name(Cow::Borrowed(raw.get(at.clone()).unwrap_or_default())),
            Spelled::Escaped(text) => Name(Cow::Owned(text.to_string())),
        }
    }
}

/// Why a candidate is refused: its reason text and whether it is unresolvable, or the
/// refusal of a real node, whose text is written once per distinct refusal.
enum Refused<'n> {
    Text(String, bool),
    Node(Refusal<'n>, &'n Node),
}

/// One candidate: a virtual node judged as its whole cluster, else a real node.
#[allow(clippy::too_many_arguments)]
fn judge_candidate<'n>(
    inventory: &Inventory,
    inflight: &InFlight,
    shape: &PodShape,
    bound: &BoundPod,
    gang: &Result<usize, String>,
    nodes: &mut NodeJudge<'n>,
    name: &str,
    candidate: Candidate<'n>,
    config: &ExtenderConfig,
    now: Instant,
) -> Result<i64, Refused<'n>> {
    let fails = |m: Misfit| Err(Refused::Text(m.to_string(), m.unresolvable()));
    let (cluster, node) = match candidate {
        Candidate::Cluster(cluster) => {
            let n = match gang {
                Ok(n) => *n,
                Err(e) => return fails(Misfit::BadPod(e.clone())),
            };
            // The pod selected the virtual node; its terms on the virtual node's own labels
            // are not the worker's nodes' business.
            let shape = if shape.node_selector.is_empty() && shape.required_terms.is_none() {
                Cow::Borrowed(shape)
            } else {
                let own =
                    crate::workers::virtual_node::own_labels(name, &cluster.name, &cluster.labels);
                match shape_for_cluster_nodes(shape, name, &own) {
                    Ok(shape) => shape,
                    Err(m) => return fails(m),
                }
            };
            let cluster = inflight.cluster(cluster, &inventory.resources, now);
            let fit = fit_cluster(
                &cluster,
                &inventory.resources,
                &shape,
                bound,
                n,
                &config.engine,
                shape.strategy(config.engine.strategy),
            );
            return match fit.misfit {
                None => Ok(fit.score),
                Some(m) => fails(m),
            };
        }
        Candidate::Node(cluster, node) => (cluster, node),
        Candidate::Unknown => return fails(Misfit::UnknownNode(name.to_string())),
    };
    if let Some(why) = &cluster.unavailable {
        return fails(Misfit::Unavailable(why.clone()));
    }
    match inflight.node(node, now) {
        Cow::Borrowed(node) => nodes.verdict(node).map_err(|r| Refused::Node(r, node)),
        // Reservations held on it: judged on a copy, which the refusal cannot borrow from.
        Cow::Owned(node) => nodes
            .score(&node)
            .map_err(|m| Refused::Text(m.on_the_node(), m.unresolvable())),
    }
}

/// The extender's state, shared by its handlers.
pub struct Extender {
    pub store: Arc<InventoryStore>,
    pub config: ExtenderConfig,
    /// Replaced rather than changed while a filter judges with it.
    inflight: Mutex<Arc<InFlight>>,
    /// Pod analysis and filter verdicts by (uid, resourceVersion): prioritize follows filter
    /// for the same pod within milliseconds and reuses both. Bounded by the bytes of the pods
    /// it holds (see [`MEMO_BYTES`]), not only by their number: a pod may be large.
    memo: moka::sync::Cache<(String, String), Arc<Memo>>,
    /// The last analysis of each pod by uid, for bind (which carries no resourceVersion);
    /// bounded the same way.
    by_uid: moka::sync::Cache<String, Arc<Memo>>,
    node_names: Mutex<Option<Arc<NameList>>>,
    client: Option<kube::Client>,
}

struct Memo {
    shape: Arc<PodShape>,
    scores: Mutex<Arc<Scores>>,
    /// The size of the Pod as sent, standing for what its analysis holds.
    bytes: u32,
}

/// What each of the extender's pod caches may hold, counted in bytes of the Pods as sent
/// (plus their keys). A few thousand ordinary pods (2 – 10 KB each) fit, as before; pods of
/// hundreds of KB, which a count alone would let fill gigabytes, are dropped first.
const MEMO_BYTES: u64 = 32 * 1024 * 1024;

/// And the most entries each may hold, however small the pods: moka's bookkeeping (its
/// frequency sketch and hash table) is sized by the most entries a cache ever held and is
/// not handed back when they go, so a burst of tiny pods (a fuzzer's, a few hundred bytes
/// each: 100,000 of them in 32 MiB) would leave it larger for good. 8,192 is more pods than
/// a scheduler has between filter and bind, and than it filters in the memo's 30 s at
/// 250 pods a second. Enforced by weighing each entry at least `MEMO_BYTES / MEMO_ENTRIES`
/// (4 KiB), since moka bounds one measure only.
const MEMO_ENTRIES: u64 = 8192;

/// How often [`Extender::housekeep`] holds the pod caches to their bounds.
const HOUSEKEEPING: Duration = Duration::from_secs(1);

fn memo_weight(key_bytes: usize, memo: &Memo) -> u32 {
    const FLOOR: u32 = (MEMO_BYTES / MEMO_ENTRIES) as u32;
    u32::try_from(key_bytes)
        .unwrap_or(u32::MAX)
        .saturating_add(memo.bytes)
        .max(FLOOR)
}

/// The nodes a filter passed and their scores: the names in one string, each entry
/// (end of its name in `names`, score), so that a filter of thousands of nodes keeps them
/// with two allocations.
#[derive(Default)]
struct Scores {
    names: String,
    passed: Vec<(usize, i64)>,
}

impl Scores {
    fn iter(&self) -> impl Iterator<Item = (&str, i64)> + '_ {
        let mut start = 0;
        self.passed.iter().map(move |(end, score)| {
            let name = self.names.get(start..*end).unwrap_or_default();
            start = *end;
            (name, *score)
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExtenderError {
    #[error("{0}")]
    BadRequest(String),
}

/// The most of a parser's error about part of a request that is kept: it can quote a string
/// of the request whole, and a filter repeats a Pod's for every node it fails.
const PARSE_ERROR_BYTES: usize = 256;

/// A parser's error about part of a request, cut to [`PARSE_ERROR_BYTES`].
fn parse_error(what: &str, e: serde_json::Error) -> ExtenderError {
    let e = crate::text::shorten(&e.to_string(), PARSE_ERROR_BYTES);
    ExtenderError::BadRequest(format!("{what}: {e}"))
}

/// The top-level keys of an extender request, lower-cased, each value still the request's
/// own bytes.
type Fields<'b> = HashMap<String, &'b RawValue>;

/// Reads the top-level keys of an extender request in any casing.
fn fields(body: &[u8]) -> Result<Fields<'_>, ExtenderError> {
    let map: BTreeMap<String, &RawValue> = serde_json::from_slice(body)
        .map_err(|e| parse_error("body is not a JSON extender request", e))?;
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

/// A candidate's name, borrowed from the request unless it was written with escapes.
#[derive(serde::Deserialize)]
struct Name<'b>(#[serde(borrow)] Cow<'b, str>);

impl AsRef<str> for Name<'_> {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Name<'_> {
    /// The name as a JSON string. A borrowed name had no escapes in the request, so it has
    /// no quote, backslash or control character and goes out as it came.
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        match &self.0 {
            Cow::Borrowed(name) => {
                out.push(b'"');
                out.extend_from_slice(name.as_bytes());
                out.push(b'"');
                Ok(())
            }
            Cow::Owned(name) => serde_json::to_writer(out, name),
        }
    }
}

/// The candidate nodes of a request, in whichever form they came.
enum Candidates<'b> {
    Names(Vec<Name<'b>>),
    /// Full Node objects, kept verbatim to be answered verbatim.
    Nodes {
        names: Vec<Name<'b>>,
        items: Vec<&'b RawValue>,
        list_meta: Option<&'b RawValue>,
    },
}

impl<'b> Candidates<'b> {
    fn names(&self) -> &[Name<'b>] {
        match self {
            Candidates::Names(n) | Candidates::Nodes { names: n, .. } => n,
        }
    }
}

fn read_node_names(raw: &str) -> Result<Vec<Name<'_>>, ExtenderError> {
    // Node names are at most 253 ASCII characters: a longer list cannot be one of at most
    // MAX_CANDIDATES names, and is refused before it is read (4 million names took 400 MB).
    if raw.len() > MAX_CANDIDATES * (253 + 3) {
        return Err(ExtenderError::BadRequest(format!(
            "NodeNames is {} bytes, more than a list of {MAX_CANDIDATES} node names takes",
            raw.len()
        )));
    }
    let names: Vec<Name<'_>> = serde_json::from_str(raw)
        .map_err(|e| parse_error("NodeNames is not a list of names", e))?;
    at_most_candidates("NodeNames", names.len())?;
    Ok(names)
}

/// Refuses a request listing more than [`MAX_CANDIDATES`] nodes.
fn at_most_candidates(field: &str, n: usize) -> Result<(), ExtenderError> {
    if n > MAX_CANDIDATES {
        return Err(ExtenderError::BadRequest(format!(
            "{field} lists {n} nodes, more than the {MAX_CANDIDATES} an extender request may list"
        )));
    }
    Ok(())
}

fn candidates<'b>(f: &Fields<'b>) -> Result<Candidates<'b>, ExtenderError> {
    if let Some(raw) = field(f, "nodenames") {
        return Ok(Candidates::Names(read_node_names(raw.get())?));
    }
    if let Some(raw) = field(f, "nodes") {
        let list: BTreeMap<String, &'b RawValue> = serde_json::from_str(raw.get())
            .map_err(|e| parse_error("Nodes is not a NodeList", e))?;
        let items: Vec<&'b RawValue> = match list.get("items") {
            Some(v) if v.get().trim() != "null" => serde_json::from_str(v.get())
                .map_err(|e| parse_error("Nodes.items is not a list", e))?,
            _ => Vec::new(),
        };
        at_most_candidates("Nodes.items", items.len())?;
        let names = items
            .iter()
            .map(|i| {
                serde_json::from_str::<NodeItemName>(i.get())
                    .map(|n| Name(Cow::Owned(n.metadata.name)))
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
            list_meta: list.get("metadata").copied(),
        });
    }
    Ok(Candidates::Names(Vec::new()))
}

/// The filter reply (ExtenderFilterResult): `Nodes`, `NodeNames`, `FailedNodes`,
/// `FailedAndUnresolvableNodes` (node name to reason, in the order of the request's names)
/// and `Error`, written straight into one buffer: each distinct reason is escaped once and
/// copied for every node refused for it.
fn write_filter(
    names: &[Name<'_>],
    judged: &Judged,
    nodes: Option<&NodeListOut<'_>>,
) -> Result<Vec<u8>, serde_json::Error> {
    let escaped = judged
        .reasons
        .texts
        .iter()
        .map(|(text, _)| serde_json::to_vec(text))
        .collect::<Result<Vec<_>, _>>()?;
    let size: usize = names
        .iter()
        .zip(&judged.slots)
        .map(|(name, slot)| {
            name.0.len()
                + 4
                + match slot {
                    Slot::Fits(_) => 0,
                    Slot::Fails(id) => escaped[*id as usize].len(),
                }
        })
        .sum();
    let mut out = Vec::with_capacity(size + 128);
    out.extend_from_slice(b"{\"Nodes\":");
    match nodes {
        Some(nodes) => serde_json::to_writer(&mut out, nodes)?,
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"NodeNames\":[");
    let mut first = true;
    for (name, slot) in names.iter().zip(&judged.slots) {
        if let Slot::Fits(_) = slot {
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            name.write_json(&mut out)?;
        }
    }
    for (key, unresolvable) in [
        (&b"],\"FailedNodes\":{"[..], false),
        (b"},\"FailedAndUnresolvableNodes\":{", true),
    ] {
        out.extend_from_slice(key);
        let mut first = true;
        for (name, slot) in names.iter().zip(&judged.slots) {
            let Slot::Fails(id) = slot else { continue };
            if judged.reasons.texts[*id as usize].1 != unresolvable {
                continue;
            }
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            name.write_json(&mut out)?;
            out.push(b':');
            out.extend_from_slice(&escaped[*id as usize]);
        }
    }
    out.extend_from_slice(b"},\"Error\":\"\"}");
    Ok(out)
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
            inflight: Mutex::new(Arc::new(InFlight::default())),
            config,
            memo: moka::sync::Cache::builder()
                .max_capacity(MEMO_BYTES)
                .weigher(|k: &(String, String), v: &Arc<Memo>| {
                    memo_weight(k.0.len() + k.1.len(), v)
                })
                .time_to_live(Duration::from_secs(30))
                .build(),
            by_uid: moka::sync::Cache::builder()
                .max_capacity(MEMO_BYTES)
                .weigher(|k: &String, v: &Arc<Memo>| memo_weight(k.len(), v))
                .time_to_live(Duration::from_secs(300))
                .build(),
            node_names: Mutex::new(None),
            client,
        }
    }

    fn pod(&self, f: &Fields<'_>) -> Result<Arc<Memo>, ExtenderError> {
        let raw = field(f, "pod")
            .ok_or_else(|| ExtenderError::BadRequest("request has no Pod".into()))?;
        let view: PodView =
            serde_json::from_str(raw.get()).map_err(|e| parse_error("Pod could not be read", e))?;
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
            shape,
            scores: Mutex::new(Arc::default()),
            bytes: u32::try_from(raw.get().len()).unwrap_or(u32::MAX),
        });
        if let Some(k) = key {
            self.by_uid.insert(k.0.clone(), memo.clone());
            self.memo.insert(k, memo.clone());
        }
        Ok(memo)
    }

    fn verdicts<S: AsRef<str>>(&self, shape: &Arc<PodShape>, names: &[S], now: Instant) -> Judged {
        let inventory = self.store.snapshot();
        filter_names(
            &inventory,
            &self.inflight(),
            shape,
            names,
            &self.config,
            now,
        )
    }

    /// The in-flight reservations as they are now.
    fn inflight(&self) -> Arc<InFlight> {
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The names of a NodeNames list (its raw JSON text), read again only when the list is
    /// not the last one, byte for byte.
    fn node_names<'b>(
        &self,
        raw: &'b str,
    ) -> Result<(Vec<Name<'b>>, Arc<NameList>), ExtenderError> {
        let last = self
            .node_names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(last) = last.filter(|last| *last.raw == *raw) {
            let names = last.names.iter().map(|n| n.name(raw)).collect();
            return Ok((names, last));
        }
        let names = read_node_names(raw)?;
        let list = Arc::new(NameList {
            raw: raw.into(),
            names: names.iter().map(|n| Spelled::of(n, raw)).collect(),
            resolved: Mutex::new(None),
        });
        *self.node_names.lock().unwrap_or_else(|p| p.into_inner()) = Some(list.clone());
        Ok((names, list))
    }

    /// What each name of `list` (`names`) stands for in `inventory`: the last answer when it
    /// was for this very snapshot.
    fn targets(
        &self,
        inventory: &Arc<Inventory>,
        list: &NameList,
        names: &[Name<'_>],
    ) -> Arc<[Target]> {
        let mut resolved = list.resolved.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(last) = &*resolved {
            if std::ptr::eq(last.inventory.as_ptr(), Arc::as_ptr(inventory)) {
                return last.targets.clone();
            }
        }
        let targets: Arc<[Target]> = resolve(inventory, names, &self.config).into();
        *resolved = Some(Resolved {
            inventory: Arc::downgrade(inventory),
            targets: targets.clone(),
        });
        targets
    }

    /// Holds the pod caches to their bounds every second until `stop` says so. moka drops
    /// expired entries, and those past the byte bound, only when the cache is next used: an
    /// extender that served a burst of large pods and then went quiet would keep them all.
    pub async fn housekeep(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(HOUSEKEEPING);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let this = self.clone();
            // Evicting thousands of entries takes a while: not on a runtime thread.
            let _ = tokio::task::spawn_blocking(move || {
                this.memo.run_pending_tasks();
                this.by_uid.run_pending_tasks();
            })
            .await;
        }
    }

    /// `POST /scheduler/filter`: the reply body.
    pub fn filter(&self, body: &[u8], now: Instant) -> Result<Vec<u8>, ExtenderError> {
        let f = fields(body)?;
        let (candidates, list) = match field(&f, "nodenames") {
            Some(raw) => {
                let (names, list) = self.node_names(raw.get())?;
                (Candidates::Names(names), Some(list))
            }
            None => (candidates(&f)?, None),
        };
        let names = candidates.names();
        let (judged, memo) = match self.pod(&f) {
            Ok(memo) => {
                let inventory = self.store.snapshot();
                let targets = list
                    .as_ref()
                    .map(|list| self.targets(&inventory, list, names));
                let judged = Filtering {
                    inventory,
                    inflight: self.inflight(),
                    shape: memo.shape.clone(),
                    names: list.unwrap_or_else(|| Arc::new(NameList::copied(names))),
                    targets,
                    config: self.config.clone(),
                    now,
                }
                .run();
                (judged, Some(memo))
            }
            // A pod whose requests cannot be read fits nowhere; say why on every node.
            Err(ExtenderError::BadRequest(reason)) if field(&f, "pod").is_some() => {
                let mut reasons = Reasons::default();
                let id = reasons.id(reason, true);
                let slots = vec![Slot::Fails(id); names.len()];
                (Judged { slots, reasons }, None)
            }
            Err(e) => return Err(e),
        };
        if let Some(memo) = memo {
            let mut scores = Scores::default();
            for (name, slot) in names.iter().zip(&judged.slots) {
                if let Slot::Fits(score) = slot {
                    scores.names.push_str(name.as_ref());
                    scores.passed.push((scores.names.len(), *score));
                }
            }
            *memo.scores.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(scores);
        }
        let nodes = match &candidates {
            Candidates::Nodes {
                items, list_meta, ..
            } => Some(NodeListOut {
                metadata: *list_meta,
                items: items
                    .iter()
                    .zip(&judged.slots)
                    .filter(|(_, slot)| matches!(slot, Slot::Fits(_)))
                    .map(|(item, _)| *item)
                    .collect(),
            }),
            Candidates::Names(_) => None,
        };
        write_filter(names, &judged, nodes.as_ref())
            .map_err(|e| ExtenderError::BadRequest(e.to_string()))
    }

    /// `POST /scheduler/prioritize`: a score 0–10 for every candidate, reusing filter's
    /// verdicts for the same pod version when it has them.
    pub fn prioritize(&self, body: &[u8], now: Instant) -> Result<Vec<u8>, ExtenderError> {
        let f = fields(body)?;
        let candidates = candidates(&f)?;
        let names = candidates.names();
        let memo = self.pod(&f)?;
        let scores = memo
            .scores
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let known: HashMap<&str, i64> = scores.iter().collect();
        let missing: Vec<&str> = names
            .iter()
            .map(AsRef::as_ref)
            .filter(|n| !known.contains_key(n))
            .collect();
        let mut computed = HashMap::new();
        if !missing.is_empty() {
            let judged = self.verdicts(&memo.shape, &missing, now);
            for (name, v) in missing.iter().zip(judged.verdicts()) {
                computed.insert(
                    *name,
                    match v {
                        Verdict::Fits { score } => score,
                        Verdict::Fails { .. } => 0,
                    },
                );
            }
        }
        let list: Vec<HostPriority> = names
            .iter()
            .map(|n| {
                let host = n.as_ref();
                HostPriority {
                    host,
                    score: known
                        .get(host)
                        .or_else(|| computed.get(host))
                        .copied()
                        .unwrap_or(0),
                }
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
                .map_err(|e| parse_error(&format!("binding field {k}"), e))
        };
        let (name, namespace, uid, node) = (
            text("podname")?,
            text("podnamespace")?,
            text("poduid")?,
            text("node")?,
        );
        if node.is_empty() || name.is_empty() {
            return Err(ExtenderError::BadRequest(
                "binding request has an empty Node or PodName".into(),
            ));
        }
        // Without an API server (`--standalone`) nothing is bound: said, not pretended, so
        // that a scheduler pointed here by mistake does not take its pods for bound.
        let Some(client) = &self.client else {
            let error = format!(
                "no API server to bind pod {namespace}/{name} with: switchyard serves --standalone"
            );
            return serde_json::to_vec(&BindingResult { error })
                .map_err(|e| ExtenderError::BadRequest(e.to_string()));
        };
        let mut error = String::new();
        if let Some(memo) = self.by_uid.get(&uid) {
            self.reserve(&uid, &memo.shape, &node, now);
        }
        if let Err(e) = post_binding(client, &namespace, &name, &uid, &node).await {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            Arc::make_mut(&mut inflight).release(&uid);
            error = format!("binding pod {namespace}/{name} to node {node}: {e}");
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
        let inflight = Arc::make_mut(&mut inflight);
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
        let inventory = Arc::new(parse_yaml(&yaml).unwrap());
        let view: PodView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}
        }))
        .unwrap();
        let shape = Arc::new(PodShape::from_view(&view).unwrap());
        let names: Vec<String> = ["alpha", "bravo", "charlie-with-a-long-name", "delta"]
            .map(String::from)
            .to_vec();
        let verdicts = filter_names(
            &inventory,
            &Arc::new(InFlight::default()),
            &shape,
            &names,
            &ExtenderConfig::default(),
            Instant::now(),
        );
        let reasons: Vec<&str> = verdicts
            .verdicts()
            .map(|v| match v {
                Verdict::Fails { reason, .. } => reason,
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

    /// Virtual nodes are selected the usual way, by the labels they carry as their own
    /// (`type: virtual-kubelet`, the cluster's name, the WorkerCluster's labels): those terms
    /// are about the virtual node, which kube-scheduler matched already, so the worker's
    /// nodes, which never carry them, are judged without them; terms on other labels still
    /// apply to them.
    #[test]
    fn a_pod_selecting_virtual_nodes_by_their_own_labels_is_judged_on_the_cluster_without_them() {
        let node = |name: &str, gpus: u32, model: &str| {
            format!(
                "      - name: {name}\n        labels: {{gpu-model: {model}}}\n        allocatable: {{cpu: \"32\", memory: 128Gi, nvidia.com/gpu: \"{gpus}\", pods: \"110\"}}\n        requested: {{}}\n"
            )
        };
        let yaml = format!(
            "clusters:\n  - name: big\n    labels: {{region: europe}}\n    nodes:\n{}{}  - name: small\n    labels: {{region: europe}}\n    nodes:\n{}",
            node("g1", 4, "a100"),
            node("g2", 4, "h100"),
            node("s1", 4, "a100"),
        );
        let inventory = Arc::new(parse_yaml(&yaml).unwrap());
        let verdicts = |spec: serde_json::Value| -> Vec<String> {
            let mut pod = serde_json::json!({
                "metadata": {"name": "p", "namespace": "default", "uid": "u", "resourceVersion": "1",
                             "annotations": {"switchyard.dev/gang-size": "2"}},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "4"}}}],
                         "tolerations": [{"key": "switchyard.dev/virtual", "operator": "Exists"}]}
            });
            for (k, v) in spec.as_object().unwrap() {
                pod["spec"][k] = v.clone();
            }
            let view: PodView = serde_json::from_value(pod).unwrap();
            let shape = Arc::new(PodShape::from_view(&view).unwrap());
            filter_names(
                &inventory,
                &Arc::new(InFlight::default()),
                &shape,
                &["switchyard-big", "switchyard-small"],
                &ExtenderConfig::default(),
                Instant::now(),
            )
            .verdicts()
            .map(|v| match v {
                Verdict::Fits { .. } => "fits".to_string(),
                Verdict::Fails { reason, .. } => reason.to_string(),
            })
            .collect()
        };
        let gang_misfit = |v: &str| v.starts_with("only 1 of 2 pods fit at once in cluster small");

        // The usual way: the label every Switchyard virtual node carries.
        let by_type = verdicts(serde_json::json!({"nodeSelector": {"type": "virtual-kubelet"}}));
        assert_eq!(by_type[0], "fits");
        assert!(gang_misfit(&by_type[1]), "{}", by_type[1]);

        // The WorkerCluster's labels and the cluster's name, in nodeSelector or affinity.
        let by_region = verdicts(serde_json::json!({"nodeSelector": {"region": "europe"}}));
        assert_eq!(by_region[0], "fits");
        let only_small = verdicts(serde_json::json!({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "switchyard.dev/cluster", "operator": "In", "values": ["small"]}]}
        ]}}}}));
        assert_eq!(
            only_small[0],
            "node switchyard-big does not match the pod's required node affinity"
        );
        assert!(gang_misfit(&only_small[1]), "{}", only_small[1]);

        // A term's other expressions are still required of the worker's nodes: big has one
        // a100 node, so a gang of two a100 pods does not fit there.
        let a100 = verdicts(serde_json::json!({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [
                {"key": "type", "operator": "In", "values": ["virtual-kubelet"]},
                {"key": "gpu-model", "operator": "In", "values": ["a100"]}
            ]}
        ]}}}}));
        assert!(
            a100[0].starts_with("only 1 of 2 pods fit at once in cluster big"),
            "{}",
            a100[0]
        );
        // And a selector the virtual node does not satisfy refuses it, naming it.
        let wrong = verdicts(serde_json::json!({"nodeSelector": {"type": "real"}}));
        assert_eq!(
            wrong[0],
            "node switchyard-big does not have label type=real (nodeSelector)"
        );
    }

    /// The reply written by hand is byte for byte what serde writes for the Go struct, names
    /// and reasons escaped where they must be, maps in the order of the request's names.
    #[test]
    fn the_filter_reply_is_what_serde_would_write() {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct FilterResult<'a> {
            nodes: Option<&'a NodeListOut<'a>>,
            node_names: Vec<&'a str>,
            failed_nodes: Pairs<'a>,
            failed_and_unresolvable_nodes: Pairs<'a>,
            error: String,
        }
        #[derive(Default)]
        struct Pairs<'a>(Vec<(&'a str, &'a str)>);
        impl Serialize for Pairs<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().copied())
            }
        }

        let body = r#"["zeta", "a\"quoted\"", "caf\u00e9", "b", "zeta", "c/d", "e"]"#;
        let names: Vec<Name<'_>> = serde_json::from_str(body).unwrap();
        assert!(matches!(names[1].0, Cow::Owned(_)));
        assert!(matches!(names[0].0, Cow::Borrowed(_)));
        let mut reasons = Reasons::default();
        let plain = reasons.id("needs 2 cpu; the node has 1 free".into(), false);
        let quoted = reasons.id("quantity \"four\" is not a number\n\ttab".into(), true);
        assert_eq!(
            reasons.id("needs 2 cpu; the node has 1 free".into(), false),
            plain
        );
        let judged = Judged {
            slots: vec![
                Slot::Fails(plain),
                Slot::Fits(3),
                Slot::Fails(quoted),
                Slot::Fails(plain),
                Slot::Fits(0),
                Slot::Fails(quoted),
                Slot::Fits(10),
            ],
            reasons,
        };
        let meta = RawValue::from_string(r#"{"resourceVersion":"7"}"#.into()).unwrap();
        let item = RawValue::from_string(r#"{"metadata":{"name":"b"}}"#.into()).unwrap();
        let list = NodeListOut {
            metadata: Some(&meta),
            items: vec![&item],
        };
        for nodes in [None, Some(&list)] {
            let mut want = FilterResult {
                nodes,
                node_names: Vec::new(),
                failed_nodes: Pairs::default(),
                failed_and_unresolvable_nodes: Pairs::default(),
                error: String::new(),
            };
            for (name, v) in names.iter().zip(judged.verdicts()) {
                match v {
                    Verdict::Fits { .. } => want.node_names.push(name.as_ref()),
                    Verdict::Fails {
                        reason,
                        unresolvable: false,
                    } => want.failed_nodes.0.push((name.as_ref(), reason)),
                    Verdict::Fails { reason, .. } => want
                        .failed_and_unresolvable_nodes
                        .0
                        .push((name.as_ref(), reason)),
                }
            }
            let got = write_filter(&names, &judged, nodes).unwrap();
            assert_eq!(
                String::from_utf8(got).unwrap(),
                serde_json::to_string(&want).unwrap()
            );
        }
        let none = write_filter(
            &[],
            &Judged {
                slots: Vec::new(),
                reasons: Reasons::default(),
            },
            None,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(none).unwrap(),
            r#"{"Nodes":null,"NodeNames":[],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
    }

    /// The same NodeNames list again answers from the new inventory once it changed, even
    /// where the change moved the nodes around, and a different list is looked up afresh.
    #[test]
    fn a_repeated_name_list_follows_inventory_changes() {
        let yaml = |nodes: &[(&str, &str)]| {
            let mut y = String::from("clusters:\n  - name: eu-1\n    nodes:\n");
            for (name, cpu) in nodes {
                y.push_str(&format!(
                    "      - name: {name}\n        allocatable: {{cpu: \"{cpu}\", memory: 32Gi, pods: \"110\"}}\n"
                ));
            }
            y
        };
        let store = Arc::new(InventoryStore::new(
            parse_yaml(&yaml(&[("a", "1"), ("b", "8"), ("c", "8")])).unwrap(),
        ));
        let extender = Extender::new(store.clone(), ExtenderConfig::default(), None);
        let pod = serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}
        });
        let filter = |names: &[&str], rv: u32| -> serde_json::Value {
            let mut pod = pod.clone();
            pod["metadata"]["resourceVersion"] = serde_json::json!(rv.to_string());
            let body = serde_json::json!({"Pod": pod, "NodeNames": names});
            let reply = extender
                .filter(&serde_json::to_vec(&body).unwrap(), Instant::now())
                .unwrap();
            serde_json::from_slice(&reply).unwrap()
        };
        let passed = |v: &serde_json::Value| v["NodeNames"].clone();
        assert_eq!(
            passed(&filter(&["a", "b", "c", "x"], 1)),
            serde_json::json!(["b", "c"])
        );
        assert_eq!(
            passed(&filter(&["a", "b", "c", "x"], 2)),
            serde_json::json!(["b", "c"])
        );
        // Node a grows, b shrinks, c goes, x arrives, all in a new order.
        store.replace(parse_yaml(&yaml(&[("x", "8"), ("b", "1"), ("a", "8")])).unwrap());
        let reply = filter(&["a", "b", "c", "x"], 3);
        assert_eq!(passed(&reply), serde_json::json!(["a", "x"]));
        assert!(
            reply["FailedAndUnresolvableNodes"]["c"].is_string(),
            "{reply}"
        );
        assert!(
            reply["FailedAndUnresolvableNodes"]["b"].is_string(),
            "{reply}"
        );
        assert_eq!(passed(&filter(&["x", "b"], 4)), serde_json::json!(["x"]));
        assert_eq!(
            passed(&filter(&["a", "b", "c", "x"], 5)),
            serde_json::json!(["a", "x"])
        );
    }

    /// A NodeNames list sent again, names written with escapes included, is answered as a
    /// fresh extender answers it the first time.
    #[test]
    fn a_repeated_name_list_reads_its_names_as_the_first_time() {
        let yaml = "clusters:\n  - name: eu-1\n    nodes:\n      - name: caf\u{e9}\n        allocatable: {cpu: \"8\", memory: 32Gi, pods: \"110\"}\n      - name: small\n        allocatable: {cpu: \"1\", memory: 32Gi, pods: \"110\"}\n";
        let body = |uid: &str| {
            format!(
                r#"{{"Pod":{{"metadata":{{"name":"p","namespace":"d","uid":"{uid}","resourceVersion":"1"}},"spec":{{"containers":[{{"name":"c","resources":{{"requests":{{"cpu":"2"}}}}}}]}}}},"NodeNames":["caf\u00e9","small","caf\u00e9","a\"quoted\"","plain","switchyard-eu-1"]}}"#
            )
        };
        let extender = || {
            Extender::new(
                Arc::new(InventoryStore::new(parse_yaml(yaml).unwrap())),
                ExtenderConfig::default(),
                None,
            )
        };
        let again = extender();
        let first = again.filter(body("u1").as_bytes(), Instant::now()).unwrap();
        let second = again.filter(body("u2").as_bytes(), Instant::now()).unwrap();
        let fresh = extender()
            .filter(body("u2").as_bytes(), Instant::now())
            .unwrap();
        assert_eq!(
            String::from_utf8(second).unwrap(),
            String::from_utf8(fresh).unwrap()
        );
        let reply: serde_json::Value = serde_json::from_slice(&first).unwrap();
        assert_eq!(
            reply["NodeNames"],
            serde_json::json!(["caf\u{e9}", "caf\u{e9}", "switchyard-eu-1"])
        );
        assert!(
            reply["FailedAndUnresolvableNodes"]["a\"quoted\""].is_string(),
            "{reply}"
        );
    }

    /// A list long enough to be split over threads gets the verdicts and reasons each name
    /// gets alone, in the order of the names.
    #[test]
    fn a_split_filter_answers_as_one_name_at_a_time() {
        let mut yaml = String::from("clusters:\n  - name: eu-1\n    nodes:\n");
        for i in 0..1500 {
            yaml.push_str(&format!(
                "      - name: n{i}\n        allocatable: {{cpu: \"{}\", memory: 32Gi, pods: \"110\"}}\n        requested: {{cpu: \"{}\"}}\n",
                1 + i % 9,
                i % 4
            ));
        }
        let inventory = Arc::new(parse_yaml(&yaml).unwrap());
        let view: PodView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}]}
        }))
        .unwrap();
        let shape = Arc::new(PodShape::from_view(&view).unwrap());
        let names: Vec<String> = (0..1600).rev().map(|i| format!("n{i}")).collect();
        let inflight = Arc::new(InFlight::default());
        let config = ExtenderConfig::default();
        let now = Instant::now();
        let all = filter_names(&inventory, &inflight, &shape, &names, &config, now);
        assert_eq!(all.len(), names.len());
        let mut passed = 0;
        for (name, v) in names.iter().zip(all.verdicts()) {
            let alone = filter_names(&inventory, &inflight, &shape, &[name], &config, now);
            assert_eq!(Some(v), alone.verdicts().next(), "{name}");
            passed += usize::from(matches!(v, Verdict::Fits { .. }));
        }
        assert!(passed > 100 && passed < 1500, "{passed}");
    }

    /// An extender of one worker with one node, `a`.
    fn one_node_extender() -> Extender {
        let store = Arc::new(InventoryStore::new(
            parse_yaml("clusters:\n  - name: eu-1\n    nodes:\n      - {name: a, allocatable: {cpu: \"8\", memory: 32Gi, pods: \"110\"}}\n")
                .unwrap(),
        ));
        Extender::new(store, ExtenderConfig::default(), None)
    }

    /// Large pods (hundreds of KB of tolerations, which the analysis keeps) do not fill the
    /// pod caches past their byte bound, however many of them come; ordinary pods are still
    /// remembered.
    #[test]
    fn the_pod_caches_are_bounded_by_bytes_not_only_by_count() {
        let extender = one_node_extender();
        let filter = |uid: &str, tolerations: &serde_json::Value| {
            let body = serde_json::json!({"Pod": {
                "metadata": {"name": uid, "namespace": "default", "uid": uid, "resourceVersion": "1"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                         "tolerations": tolerations}
            }, "NodeNames": ["a"]});
            extender
                .filter(&serde_json::to_vec(&body).unwrap(), Instant::now())
                .unwrap();
        };
        let big: Vec<serde_json::Value> = (0..3000)
            .map(|i| serde_json::json!({"key": format!("example.com/taint-{i}"), "operator": "Exists", "effect": "NoSchedule"}))
            .collect();
        let big = serde_json::Value::from(big);
        for i in 0..400 {
            filter(&format!("big-{i}"), &big);
        }
        extender.memo.run_pending_tasks();
        extender.by_uid.run_pending_tasks();
        for (name, weight, count) in [
            (
                "memo",
                extender.memo.weighted_size(),
                extender.memo.entry_count(),
            ),
            (
                "by_uid",
                extender.by_uid.weighted_size(),
                extender.by_uid.entry_count(),
            ),
        ] {
            assert!(weight <= MEMO_BYTES, "{name}: {weight} bytes held");
            assert!(count < 400, "{name}: {count} of 400 large pods kept");
        }
        filter("small", &serde_json::json!([]));
        assert!(extender
            .memo
            .contains_key(&("small".to_string(), "1".to_string())));
        assert!(extender.by_uid.contains_key("small"));
    }

    /// Tiny pods, however many, fill neither cache past [`MEMO_ENTRIES`] entries: what moka
    /// keeps for a cache's bookkeeping follows the most entries it ever held, and is not
    /// given back (about 120 KB a cache for 8,192 entries; a fuzzer's tiny pods would make it
    /// ten times that).
    #[test]
    fn the_pod_caches_hold_a_bounded_number_of_tiny_pods() {
        let extender = one_node_extender();
        let n = MEMO_ENTRIES as usize * 2 + 500;
        for i in 0..n {
            let body = format!(
                r#"{{"Pod":{{"metadata":{{"uid":"u{i}","resourceVersion":"1"}},"spec":{{"containers":[{{"name":"c"}}]}}}},"NodeNames":["a"]}}"#
            );
            extender.filter(body.as_bytes(), Instant::now()).unwrap();
        }
        extender.memo.run_pending_tasks();
        extender.by_uid.run_pending_tasks();
        for (name, count) in [
            ("memo", extender.memo.entry_count()),
            ("by_uid", extender.by_uid.entry_count()),
        ] {
            assert!(
                count <= MEMO_ENTRIES,
                "{name}: {count} of {n} tiny pods kept"
            );
            assert!(count > MEMO_ENTRIES / 2, "{name}: only {count} kept");
        }
    }
}
