//! Workload arguments (`--arg KEY=VALUE`): split, checked against a
//! built-in image's spec, and packed into the boot info's ABI entries.

use tiervm_guest::abi::ArgEntry;
use tiervm_guest::args::{ArgError as ValueError, ArgKind};

use crate::units::format_size;

/// A workload argument (`--arg KEY=VALUE`) that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadArgError {
    /// Not `key=value`.
    #[error("--arg '{arg}' is not key=value: write e.g. --arg wss=256M")]
    NotKeyValue {
        /// The flag's value.
        arg: String,
    },
    /// The image has no such argument.
    #[error("unknown --arg key '{key}' for image {image}: valid keys are {}", .valid.join(", "))]
    UnknownKey {
        /// The key given.
        key: String,
        /// The image.
        image: String,
        /// The image's keys.
        valid: Vec<&'static str>,
    },
    /// The value does not parse or is out of range.
    #[error("--arg {key}={value} for image {image} is {why}: give {expected}")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// The image.
        image: String,
        /// "out of range", "not an allowed value" or "malformed".
        why: &'static str,
        /// What the argument accepts.
        expected: String,
    },
    /// The key does not fit the boot-info entry.
    #[error(
        "--arg key '{key}' is too long (max {} bytes) or contains NUL",
        tiervm_guest::abi::ARG_KEY_LEN
    )]
    KeyTooLong {
        /// The key.
        key: String,
    },
    /// The value does not fit the boot-info entry.
    #[error(
        "--arg value '{value}' is too long (max {} bytes) or contains NUL",
        tiervm_guest::abi::ARG_VALUE_LEN
    )]
    ValueTooLong {
        /// The value.
        value: String,
    },
    /// More arguments than the boot info holds.
    #[error(
        "{count} --arg flags given; at most {} are supported",
        tiervm_guest::abi::MAX_ARGS
    )]
    TooMany {
        /// Arguments given.
        count: usize,
    },
}

/// Splits `key=value` flags.
pub fn parse_kv(args: &[String]) -> std::result::Result<Vec<(String, String)>, WorkloadArgError> {
    args.iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => Err(WorkloadArgError::NotKeyValue { arg: a.clone() }),
        })
        .collect()
}

/// Checks `args` against a built-in image's spec.
pub fn check_args(
    image: &str,
    spec: &tiervm_guest::args::ImageSpec,
    args: &[(String, String)],
) -> std::result::Result<(), WorkloadArgError> {
    for (k, v) in args {
        let Some(a) = spec.arg(k) else {
            return Err(WorkloadArgError::UnknownKey {
                key: k.clone(),
                image: image.to_string(),
                valid: spec.args.iter().map(|a| a.key).collect(),
            });
        };
        if let Err(e) = a.kind.check(v) {
            let expected = match a.kind {
                ArgKind::Size { min, max } => {
                    format!("a size from {} to {}", format_size(min), format_size(max))
                }
                ArgKind::Float { min, max } => format!("a number from {min} to {max}"),
                ArgKind::Int { min, max } => format!("an integer from {min} to {max}"),
                ArgKind::Choice(words) => format!("one of {}", words.join(", ")),
            };
            let why = match e {
                ValueError::OutOfRange => "out of range",
                ValueError::BadChoice => "not an allowed value",
                _ => "malformed",
            };
            return Err(WorkloadArgError::BadValue {
                key: k.clone(),
                value: v.clone(),
                image: image.to_string(),
                why,
                expected,
            });
        }
    }
    Ok(())
}

/// Converts `key=value` pairs to ABI entries.
pub fn to_entries(
    args: &[(String, String)],
) -> std::result::Result<Vec<ArgEntry>, WorkloadArgError> {
    if args.len() > tiervm_guest::abi::MAX_ARGS {
        return Err(WorkloadArgError::TooMany { count: args.len() });
    }
    args.iter()
        .map(|(k, v)| {
            Ok(ArgEntry {
                key: tiervm_guest::abi::to_fixed(k)
                    .ok_or_else(|| WorkloadArgError::KeyTooLong { key: k.clone() })?,
                value: tiervm_guest::abi::to_fixed(v)
                    .ok_or_else(|| WorkloadArgError::ValueTooLong { value: v.clone() })?,
            })
        })
        .collect()
}
