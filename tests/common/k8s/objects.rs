//! Objects of any kind from YAML or JSON, written with server-side apply (or checked with a
//! server-side dry run), their resource found through discovery.

use kube::api::{Patch, PatchParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::{Api, Client};
use serde_json::Value;
use std::time::Duration;

/// Every document of a multi-document YAML text, empty ones left out.
pub fn yaml_documents(text: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v: Value = serde::Deserialize::deserialize(doc).map_err(|e| format!("YAML: {e}"))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// `namespace/name (Kind)` of an object, for messages.
pub fn describe(object: &Value) -> String {
    let m = &object["metadata"];
    let name = m["name"].as_str().unwrap_or("?");
    let kind = object["kind"].as_str().unwrap_or("?");
    match m["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

fn gvk(object: &Value) -> Result<GroupVersionKind, String> {
    let api_version = object["apiVersion"]
        .as_str()
        .ok_or_else(|| format!("{} has no apiVersion", describe(object)))?;
    let kind = object["kind"]
        .as_str()
        .ok_or_else(|| format!("{} has no kind", describe(object)))?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Ok(GroupVersionKind::gvk(group, version, kind))
}

/// The API of `object`'s kind, in its namespace if it has one.
pub async fn api_for(client: &Client, object: &Value) -> Result<Api<DynamicObject>, String> {
    let gvk = gvk(object)?;
    let (resource, caps): (ApiResource, ApiCapabilities) =
        kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|e| format!("{}: kind not served: {e}", describe(object)))?;
    Ok(match caps.scope {
        Scope::Namespaced => {
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    })
}

/// Server-side apply of `object` (forced: the test owns these fields); with `dry_run` the API
/// server validates and admits it without storing it.
pub async fn apply(
    client: &Client,
    object: &Value,
    dry_run: bool,
) -> Result<DynamicObject, String> {
    let api = api_for(client, object).await?;
    let name = object["metadata"]["name"]
        .as_str()
        .ok_or_else(|| format!("{} has no name", describe(object)))?;
    let mut params = PatchParams::apply("switchyard-tests").force();
    params.dry_run = dry_run;
    api.patch(name, &params, &Patch::Apply(object))
        .await
        .map_err(|e| format!("{}: {e}", describe(object)))
}

/// Applies every document of `text`, in order.
pub async fn apply_yaml(client: &Client, text: &str) -> Result<Vec<DynamicObject>, String> {
    let mut out = Vec::new();
    for doc in yaml_documents(text)? {
        out.push(apply(client, &doc, false).await?);
    }
    Ok(out)
}

/// Waits (up to `timeout`) for the CustomResourceDefinition `name` to be Established.
pub async fn wait_established(client: &Client, name: &str, timeout: Duration) {
    let api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    super::eventually(
        &format!("CustomResourceDefinition {name} Established"),
        timeout,
        || {
            let api = api.clone();
            async move {
                let crd = api.get(name).await.map_err(|e| e.to_string())?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    Ok(())
                } else {
                    Err("not Established".into())
                }
            }
        },
    )
    .await
}
