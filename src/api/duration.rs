//! Durations as the Kubernetes API writes them (`30s`, `5m`, `1h30m`), kept as the text the
//! user wrote so an object read and written back is unchanged.

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// What the schema accepts as a duration: Go's `time.ParseDuration` syntax without a sign, or a
/// bare `0`. It accepts nothing that `crate::config::parse_duration` or Go refuses, so CEL's
/// `duration()` never fails on a value that passed it. `[.]` rather than `\.` so the same text
/// can sit inside a CEL string literal.
pub const DURATION_PATTERN: &str =
    "^(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|\u{b5}s|ms|s|m|h))+)$";

/// The longest duration text accepted. It bounds the cost of the CEL rules that read durations.
pub(crate) const DURATION_MAX_LENGTH: u32 = 32;

/// A non-negative duration in Kubernetes form. In the schema: a string matching
/// [`DURATION_PATTERN`]. Reading also takes a plain integer as seconds (the scenario format
/// allows it; the API server never sends one, its schema says string).
#[derive(Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub(crate) struct KubeDuration(String);

impl KubeDuration {
    /// A duration from its text, unchecked: [`KubeDuration::get`] says whether it is one.
    pub(crate) fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The duration, or why the text is not one (the message quotes it).
    pub(crate) fn get(&self) -> Result<Duration, String> {
        crate::config::parse_duration(&self.0)
    }
}

impl From<Duration> for KubeDuration {
    /// Whole hours, minutes or seconds when the duration is one, milliseconds otherwise.
    fn from(d: Duration) -> Self {
        let ms = d.as_millis();
        let text = match ms {
            0 => "0s".to_string(),
            _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
            _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
            _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
            _ => format!("{ms}ms"),
        };
        Self(text)
    }
}

impl fmt::Display for KubeDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for KubeDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<'de> Deserialize<'de> for KubeDuration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = KubeDuration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 30s, 5m or 1h30m")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(KubeDuration(v.to_string()))
            }

            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(KubeDuration(v))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(KubeDuration(format!("{v}s")))
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u64::try_from(v)
                    .map(|s| KubeDuration(format!("{s}s")))
                    .map_err(|_| {
                        E::invalid_value(
                            serde::de::Unexpected::Signed(v),
                            &"a non-negative duration",
                        )
                    })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl JsonSchema for KubeDuration {
    fn schema_name() -> Cow<'static, str> {
        "KubeDuration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": DURATION_MAX_LENGTH,
        })
    }
}
