//! What the engine runs when: the policy schedule (`nomad@0s,tpp@20s`) and
//! per-policy interval overrides (`mtm=2s`), parsed from their command-line
//! form.

use std::time::Duration;

use crate::policy::PolicyKind;

/// A scheduled policy switch: at `at` after the engine starts, switch to `policy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSwitch {
    /// When.
    pub at: Duration,
    /// To which policy.
    pub policy: PolicyKind,
}

/// A policy schedule that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// An entry without `@`.
    #[error("'{part}' is not POLICY@TIME, e.g. nomad@0s,tpp@20s")]
    NotPolicyAtTime {
        /// The entry.
        part: String,
    },
    /// The time does not parse.
    #[error("'{time}' in '{part}' is not a time like 500ms, 20s, 2m")]
    BadTime {
        /// The time given.
        time: String,
        /// The entry.
        part: String,
    },
    /// The policy does not exist.
    #[error("unknown policy '{name}' in the schedule; valid: {}", PolicyKind::names(&PolicyKind::POLICIES))]
    UnknownPolicy {
        /// The name given.
        name: String,
    },
    /// No entries.
    #[error("empty --policy-schedule: give e.g. nomad@0s,tpp@20s")]
    Empty,
    /// Times out of order.
    #[error("--policy-schedule times must not decrease")]
    Decreasing,
}

/// Per-policy interval overrides that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    /// An entry without `=`.
    #[error("'{part}' is not POLICY=TIME, e.g. mtm=2s")]
    NotPolicyEqualsTime {
        /// The entry.
        part: String,
    },
    /// The policy has no interval.
    #[error("'{name}' has no interval to set; policies with one: {}", PolicyKind::names(&policies_with_interval()))]
    NoInterval {
        /// The name given.
        name: String,
    },
    /// The same policy twice.
    #[error("{name} is given twice: give each policy once")]
    Twice {
        /// The policy.
        name: String,
    },
    /// The time does not parse or is below 1 ms.
    #[error("'{time}' in '{part}' is not a time of at least 1ms like 500ms, 2s")]
    BadTime {
        /// The time given.
        time: String,
        /// The entry.
        part: String,
    },
    /// No entries.
    #[error("empty list: give e.g. mtm=2s")]
    Empty,
}

/// Parses `nomad@0s,tpp@20s` (times like `500ms`, `20s`, `2m`).
pub fn parse_schedule(s: &str) -> Result<Vec<ScheduledSwitch>, ScheduleError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, at) = part
            .split_once('@')
            .ok_or_else(|| ScheduleError::NotPolicyAtTime { part: part.into() })?;
        let at = parse_duration(at).ok_or_else(|| ScheduleError::BadTime {
            time: at.into(),
            part: part.into(),
        })?;
        let policy = scheduled_policy(name)
            .ok_or_else(|| ScheduleError::UnknownPolicy { name: name.into() })?;
        out.push(ScheduledSwitch { at, policy });
    }
    if out.is_empty() {
        return Err(ScheduleError::Empty);
    }
    if out.windows(2).any(|w| w[0].at > w[1].at) {
        return Err(ScheduleError::Decreasing);
    }
    Ok(out)
}

/// The policy a schedule or an interval override may name: one of the six
/// policies (not a simulator variant), by its exact name.
fn scheduled_policy(name: &str) -> Option<PolicyKind> {
    PolicyKind::from_name(name).filter(|k| !k.is_variant())
}

/// Policies with an interval that `--policy-interval` can set: the
/// migration interval of memtis and mtm, colloid's quantum.
pub fn policies_with_interval() -> Vec<PolicyKind> {
    PolicyKind::POLICIES
        .into_iter()
        .filter(|k| k.interval_kind().is_some())
        .collect()
}

/// Parses `mtm=2s,memtis=1s` (per-policy interval overrides).
pub fn parse_intervals(s: &str) -> Result<Vec<(PolicyKind, Duration)>, IntervalError> {
    let mut out: Vec<(PolicyKind, Duration)> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, d) = part
            .split_once('=')
            .ok_or_else(|| IntervalError::NotPolicyEqualsTime { part: part.into() })?;
        let kind = scheduled_policy(name)
            .filter(|k| k.interval_kind().is_some())
            .ok_or_else(|| IntervalError::NoInterval { name: name.into() })?;
        if out.iter().any(|(k, _)| *k == kind) {
            return Err(IntervalError::Twice { name: name.into() });
        }
        let d = parse_duration(d)
            .filter(|d| *d >= Duration::from_millis(1))
            .ok_or_else(|| IntervalError::BadTime {
                time: d.into(),
                part: part.into(),
            })?;
        out.push((kind, d));
    }
    if out.is_empty() {
        return Err(IntervalError::Empty);
    }
    Ok(out)
}

/// Parses a duration like `5s`, `500ms`, `2m`, `1h`, `1.5s` or a bare
/// number of seconds, up to 1e9 s (the one duration parser of tiervm: the
/// command line's flags use it too).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().ok()?;
    let secs = v * mult;
    (secs.is_finite() && (0.0..=1e9).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_and_reject() {
        let s = parse_schedule("nomad@0s,tpp@20s").unwrap();
        assert_eq!(
            s[1],
            ScheduledSwitch {
                at: Duration::from_secs(20),
                policy: PolicyKind::Tpp
            }
        );
        let err = |s: &str| parse_schedule(s).unwrap_err();
        assert!(matches!(
            err("nomad"),
            ScheduleError::NotPolicyAtTime { .. }
        ));
        assert!(err("nomad").to_string().contains("POLICY@TIME"));
        assert!(err("foo@1s").to_string().contains("unknown policy"));
        assert!(matches!(
            err("tpp-lru@1s"),
            ScheduleError::UnknownPolicy { .. }
        ));
        assert_eq!(err("tpp@2s,nomad@1s"), ScheduleError::Decreasing);
        assert!(err("tpp@xs").to_string().contains("not a time"));
    }

    #[test]
    fn intervals_parse_and_reject() {
        let v = parse_intervals("mtm=2s, memtis=500ms").unwrap();
        assert_eq!(v[0], (PolicyKind::Mtm, Duration::from_secs(2)));
        assert_eq!(v[1].1, Duration::from_millis(500));
        let err = |s: &str| parse_intervals(s).unwrap_err().to_string();
        assert!(err("mtm").contains("POLICY=TIME"));
        assert!(err("lru=1s").contains("no interval"));
        assert!(err("tpp=1s").contains("memtis, colloid, mtm"));
        assert!(
            err("tpp-lru=1s").contains("no interval"),
            "variants are sim-only"
        );
        assert!(err("mtm=1s,mtm=2s").contains("twice"));
        assert!(err("mtm=0s").contains("at least 1ms"));
        assert_eq!(parse_intervals(""), Err(IntervalError::Empty));
    }
}
