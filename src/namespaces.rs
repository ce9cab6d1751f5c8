//! Namespace labels for the default-queue rule. An AdmissionReview does not carry them, so
//! they are read from the API server through a short-lived cache (moka), or, with
//! `--standalone`, reduced to the one label every Namespace has: its name.

use crate::wellknown::NAMESPACE_NAME_LABEL;
use k8s_openapi::api::core::v1::Namespace;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

pub type Labels = Arc<BTreeMap<String, String>>;

#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot read Namespace {namespace:?} from the API server: {message}")]
pub struct NamespaceError {
    pub(crate) namespace: String,
    pub message: String,
}

/// Where Namespace labels come from.
#[derive(Clone)]
pub enum NamespaceLabels {
    /// No API server: a Namespace's only known label is `kubernetes.io/metadata.name`.
    Standalone,
    Live(Box<LiveLookup>),
}

#[derive(Clone)]
pub struct LiveLookup {
    api: kube::Api<Namespace>,
    cache: moka::future::Cache<String, Option<Labels>>,
}

impl NamespaceLabels {
    pub fn live(client: kube::Client, ttl: Duration) -> Self {
        Self::Live(Box::new(LiveLookup {
            api: kube::Api::all(client),
            cache: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(ttl)
                .build(),
        }))
    }

    /// The labels of Namespace `name`; `None` when it does not exist.
    pub async fn get(&self, name: &str) -> Result<Option<Labels>, NamespaceError> {
        match self {
            Self::Standalone => Ok(Some(Arc::new(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                name.to_string(),
            )])))),
            Self::Live(live) => {
                let LiveLookup { api, cache } = live.as_ref();
                // Concurrent reviews for one namespace share a single request; failures are
                // not cached, so the next review tries again.
                cache
                    .try_get_with(name.to_string(), async {
                        // Bounded well inside the webhook's own 5 s timeout.
                        let ns = tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(name))
                            .await
                            .map_err(|_| format!("no answer within {LOOKUP_TIMEOUT:?}"))?
                            .map_err(|e| e.to_string())?;
                        Ok::<_, String>(
                            ns.map(|ns| Arc::new(ns.metadata.labels.unwrap_or_default())),
                        )
                    })
                    .await
                    .map_err(|e| NamespaceError {
                        namespace: name.to_string(),
                        message: e.to_string(),
                    })
            }
        }
    }
}
