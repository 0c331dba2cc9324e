//! Workload arguments: parsing of `key=value` values and the argument
//! specification of each built-in image.
//!
//! The VMM validates `--arg` flags against [`ImageSpec::args`] with the same
//! parsers the guest uses, so a value the VMM accepts is one the guest
//! understands.

use crate::abi::{from_fixed, ArgEntry};

/// Why an argument value was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// Not a size like `4096`, `64K`, `512M`, `1.5G`.
    BadSize,
    /// Not a number.
    BadNumber,
    /// Outside the allowed range.
    OutOfRange,
    /// Not one of the allowed words.
    BadChoice,
}

/// Parses a size in bytes: an integer or decimal with an optional binary
/// suffix `K`, `M`, `G`, `T` (optionally followed by `B` or `iB`).
pub fn parse_size(s: &str) -> Result<u64, ArgError> {
    let s = s.trim();
    let lower_end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map_or(s.len(), |(i, _)| i);
    let (num, suffix) = s.split_at(lower_end);
    if num.is_empty() {
        return Err(ArgError::BadSize);
    }
    let shift = match suffix {
        "" | "B" | "b" => 0,
        "K" | "k" | "KB" | "KiB" | "kB" => 10,
        "M" | "m" | "MB" | "MiB" => 20,
        "G" | "g" | "GB" | "GiB" => 30,
        "T" | "t" | "TB" | "TiB" => 40,
        _ => return Err(ArgError::BadSize),
    };
    if !num.contains('.') {
        let v: u64 = num.parse().map_err(|_| ArgError::BadSize)?;
        return v.checked_mul(1u64 << shift).ok_or(ArgError::OutOfRange);
    }
    let v: f64 = num.parse().map_err(|_| ArgError::BadSize)?;
    let bytes = v * (1u64 << shift) as f64;
    // Below 2^64 (`u64::MAX as f64` rounds up to exactly 2^64), so the
    // conversion below neither saturates nor rejects sizes u64 can hold.
    if !(0.0..u64::MAX as f64).contains(&bytes) {
        return Err(ArgError::OutOfRange);
    }
    Ok(bytes as u64)
}

/// Parses a finite float.
pub fn parse_f64(s: &str) -> Result<f64, ArgError> {
    let v: f64 = s.trim().parse().map_err(|_| ArgError::BadNumber)?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ArgError::BadNumber)
    }
}

/// Parses an unsigned integer (decimal, or hex with `0x`).
pub fn parse_u64(s: &str) -> Result<u64, ArgError> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).map_err(|_| ArgError::BadNumber),
        None => s.parse().map_err(|_| ArgError::BadNumber),
    }
}

/// The type and range of one argument.
#[derive(Clone, Copy, Debug)]
pub enum ArgKind {
    /// A byte size (see [`parse_size`]) within `min..=max`.
    Size {
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// A float within `min..=max`.
    Float {
        /// Smallest allowed.
        min: f64,
        /// Largest allowed.
        max: f64,
    },
    /// An integer within `min..=max`.
    Int {
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// One of a fixed set of words.
    Choice(&'static [&'static str]),
}

impl ArgKind {
    /// Checks `value` against this kind.
    pub fn check(&self, value: &str) -> Result<(), ArgError> {
        match *self {
            Self::Size { min, max } => in_range(parse_size(value)?, min, max),
            Self::Int { min, max } => in_range(parse_u64(value)?, min, max),
            Self::Float { min, max } => {
                let v = parse_f64(value)?;
                if v < min || v > max {
                    Err(ArgError::OutOfRange)
                } else {
                    Ok(())
                }
            }
            Self::Choice(words) => {
                if words.contains(&value) {
                    Ok(())
                } else {
                    Err(ArgError::BadChoice)
                }
            }
        }
    }
}

fn in_range(v: u64, min: u64, max: u64) -> Result<(), ArgError> {
    if v < min || v > max {
        Err(ArgError::OutOfRange)
    } else {
        Ok(())
    }
}

/// One argument an image accepts.
#[derive(Clone, Copy, Debug)]
pub struct ArgSpec {
    /// The key.
    pub key: &'static str,
    /// Type and range.
    pub kind: ArgKind,
    /// Default value (as text, parsed like user input).
    pub default: &'static str,
    /// One-line help.
    pub help: &'static str,
}

/// A built-in image and the arguments it accepts.
#[derive(Clone, Copy, Debug)]
pub struct ImageSpec {
    /// Name used with `tiervm run IMAGE`.
    pub name: &'static str,
    /// One-line description.
    pub about: &'static str,
    /// Accepted arguments.
    pub args: &'static [ArgSpec],
}

impl ImageSpec {
    /// The spec of `key`, if the image accepts it.
    pub fn arg(&self, key: &str) -> Option<&ArgSpec> {
        self.args.iter().find(|a| a.key == key)
    }
}

/// A view of the arguments passed in boot info (or built on the host),
/// falling back to the spec's defaults.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    entries: &'a [ArgEntry],
    spec: Option<&'a ImageSpec>,
}

impl<'a> Args<'a> {
    /// Arguments `entries`, defaults from `spec`.
    pub fn new(entries: &'a [ArgEntry], spec: Option<&'a ImageSpec>) -> Self {
        Self { entries, spec }
    }

    /// The raw value of `key`: given, else the spec default.
    pub fn raw(&self, key: &str) -> Option<&'a str> {
        self.entries
            .iter()
            .rev()
            .find(|e| from_fixed(&e.key) == Some(key))
            .and_then(|e| from_fixed(&e.value))
            .or_else(|| self.spec.and_then(|s| s.arg(key)).map(|a| a.default))
    }

    /// `key` as a size; `fallback` if absent or malformed.
    pub fn size(&self, key: &str, fallback: u64) -> u64 {
        self.raw(key)
            .and_then(|v| parse_size(v).ok())
            .unwrap_or(fallback)
    }

    /// `key` as a float; `fallback` if absent or malformed.
    pub fn f64(&self, key: &str, fallback: f64) -> f64 {
        self.raw(key)
            .and_then(|v| parse_f64(v).ok())
            .unwrap_or(fallback)
    }

    /// `key` as an integer; `fallback` if absent or malformed.
    pub fn u64(&self, key: &str, fallback: u64) -> u64 {
        self.raw(key)
            .and_then(|v| parse_u64(v).ok())
            .unwrap_or(fallback)
    }

    /// `key` as text; `fallback` if absent.
    pub fn str(&self, key: &str, fallback: &'a str) -> &'a str {
        self.raw(key).unwrap_or(fallback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::to_fixed;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("13.5G"), Ok(27 << 29));
        assert_eq!(parse_size(""), Err(ArgError::BadSize));
        assert_eq!(parse_size("M"), Err(ArgError::BadSize));
        assert_eq!(parse_size("12X"), Err(ArgError::BadSize));
        assert_eq!(parse_size("-1"), Err(ArgError::BadSize));
        assert_eq!(parse_size("99999999999T"), Err(ArgError::OutOfRange));
        assert_eq!(parse_size("16777216.0T"), Err(ArgError::OutOfRange));
        assert_eq!(
            parse_size("16370807.5T"),
            Ok(16_370_807 * (1 << 40) + (1 << 39))
        );
        assert_eq!(parse_size("1.2.3G"), Err(ArgError::BadSize));
    }

    #[test]
    fn kinds_check_ranges() {
        let k = ArgKind::Float { min: 0.0, max: 1.0 };
        assert!(k.check("0.5").is_ok());
        assert_eq!(k.check("1.5"), Err(ArgError::OutOfRange));
        assert_eq!(k.check("nan"), Err(ArgError::BadNumber));
        let c = ArgKind::Choice(&["a", "b"]);
        assert!(c.check("b").is_ok());
        assert_eq!(c.check("c"), Err(ArgError::BadChoice));
    }

    #[test]
    fn args_fall_back_to_defaults_and_last_wins() {
        static SPEC: ImageSpec = ImageSpec {
            name: "t",
            about: "",
            args: &[ArgSpec {
                key: "wss",
                kind: ArgKind::Size {
                    min: 0,
                    max: u64::MAX,
                },
                default: "1M",
                help: "",
            }],
        };
        let e = |k: &str, v: &str| ArgEntry {
            key: to_fixed(k).unwrap(),
            value: to_fixed(v).unwrap(),
        };
        let entries = [e("x", "3"), e("x", "4")];
        let args = Args::new(&entries, Some(&SPEC));
        assert_eq!(args.size("wss", 0), 1 << 20);
        assert_eq!(args.u64("x", 0), 4);
        assert_eq!(args.u64("missing", 9), 9);
    }
}
