//! Parsing and printing of sizes and durations given on the command line.

use std::time::Duration;

/// A size or duration flag that does not parse (clap shows the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// Not a byte size.
    #[error("'{0}' is not a size: use e.g. 4096, 64K, 512M, 1G")]
    Size(String),
    /// Not a duration.
    #[error("'{0}' is not a duration: use e.g. 500ms, 5s, 2m")]
    Duration(String),
}

/// Parses a byte size like `1G`, `512M`, `4096` (binary suffixes).
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    tiervm_guest::args::parse_size(s).map_err(|_| UnitError::Size(s.into()))
}

/// Parses a duration like `5s`, `500ms`, `2m`, `1.5s` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    tiering::engine::parse_duration(s).ok_or_else(|| UnitError::Duration(s.into()))
}

/// Formats a byte count with a binary suffix (`1G`, `512M`, `4.5K`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    for (suffix, unit) in UNITS {
        if bytes >= unit {
            let v = bytes as f64 / unit as f64;
            return if bytes.is_multiple_of(unit) {
                format!("{}{suffix}", bytes / unit)
            } else {
                format!("{v:.1}{suffix}")
            };
        }
    }
    format!("{bytes}")
}

/// Longest duration the wire formats carry, in seconds (the bound of
/// [`parse_duration`] too): about 31 years.
pub const MAX_WIRE_SECS: f64 = 1e9;

/// A number of seconds that is not a duration (negative, not a number, or
/// beyond [`MAX_WIRE_SECS`]).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("{0} is not a duration in seconds: give a number from 0 to {MAX_WIRE_SECS}")]
pub struct SecsError(pub f64);

/// The duration of `secs` float seconds, if it is one (0 to [`MAX_WIRE_SECS`]).
pub fn duration_of_secs(secs: f64) -> Result<Duration, SecsError> {
    if !(secs.is_finite() && (0.0..=MAX_WIRE_SECS).contains(&secs)) {
        return Err(SecsError(secs));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| SecsError(secs))
}

/// `#[serde(with = "secs")]`: a [`Duration`] as float seconds (to the
/// nanosecond that an `f64` holds); negative, NaN or huge values are
/// refused with [`SecsError`]'s message.
pub mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `d` as float seconds.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    /// Reads float seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        super::duration_of_secs(f64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "opt_secs")]`: an `Option<Duration>` as float seconds or
/// null (see [`secs`]).
pub mod opt_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `d` as float seconds, or null.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }

    /// Reads float seconds or null.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<f64>::deserialize(d)?
            .map(super::duration_of_secs)
            .transpose()
            .map_err(serde::de::Error::custom)
    }
}

/// `1234567` -> `1,234,567`.
pub fn group(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::new();
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_digits() {
        assert_eq!(group(0), "0");
        assert_eq!(group(1234567), "1,234,567");
        assert_eq!(group(100), "100");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["", "s", "-1s", "1x", "nan", "1e20s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn seconds_on_the_wire() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct T {
            #[serde(with = "secs")]
            d: Duration,
            #[serde(with = "opt_secs", default, skip_serializing_if = "Option::is_none")]
            o: Option<Duration>,
        }
        let t = T {
            d: Duration::from_millis(1500),
            o: Some(Duration::from_millis(250)),
        };
        let j = serde_json::to_string(&t).unwrap();
        assert_eq!(j, r#"{"d":1.5,"o":0.25}"#);
        assert_eq!(serde_json::from_str::<T>(&j).unwrap(), t);
        let none: T = serde_json::from_str(r#"{"d":60}"#).unwrap();
        assert_eq!((none.d, none.o), (Duration::from_secs(60), None));
        assert_eq!(serde_json::to_string(&none).unwrap(), r#"{"d":60.0}"#);
        for bad in [
            r#"{"d":-1}"#,
            r#"{"d":1e20}"#,
            r#"{"d":1,"o":-0.5}"#,
            r#"{"d":"5s"}"#,
        ] {
            assert!(serde_json::from_str::<T>(bad).is_err(), "{bad}");
        }
        let e = serde_json::from_str::<T>(r#"{"d":-1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("-1 is not a duration in seconds"), "{e}");
        for bad in [f64::NAN, f64::INFINITY, -0.001, 1.5e9] {
            assert!(duration_of_secs(bad).is_err(), "{bad}");
        }
        assert_eq!(duration_of_secs(0.0).unwrap(), Duration::ZERO);
    }

    #[test]
    fn sizes() {
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(1536 << 20), "1.5G");
        assert_eq!(format_size(100), "100");
        assert!(parse_size("1Q")
            .unwrap_err()
            .to_string()
            .contains("not a size"));
    }
}
