//! Schema pieces shared by the CRDs: the name and quantity patterns the API server checks, the
//! CEL rules, and the schemars transforms that put them in place. The same checks exist in
//! Rust (`names`) for what reads objects without an API server (the scenario reader) and for
//! what a schema cannot say.

use schemars::Schema;
use serde_json::{json, Value};

/// A DNS-1123 subdomain, as object names are: lowercase alphanumerics, `-` and `.`.
pub const DNS1123_SUBDOMAIN_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
pub(crate) const DNS1123_SUBDOMAIN_MAX_LENGTH: u32 = 253;

/// A label value: empty, or up to 63 alphanumerics, `-`, `_` and `.` starting and ending with
/// an alphanumeric.
pub(crate) const LABEL_VALUE_PATTERN: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
pub(crate) const LABEL_VALUE_MAX_LENGTH: u32 = 63;

/// A label key or resource name: `name` or `prefix/name`, the name up to 63 alphanumerics,
/// `-`, `_` and `.` starting and ending with an alphanumeric, the prefix a DNS-1123 subdomain
/// (`[.]`, not an escaped dot, so the pattern reads the same in a CEL string).
pub(crate) const QUALIFIED_NAME_PATTERN: &str = "^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?([.][a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// The longest label key: a 253-character prefix, '/', a 63-character name.
pub(crate) const QUALIFIED_NAME_MAX_LENGTH: u32 = 317;

/// The most labels a WorkerCluster and the most resources a quota may list: a bound the API
/// server needs to accept a CEL rule over every key (its cost is estimated per key).
pub(crate) const MAX_MAP_KEYS: u32 = 64;

/// A non-negative Kubernetes quantity (`500m`, `64Gi`, `1.5`, `2e3`): the API server's
/// resource.Quantity grammar without the minus sign.
pub(crate) const QUANTITY_PATTERN: &str = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// The most worker clusters a queue may name.
pub(crate) const MAX_QUEUE_CLUSTERS: u32 = 64;

/// The longest kubeconfig location: a file path in the pod (PATH_MAX), or a Secret name.
pub(crate) const LOCATION_MAX_LENGTH: u32 = 4096;

/// Adds a CEL rule (`x-kubernetes-validations`) to a schema.
pub(crate) fn add_rule(schema: &mut Schema, rule: String, message: &str) {
    let entry = json!({ "rule": rule, "message": message });
    match schema.ensure_object().get_mut("x-kubernetes-validations") {
        Some(Value::Array(rules)) => rules.push(entry),
        _ => {
            schema.insert("x-kubernetes-validations".into(), json!([entry]));
        }
    }
}

/// A CEL expression that is true when the string field `field` of `self` is absent or is a
/// duration above zero. Rules on durations are guarded by the pattern, so a malformed value is
/// reported once, by the pattern, and not again as a CEL evaluation error (the API server
/// runs the rules even when a pattern failed).
pub(crate) fn cel_duration_positive(field: &str) -> String {
    format!(
        "!has(self.{field}) || !self.{field}.matches('{p}') || duration(self.{field}) > duration('0s')",
        p = super::duration::DURATION_PATTERN
    )
}

/// A CEL rule that every key of a map is a qualified name (a schema cannot constrain map
/// keys otherwise).
fn keys_rule(schema: &mut Schema, what: &str) {
    schema.insert("maxProperties".into(), MAX_MAP_KEYS.into());
    add_rule(
        schema,
        format!(
            "self.all(k, size(k) <= {QUALIFIED_NAME_MAX_LENGTH} && k.matches('{QUALIFIED_NAME_PATTERN}'))"
        ),
        &format!("every key must be {what}: [prefix/]name, the name up to 63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit, the optional prefix a DNS subdomain (e.g. example.com/rack)"),
    );
}

/// `schemars(transform)`: a map of labels, keys and values checked as the API server checks
/// an object's labels.
pub(crate) fn label_map(schema: &mut Schema) {
    schema.insert(
        "additionalProperties".into(),
        json!({
            "type": "string",
            "maxLength": LABEL_VALUE_MAX_LENGTH,
            "pattern": LABEL_VALUE_PATTERN,
        }),
    );
    keys_rule(schema, "a label key");
}

/// `schemars(transform)`: a map from resource names to non-negative quantities, as the API
/// server writes a resource.Quantity (an integer or a string) with the grammar checked:
/// `pattern` applies to strings only and `minimum` to integers only.
pub(crate) fn quantity_map(schema: &mut Schema) {
    schema.insert(
        "additionalProperties".into(),
        json!({
            "minimum": 0,
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": true,
        }),
    );
    keys_rule(schema, "a resource name");
}

/// `schemars(transform)`: a map of quantities the dispatcher writes (status), without
/// resource.Quantity's page-long description repeated in every one.
pub(crate) fn status_quantity_map(schema: &mut Schema) {
    schema.insert(
        "additionalProperties".into(),
        json!({ "x-kubernetes-int-or-string": true }),
    );
}

/// `schemars(transform)`: a metav1.LabelSelector with what the API server checks for its
/// own selectors: the operators, the values each operator takes, label-value syntax.
pub(crate) fn label_selector(schema: &mut Schema) {
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(item) = props
        .get_mut("matchExpressions")
        .and_then(|e| e.get_mut("items"))
        .and_then(Value::as_object_mut)
    {
        if let Some(op) = item
            .get_mut("properties")
            .and_then(|p| p.get_mut("operator"))
            .and_then(Value::as_object_mut)
        {
            op.insert(
                "enum".into(),
                json!(["In", "NotIn", "Exists", "DoesNotExist"]),
            );
            // Bounds the cost the API server estimates for the rule below.
            op.insert("maxLength".into(), json!(12));
        }
        item.insert(
            "x-kubernetes-validations".into(),
            json!([{
                "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",
                "message": "operators In and NotIn need at least one value; Exists and DoesNotExist take none",
            }]),
        );
    }
    if let Some(labels) = props.get_mut("matchLabels").and_then(Value::as_object_mut) {
        labels.insert(
            "additionalProperties".into(),
            json!({
                "type": "string",
                "maxLength": LABEL_VALUE_MAX_LENGTH,
                "pattern": LABEL_VALUE_PATTERN,
            }),
        );
    }
}

/// `schemars(transform)`: a list of object names, each a DNS-1123 subdomain, without
/// duplicates (`x-kubernetes-list-type: set` makes the API server refuse them).
pub(crate) fn name_set(schema: &mut Schema) {
    if let Some(items) = schema.get_mut("items").and_then(Value::as_object_mut) {
        items.insert("pattern".into(), DNS1123_SUBDOMAIN_PATTERN.into());
        items.insert("maxLength".into(), DNS1123_SUBDOMAIN_MAX_LENGTH.into());
    }
    schema.insert("x-kubernetes-list-type".into(), "set".into());
}

/// `schemars(transform)`: an optional object name (DNS-1123 subdomain).
pub(crate) fn object_name(schema: &mut Schema) {
    schema.insert("pattern".into(), DNS1123_SUBDOMAIN_PATTERN.into());
    schema.insert("maxLength".into(), DNS1123_SUBDOMAIN_MAX_LENGTH.into());
}

/// `schemars(transform)`: conditions keyed by type, so server-side apply merges them by type
/// and the API server refuses two conditions of one type.
pub(crate) fn conditions(schema: &mut Schema) {
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert("x-kubernetes-list-map-keys".into(), json!(["type"]));
}
