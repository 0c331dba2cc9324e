#!/usr/bin/env bash
# Runs every fuzz suite with many cases (default 10^6 per property) in an
# optimised build that keeps overflow checks and debug assertions, so an
# arithmetic overflow still panics as in CI's debug build. Usage:
#   tests/fuzz_big.sh [CASES]
# Results of the last big run: docs/results.md ("Fuzzing").
set -euo pipefail
cd "$(dirname "$0")/.."
export TIERVM_FUZZ_CASES="${1:-1000000}"
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/fuzz}"
echo "== fuzzing with TIERVM_FUZZ_CASES=$TIERVM_FUZZ_CASES per property"
start=$(date +%s)
cargo test --release -p tiervm --no-fail-fast \
  --test fuzz_parsers --test fuzz_guest_inputs --test fuzz_config -- --test-threads=1
cargo test --release -p tiervm-core --lib vstate::vcpu::fuzz -- --test-threads=1
echo "== done in $(( $(date +%s) - start )) s"
