//! The API server's name rules, in Rust: for objects read without an API server (scenario
//! files) and for what a CRD schema cannot check (map keys).

/// RFC 1123 label, as Kubernetes validates names: at most 63 characters of lowercase letters,
/// digits and '-', starting and ending with a letter or digit.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner_ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let edge_ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(inner_ok)
        && b.first().is_some_and(edge_ok)
        && b.last().is_some_and(edge_ok)
}

/// Object names, Secret names, scheduler names: dot-separated DNS-1123 labels, 253 at most.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// The name part of a qualified name: up to 63 alphanumerics, `-`, `_`, `.`, starting and
/// ending with an alphanumeric.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let inner_ok = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(inner_ok)
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Label keys and resource names: `name` or `prefix/name`, the prefix a DNS-1123 subdomain.
pub fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(s),
    }
}

/// Label values: empty, or a qualified name's name part.
pub(crate) fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}
