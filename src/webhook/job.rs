//! The rules for the kinds the dispatcher runs (batch/v1 Jobs, JobSets): what the mutating hook
//! patches and what the validating hook refuses. Messages name the kind reviewed; "Job" in
//! the comments means either.

use super::{AdmissionPolicy, Decision, Denial, Kind, Operation, Text};
use crate::wellknown::{CLUSTER_ANNOTATION, MANAGED_BY, QUEUE_LABEL};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Value};
use std::fmt;
use std::marker::PhantomData;

/// The part of a Job the rules read. Everything else in the object is skipped while parsing,
/// and text borrows from the body.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JobView<'a> {
    #[serde(borrow)]
    pub(crate) kind: Option<Text<'a>>,
    /// `None` when the object has no metadata at all (never so from an API server, but a
    /// patch must still apply to it).
    #[serde(default, borrow, deserialize_with = "object")]
    pub(crate) metadata: Option<MetaView<'a>>,
    #[serde(default, borrow, deserialize_with = "object")]
    pub(crate) spec: Option<SpecView<'a>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MetaView<'a> {
    #[serde(borrow)]
    pub(crate) name: Option<Text<'a>>,
    #[serde(borrow)]
    pub(crate) generate_name: Option<Text<'a>>,
    #[serde(borrow)]
    pub(crate) namespace: Option<Text<'a>>,
    /// Only the queue label is kept.
    #[serde(default, borrow, deserialize_with = "queue_label")]
    pub(crate) labels: Option<OneKey<'a>>,
    /// Only the cluster annotation is kept.
    #[serde(default, borrow, deserialize_with = "cluster_annotation")]
    pub(crate) annotations: Option<OneKey<'a>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SpecView<'a> {
    pub(crate) suspend: Option<bool>,
    #[serde(borrow)]
    pub(crate) managed_by: Option<Text<'a>>,
}

/// Reads an optional JSON object. serde's derive also reads a struct from an array (its fields
/// by position), and an object the rules saw that way would get a patch that cannot apply to it
/// (`add /metadata/labels` on an array): only `null` or an object is accepted here.
pub(crate) fn object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ObjectVisitor<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
        type Value = Option<T>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object")
        }

        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map)).map(Some)
        }
    }

    d.deserialize_option(ObjectVisitor(PhantomData))
}

/// A `map[string]string` (labels, annotations) read for a single key: the map's presence and
/// that key's value. Every other entry is still checked to be a string, but not kept.
#[derive(Debug, Clone, Default)]
pub(crate) struct OneKey<'a> {
    pub(crate) value: Option<Text<'a>>,
}

fn queue_label<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OneKey<'de>>, D::Error> {
    d.deserialize_option(OneKeyVisitor(QUEUE_LABEL))
}

fn cluster_annotation<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OneKey<'de>>, D::Error> {
    d.deserialize_option(OneKeyVisitor(CLUSTER_ANNOTATION))
}

/// Reads `null` as `None` and a map as `Some`, keeping `.0`'s value; the errors read as
/// `Option<BTreeMap<String, String>>`'s would.
struct OneKeyVisitor(&'static str);

impl<'de> Visitor<'de> for OneKeyVisitor {
    type Value = Option<OneKey<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut value = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            let v = map.next_value::<Text<'de>>()?;
            // A repeated key: the last one wins, as in a map.
            if *key == *self.0 {
                value = Some(v);
            }
        }
        Ok(Some(OneKey { value }))
    }
}

impl JobView<'_> {
    pub(crate) fn queue(&self) -> Option<&str> {
        self.metadata.as_ref()?.labels.as_ref()?.value.as_deref()
    }
    pub(crate) fn suspend(&self) -> Option<bool> {
        self.spec.as_ref()?.suspend
    }
    pub(crate) fn managed_by(&self) -> Option<&str> {
        self.spec.as_ref()?.managed_by.as_deref()
    }
    fn is_managed_by_us(&self) -> bool {
        self.managed_by() == Some(MANAGED_BY)
    }
    fn dispatched_to(&self) -> Option<&str> {
        self.metadata
            .as_ref()?
            .annotations
            .as_ref()?
            .value
            .as_deref()
    }
}

fn add(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(tokens.iter().copied()),
        value,
    })
}

/// The mutating hook at CREATE. `default_queue` is the queue to add when the caller decided
/// the Job's namespace gets one.
pub(super) fn mutate(kind: Kind, job: &JobView, default_queue: Option<&str>) -> Decision {
    let queue = match (job.queue(), default_queue) {
        (Some(q), _) => q,
        (None, Some(q)) => q,
        (None, None) => return Decision::allow(),
    };
    let mut ops = Vec::new();
    let mut warnings = Vec::new();
    if job.queue().is_none() {
        // The pointer escapes the '/' in the key; a missing labels map is created whole.
        ops.push(match &job.metadata {
            Some(MetaView {
                labels: Some(_), ..
            }) => add(&["metadata", "labels", QUEUE_LABEL], json!(queue)),
            Some(_) => add(&["metadata", "labels"], json!({ QUEUE_LABEL: queue })),
            None => add(&["metadata"], json!({"labels": { QUEUE_LABEL: queue }})),
        });
        warnings.push(format!(
            "metadata.labels[{QUEUE_LABEL}] set to {queue:?}: the namespace's default queue"
        ));
    }
    let Some(spec) = &job.spec else {
        // Not a valid Job; the API server will say so. Give it a spec that keeps it ours.
        ops.push(add(
            &["spec"],
            json!({"suspend": true, "managedBy": MANAGED_BY}),
        ));
        return Decision {
            patch: json_patch::Patch(ops),
            warnings,
            denial: None,
        };
    };
    // No warning: the API server defaults suspend to false before this hook runs, so an
    // explicit false cannot be told from the default, and every Job would get one.
    if spec.suspend != Some(true) {
        ops.push(add(&["spec", "suspend"], json!(true)));
    }
    match spec.managed_by.as_deref() {
        None => ops.push(add(&["spec", "managedBy"], json!(MANAGED_BY))),
        Some(c) if c == kind.own_controller() => {
            ops.push(add(&["spec", "managedBy"], json!(MANAGED_BY)))
        }
        // Anything else belongs to another controller; the validating hook explains the denial.
        Some(_) => {}
    }
    Decision {
        patch: json_patch::Patch(ops),
        warnings,
        denial: None,
    }
}

/// Why a Job of ours reached the validating hook without `spec.managedBy`: the mutating hook
/// did not run.
fn own_hook_missing(kind: Kind) -> String {
    format!("Switchyard's mutating webhook sets it when it creates the {kind}; it did not run, check that the MutatingWebhookConfiguration switchyard-mutating exists and selects this namespace")
}

fn queue_field() -> String {
    format!("metadata.labels[{QUEUE_LABEL}]")
}

/// The validating hook at CREATE and UPDATE: the first rule that denies says why, in the
/// order below (the queue's name, who manages the Job, how it was created, whether its queue
/// may change, who may unsuspend it).
///
/// UPDATE rules ratchet as the API server's own validation does: a problem the old object
/// already had does not block an unrelated update (a status write, a finalizer), only a
/// change that introduces it.
pub(super) fn validate(
    kind: Kind,
    operation: Operation,
    sub_resource: Option<&str>,
    job: &JobView,
    old: Option<&JobView>,
    username: &str,
    policy: &AdmissionPolicy,
) -> Decision {
    // Subresource writes (status) cannot change labels or spec.
    if sub_resource.is_some() {
        return Decision::allow();
    }
    let old = old.filter(|_| operation == Operation::Update);
    let ours = job.queue().is_some()
        || job.is_managed_by_us()
        || old.is_some_and(|o| o.queue().is_some() || o.is_managed_by_us());
    if !ours {
        return Decision::allow();
    }
    let review = Reviewed {
        kind,
        operation,
        job,
        old,
        username,
        policy,
    };
    let rules: [fn(&Reviewed) -> Option<Denial>; 5] = [
        queue_is_a_label,
        managed_by_switchyard,
        created_suspended,
        queue_stays_once_dispatched,
        only_the_dispatcher_unsuspends,
    ];
    if let Some(denial) = rules.iter().find_map(|rule| rule(&review)) {
        return Decision::deny(denial);
    }
    let mut decision = Decision::allow();
    if review.queue().is_none() && review.old_queue().is_some() && job.is_managed_by_us() {
        decision.warnings.push(format!(
            "removing {QUEUE_LABEL} leaves this {kind} managed by {MANAGED_BY} (spec.managedBy is immutable) with no queue: it will never run; delete it and create it again without the label to run it elsewhere"
        ));
    }
    decision
}

/// A write of one of our Jobs, as the validating rules read it. `old` is the object before an
/// UPDATE (`None` at CREATE).
struct Reviewed<'r, 'a> {
    kind: Kind,
    operation: Operation,
    job: &'r JobView<'a>,
    old: Option<&'r JobView<'a>>,
    username: &'r str,
    policy: &'r AdmissionPolicy,
}

impl Reviewed<'_, '_> {
    fn queue(&self) -> Option<&str> {
        self.job.queue()
    }

    fn old_queue(&self) -> Option<&str> {
        self.old.and_then(JobView::queue)
    }

    fn queue_changed(&self) -> bool {
        self.old.is_some() && self.queue() != self.old_queue()
    }

    fn by_dispatcher(&self) -> bool {
        self.policy
            .dispatcher_usernames
            .iter()
            .any(|u| u == self.username)
    }

    /// How the messages name the Job: by its queue, or, carrying none, by its controller.
    fn whose(&self) -> String {
        let kind = self.kind;
        match self.queue().or(self.old_queue()) {
            Some(q) => format!("a {kind} of queue {q:?}"),
            None => format!("a {kind} managed by {MANAGED_BY:?} (with no {QUEUE_LABEL} label)"),
        }
    }
}

/// A queue named when the Job is created, or changed to, is a DNS-1123 label, as a
/// DispatchQueue's name is.
fn queue_is_a_label(r: &Reviewed) -> Option<Denial> {
    let q = r.queue()?;
    if (r.old.is_some() && !r.queue_changed()) || crate::api::is_dns1123_label(q) {
        return None;
    }
    Some(Denial::invalid(format!(
        "{}: Invalid value: {q:?}: a queue name must be a DNS-1123 label: at most 63 \
         lowercase letters, digits or '-', starting and ending with a letter or digit \
         (e.g. \"research\")",
        queue_field()
    )))
}

/// A Job with a queue is managed by Switchyard: another controller would run it around the
/// queue.
fn managed_by_switchyard(r: &Reviewed) -> Option<Denial> {
    r.queue()?;
    let old_had_same_problem = r
        .old
        .is_some_and(|o| o.queue().is_some() && !o.is_managed_by_us());
    if r.job.is_managed_by_us() || old_had_same_problem {
        return None;
    }
    let kind = r.kind;
    let found = r.job.managed_by().unwrap_or("");
    let how = match (r.operation, r.job.managed_by()) {
        (Operation::Update, _) => format!("spec.managedBy is immutable, so an existing {kind} cannot join a Switchyard queue: delete it and create it again with the label"),
        (_, None) => own_hook_missing(kind),
        (_, Some(c)) if c == kind.own_controller() => own_hook_missing(kind),
        _ => format!("remove the {QUEUE_LABEL} label to let that controller run the {kind}, or remove spec.managedBy to let Switchyard run it"),
    };
    Some(Denial::invalid(format!(
        "spec.managedBy: Invalid value: {found:?}: a {kind} labelled {QUEUE_LABEL} must be managed by {MANAGED_BY:?}; {how}"
    )))
}

/// At CREATE the mutating hook has made every Job of ours suspended. One that is not was
/// created around it, which would bypass the admission gate.
fn created_suspended(r: &Reviewed) -> Option<Denial> {
    if r.old.is_some() || r.job.suspend() != Some(false) || r.by_dispatcher() {
        return None;
    }
    Some(Denial::forbidden(format!(
        "spec.suspend: Forbidden: {} must be created suspended, and Switchyard's mutating webhook suspends it; it did not run, check that the MutatingWebhookConfiguration switchyard-mutating exists and selects this namespace",
        r.whose()
    )))
}

/// A Job's queue may change (or go) only while nothing was done with it: not once it was
/// dispatched to a worker or admitted.
fn queue_stays_once_dispatched(r: &Reviewed) -> Option<Denial> {
    let old = r.old?;
    if !r.queue_changed() || r.old_queue().is_none() {
        return None;
    }
    let kind = r.kind;
    let when = match old.dispatched_to() {
        Some(cluster) => format!("the {kind} was dispatched to worker cluster {cluster:?}"),
        None if old.suspend() == Some(false) => {
            format!("the {kind} was admitted (spec.suspend is false)")
        }
        None => return None,
    };
    let what = match r.queue() {
        Some(q) => format!("Invalid value: {q:?}: the queue cannot change"),
        None => "Required value: the queue label cannot be removed".to_string(),
    };
    Some(Denial::invalid(format!(
        "{}: {what} after {when}; delete the {kind} and create it again to move it",
        queue_field()
    )))
}

/// Only the dispatcher unsuspends a Job of ours: that is how its queue admits it.
fn only_the_dispatcher_unsuspends(r: &Reviewed) -> Option<Denial> {
    let old = r.old?;
    if old.suspend() != Some(true) || r.job.suspend() == Some(true) || r.by_dispatcher() {
        return None;
    }
    Some(Denial::forbidden(format!(
        "spec.suspend: Forbidden: only the Switchyard dispatcher ({}) may unsuspend {}, not user {:?}; {}",
        r.policy.dispatcher_usernames.join(", "),
        r.whose(),
        r.username,
        if r.queue().or(r.old_queue()).is_some() {
            "it starts when its queue admits it"
        } else {
            "without a queue it never starts: delete it and create it again"
        }
    )))
}
