//! Logging set-up: text or JSON lines, filtered with RUST_LOG syntax.

use crate::cli::LogFormat;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `filter` wins over `RUST_LOG`; the default is `info`.
pub fn init(format: LogFormat, filter: Option<&str>) -> Result<(), String> {
    let filter = match filter {
        Some(f) => EnvFilter::try_new(f).map_err(|e| format!("log filter {f:?}: {e}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))
}
