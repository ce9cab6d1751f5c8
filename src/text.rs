//! Text helpers shared by the surfaces.

use std::fmt;

/// The most of a message about a client's request that is logged and sent back, and of any
/// string from a request in a log line. Such text can be as long as the request (a parser's
/// error quotes the string it could not take): a client must not make the server write
/// lines of hundreds of KB, nor the logger's per-thread buffer (kept at its largest) grow to
/// that size and stay.
pub(crate) const REQUEST_MESSAGE_BYTES: usize = 1024;

/// `text` without the byte order mark some editors start a UTF-8 file with: YAML allows one
/// there, but the YAML parser takes it for the end of a first document.
pub fn without_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// The longest start of `s` of at most `max` bytes that ends on a character boundary.
fn head(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// `s` cut to at most `max` bytes (on a character boundary), marked with "…" when cut.
pub(crate) fn shorten(s: &str, max: usize) -> String {
    let h = head(s, max);
    match h.len() == s.len() {
        true => s.to_string(),
        false => format!("{h}…"),
    }
}

/// A message about a client's request as it is logged and sent back: at most
/// [`REQUEST_MESSAGE_BYTES`] of it, on one line (its control characters escaped, so that a
/// value from the request cannot start a log line of its own).
pub(crate) fn about_request(message: &str) -> String {
    let short = shorten(message, REQUEST_MESSAGE_BYTES);
    match short.contains(char::is_control) {
        true => escape_controls(&short),
        false => short,
    }
}

/// `s` with its control characters escaped as Rust writes them (`\n`, `\u{0}`).
fn escape_controls(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A string from a request as a log field: at most [`REQUEST_MESSAGE_BYTES`] of it, marked
/// with "…" when cut; nothing is copied.
pub(crate) struct Clipped<'a>(pub &'a str);

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = head(self.0, REQUEST_MESSAGE_BYTES);
        match h.contains(char::is_control) {
            true => f.write_str(&escape_controls(h))?,
            false => f.write_str(h)?,
        }
        if h.len() < self.0.len() {
            f.write_str("…")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_comes_from_a_request_stays_on_one_line() {
        assert_eq!(
            about_request("bad group \"x\nFAKE line\r\u{0}\""),
            "bad group \"x\\nFAKE line\\r\\u{0}\""
        );
        assert_eq!(Clipped("a\nb").to_string(), "a\\nb");
        assert_eq!(about_request("plain"), "plain");
    }

    #[test]
    fn shorten_cuts_on_a_character_boundary_and_says_so() {
        assert_eq!(shorten("short", 10), "short");
        assert_eq!(shorten("abcdef", 3), "abc…");
        // "é" is two bytes: a cut inside it moves before it.
        assert_eq!(shorten("aé", 2), "a…");
    }

    #[test]
    fn a_clipped_field_shows_at_most_the_bound() {
        let long = "x".repeat(REQUEST_MESSAGE_BYTES * 100);
        let shown = Clipped(&long).to_string();
        assert_eq!(shown.len(), REQUEST_MESSAGE_BYTES + "…".len());
        assert!(shown.ends_with('…'));
        assert_eq!(Clipped("uid-1").to_string(), "uid-1");
    }
}
