//! What the fuzz suites (`fuzz_*.rs`) share: how many cases to run, where
//! proptest persists failures, and the committed corpus of inputs that once
//! failed (replayed by every suite on every run).
//!
//! - `TIERVM_FUZZ_CASES=N` runs N cases per property instead of the CI
//!   default (a few thousand); docs/results.md records a 10^5-10^6 run.
//! - proptest writes the seed of a failing case to
//!   `tests/corpus/proptest-regressions/<suite>.txt` and replays it first on
//!   the next run; commit those files.
//! - `tests/corpus/<name>.txt` holds inputs one per line (escaped, see
//!   [`unescape`]); add the shrunk input of every failure found there, so it is
//!   replayed even if the property or the generator changes.
#![allow(dead_code)]

use std::path::PathBuf;

use proptest::test_runner::{Config, FileFailurePersistence};

/// Cases per property: `TIERVM_FUZZ_CASES` if set, else `default`.
pub fn cases(default: u32) -> u32 {
    match std::env::var("TIERVM_FUZZ_CASES") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("TIERVM_FUZZ_CASES={v:?} is not a whole number")),
        Err(_) => default,
    }
}

/// A proptest configuration with `cases(default)` cases whose failures are
/// persisted to `persist` (a path from [`regressions!`]).
pub fn config(default: u32, persist: &'static str) -> Config {
    Config {
        cases: cases(default),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(persist))),
        // Hostile inputs are cheap; rejecting is not how these suites work.
        max_global_rejects: 1 << 20,
        ..Config::default()
    }
}

/// The regression file of a suite: `regressions!("fuzz_parsers")`.
#[macro_export]
macro_rules! regressions {
    ($suite:literal) => {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/corpus/proptest-regressions/",
            $suite,
            ".txt"
        )
    };
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus")
}

/// The inputs of `tests/corpus/<name>.txt`: one per line, `#` lines and
/// blank lines skipped, escapes decoded. Panics on a missing file or a bad
/// escape (a corpus that silently replays nothing would be a test that
/// cannot fail).
pub fn corpus(name: &str) -> Vec<Vec<u8>> {
    let path = corpus_dir().join(format!("{name}.txt"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("corpus {} unreadable: {e}", path.display()));
    let inputs: Vec<Vec<u8>> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| unescape(l).unwrap_or_else(|e| panic!("{}: {e} in {l:?}", path.display())))
        .collect();
    assert!(!inputs.is_empty(), "corpus {} is empty", path.display());
    inputs
}

/// The corpus as strings (lossy for invalid UTF-8, which string parsers
/// never see: the CLI hands them `&str`).
pub fn corpus_strings(name: &str) -> Vec<String> {
    corpus(name)
        .into_iter()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect()
}

/// Decodes one corpus line: `\\`, `\n`, `\t`, `\r`, `\0`, `\s` (a space, for
/// leading/trailing spaces), `\xNN` (one byte) and `\u{...}` (a character);
/// anything else is literal.
pub fn unescape(line: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match chars.next() {
            Some('\\') => out.push(b'\\'),
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('r') => out.push(b'\r'),
            Some('0') => out.push(0),
            Some('s') => out.push(b' '),
            Some('x') => {
                let hex: String = chars.by_ref().take(2).collect();
                out.push(u8::from_str_radix(&hex, 16).map_err(|_| format!("bad \\x{hex}"))?);
            }
            Some('u') => {
                if chars.next() != Some('{') {
                    return Err("\\u needs {".into());
                }
                let hex: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let ch = u32::from_str_radix(&hex, 16)
                    .ok()
                    .and_then(char::from_u32)
                    .ok_or_else(|| format!("bad \\u{{{hex}}}"))?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
            }
            other => return Err(format!("unknown escape \\{other:?}")),
        }
    }
    Ok(out)
}

/// Parses a corpus line of hex bytes (whitespace ignored).
pub fn hex_bytes(line: &[u8]) -> Vec<u8> {
    let digits: Vec<u8> = line
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    digits
        .chunks(2)
        .map(|p| {
            u8::from_str_radix(std::str::from_utf8(p).expect("ascii"), 16)
                .unwrap_or_else(|_| panic!("bad hex {:?}", String::from_utf8_lossy(p)))
        })
        .collect()
}

#[test]
fn unescape_decodes_every_escape() {
    assert_eq!(
        unescape(r"a\\b\n\t\r\0\s\x7f\u{e9}").unwrap(),
        b"a\\b\n\t\r\0 \x7f\xc3\xa9".to_vec()
    );
    assert!(unescape(r"\q").is_err());
    assert!(unescape(r"\xzz").is_err());
    assert_eq!(hex_bytes(b"0a ff\n10"), vec![0x0a, 0xff, 0x10]);
}
