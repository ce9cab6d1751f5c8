//! Logging set-up: text or JSON lines, filtered with RUST_LOG syntax.

use crate::cli::LogFormat;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// The log filter: `filter` (the `--log` flag or the file's `log`) wins over `rust_log` (the
/// `RUST_LOG` variable); the default is `info`. A filter that does not parse is an error, not
/// a quiet fallback: a mistyped `debug` would otherwise hide the very lines someone asked for.
pub(crate) fn env_filter(
    filter: Option<&str>,
    rust_log: Option<&str>,
) -> Result<EnvFilter, String> {
    let (text, source) = match (filter, rust_log.filter(|v| !v.trim().is_empty())) {
        (Some(f), _) => (f, "log filter"),
        (None, Some(env)) => (env, "RUST_LOG"),
        (None, None) => ("info", "default log filter"),
    };
    EnvFilter::try_new(text).map_err(|e| {
        format!(
            "{source} {text:?} is not valid: {e}; use RUST_LOG syntax, e.g. info,switchyard=debug"
        )
    })
}

/// Installs the global subscriber, filtered as [`env_filter`] decides from `filter` and the
/// `RUST_LOG` variable.
pub fn init(format: LogFormat, filter: Option<&str>) -> Result<(), String> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = env_filter(filter, rust_log.as_deref())?;
    // Colour only on a terminal: in a file, a pipe or a container's log the escape codes are
    // noise around every field.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_that_do_not_parse_are_errors_naming_their_source() {
        assert!(env_filter(None, None).is_ok());
        assert!(
            env_filter(None, Some("")).is_ok(),
            "an empty RUST_LOG is unset"
        );
        assert!(env_filter(None, Some("warn,switchyard=debug")).is_ok());
        assert!(
            env_filter(Some("debug"), Some("switchyard=loud")).is_ok(),
            "the flag wins"
        );
        let err = env_filter(None, Some("switchyard=loud")).unwrap_err();
        assert!(err.starts_with("RUST_LOG \"switchyard=loud\""), "{err}");
        let err = env_filter(Some("info,switchyard=[x"), None).unwrap_err();
        assert!(err.starts_with("log filter"), "{err}");
    }
}
