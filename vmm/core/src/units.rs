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
