//! Kubernetes resource quantities ("500m", "64Gi", "1.5", "2e3") as integer milli-units, so
//! CPU, memory and device counts are compared exactly, without floating point.

use serde::Deserialize;
use std::fmt;

/// A quantity in thousandths of its unit: 1 CPU = 1000, 1 byte of memory = 1000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct Milli(pub i64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QuantityError {
    #[error("{0:?} is not a Kubernetes quantity (e.g. 500m, 2, 64Gi, 1.5G)")]
    Malformed(String),
    #[error("{0:?} is negative: an amount of a resource is 0 or more")]
    Negative(String),
    /// Counted in thousandths in an i64: up to about 9.2 × 10^15 of a unit (8 Pi of bytes).
    #[error(
        "{0:?} is more than Switchyard counts (at most about 9.2e15 of a unit, 8Pi of memory)"
    )]
    TooLarge(String),
}

impl Milli {
    /// Whole units (e.g. an integer CPU count), when the quantity is one.
    pub(crate) fn whole(self) -> Option<i64> {
        (self.0 % 1000 == 0).then_some(self.0 / 1000)
    }
}

/// Parses a quantity. Fractions below a milli-unit round up, as Kubernetes does for requests.
pub(crate) fn parse(text: &str) -> Result<Milli, QuantityError> {
    // The error quotes the text, cut short: it is repeated for every node a filter fails,
    // and a real quantity is a few bytes.
    let quoted = || crate::text::shorten(text, 64);
    let err = || QuantityError::Malformed(quoted());
    let too_large = || QuantityError::TooLarge(quoted());
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    // A well-formed negative quantity is said to be negative once it is read.
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty()
        || !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(err());
    }
    // value = digits × 10^(-frac_len) × multiplier × 1000, kept in i128 until the end; an
    // exponent past what i128 can scale by leaves the value too large, or (rounded up, as
    // all of it) one thousandth.
    let (num, den): (i128, i128) = match suffix {
        "" => (1000, 1),
        "m" => (1, 1),
        "k" => (1_000_000, 1),
        "M" => (1_000_000_000, 1),
        "G" => (1_000_000_000_000, 1),
        "T" => (1_000_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000_000, 1),
        "Ki" => (1000 << 10, 1),
        "Mi" => (1000 << 20, 1),
        "Gi" => (1000 << 30, 1),
        "Ti" => (1000 << 40, 1),
        "Pi" => (1000 << 50, 1),
        "Ei" => (1000 << 60, 1),
        "u" => (1, 1000),
        "n" => (1, 1_000_000),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| err())?;
            match exp {
                31.. => (i128::MAX, 1),
                0..=30 => (1000 * 10i128.pow(exp as u32), 1),
                -30..=-1 => (1000, 10i128.pow((-exp) as u32)),
                _ => (1, i128::MAX),
            }
        }
        _ => return Err(err()),
    };
    // Well formed from here: past i128, the number is only too large.
    let digits: i128 = format!("{int_part}{frac_part}")
        .parse()
        .map_err(|_| too_large())?;
    if digits == 0 {
        return Ok(Milli(0));
    }
    if negative {
        return Err(QuantityError::Negative(quoted()));
    }
    // A fraction too long to scale is a malformed quantity; a number too large to, too large.
    let frac_den = 10i128.checked_pow(frac_part.len() as u32).ok_or_else(err)?;
    let scaled_num = digits.checked_mul(num).ok_or_else(too_large)?;
    // Past i128, the divisor leaves less than a thousandth: one, rounded up.
    let Some(scaled_den) = den.checked_mul(frac_den) else {
        return Ok(Milli(1));
    };
    // Round up: a request of 0.1m is 1m.
    let value = scaled_num / scaled_den + i128::from(scaled_num % scaled_den != 0);
    i64::try_from(value).map(Milli).map_err(|_| too_large())
}

impl fmt::Display for Milli {
    /// Whole units when exact, milli-units otherwise (`4`, `500m`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.whole() {
            Some(n) => write!(f, "{n}"),
            None => write!(f, "{}m", self.0),
        }
    }
}

/// Renders an amount of `resource` for people: bytes as Gi/Mi when exact, CPUs as cores.
pub(crate) fn display(resource: &str, m: Milli) -> String {
    let is_bytes = resource == "memory"
        || resource == "ephemeral-storage"
        || resource.starts_with("hugepages-");
    if is_bytes {
        if let Some(bytes) = m.whole() {
            for (unit, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
                if bytes != 0 && bytes % (1i64 << shift) == 0 {
                    return format!("{}{unit}", bytes >> shift);
                }
            }
        }
    }
    m.to_string()
}

/// A quantity written as a string ("64Gi") or a bare YAML number (8).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
#[serde(
    expecting = "expected a quantity: a string such as \"500m\", \"2\" or \"64Gi\", or a number"
)]
pub(crate) enum QuantityText {
    Text(String),
    Int(i64),
    Float(f64),
}

/// Equal when written alike (a float by its bits), as a pod template's text would be: what
/// groups identical templates (see `simulate::scenario`).
impl PartialEq for QuantityText {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Text(a), Self::Text(b)) => a == b,
            (Self::Int(a), Self::Int(b)) => a == b,
            (Self::Float(a), Self::Float(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

impl Eq for QuantityText {}

impl std::hash::Hash for QuantityText {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Self::Text(t) => t.hash(state),
            Self::Int(n) => n.hash(state),
            Self::Float(f) => f.to_bits().hash(state),
        }
    }
}

impl QuantityText {
    pub(crate) fn parse(&self) -> Result<i64, QuantityError> {
        match self {
            Self::Text(t) => parse(t).map(|m| m.0),
            Self::Int(n) => parse(&n.to_string()).map(|m| m.0),
            Self::Float(f) => parse(&f.to_string()).map(|m| m.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_exactly() {
        for (text, milli) in [
            ("1", 1000),
            ("500m", 500),
            ("1.5", 1500),
            ("0.1", 100),
            ("64Gi", 64i64 * 1000 * (1 << 30)),
            ("1G", 1_000_000_000_000),
            ("2k", 2_000_000),
            ("1e3", 1_000_000),
            ("1.5e-3", 2),
            ("100u", 1),
            ("+3", 3000),
            (".5", 500),
        ] {
            assert_eq!(parse(text), Ok(Milli(milli)), "{text}");
        }
        for bad in ["", "-", "1x", "Gi", "1.2.3", "e3", "1e", "1e+"] {
            assert_eq!(
                parse(bad),
                Err(QuantityError::Malformed(bad.into())),
                "{bad:?}"
            );
        }
        assert_eq!(parse("-1"), Err(QuantityError::Negative("-1".into())));
        assert_eq!(
            parse("-1.5Gi"),
            Err(QuantityError::Negative("-1.5Gi".into()))
        );
        assert_eq!(parse("-."), Err(QuantityError::Malformed("-.".into())));
        assert_eq!(parse("-0"), Ok(Milli(0)));
        // Quantities Kubernetes takes, past what thousandths in an i64 hold: said as such.
        for large in [
            "9Pi",
            "32000000Gi",
            "9223372036854776",
            "99999999999999999999P",
        ] {
            assert_eq!(
                parse(large),
                Err(QuantityError::TooLarge(large.into())),
                "{large:?}"
            );
        }
        assert_eq!(parse("8Pi"), Ok(Milli(8000 << 50)));
        // Every suffix and exponent Kubernetes takes is read: exa, exbi, any exponent.
        for large in ["1e18", "1Ei", "1E", "2e40", "1.5e31", "1e99"] {
            assert_eq!(
                parse(large),
                Err(QuantityError::TooLarge(large.into())),
                "{large:?}"
            );
        }
        assert_eq!(parse("0Ei"), Ok(Milli(0)));
        assert_eq!(parse("0e99"), Ok(Milli(0)));
        assert_eq!(parse("1e15"), Ok(Milli(1_000_000_000_000_000_000)));
        assert_eq!(parse("1e-40"), Ok(Milli(1)));
        assert_eq!(parse("1.5e-40"), Ok(Milli(1)));
        assert_eq!(parse("25e-4"), Ok(Milli(3)));
    }

    #[test]
    fn display_is_readable() {
        assert_eq!(display("memory", parse("8Gi").unwrap()), "8Gi");
        assert_eq!(display("cpu", parse("1500m").unwrap()), "1500m");
        assert_eq!(display("nvidia.com/gpu", parse("4").unwrap()), "4");
    }
}
