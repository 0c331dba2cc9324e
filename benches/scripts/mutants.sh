#!/usr/bin/env bash
# Mutation testing (cargo-mutants) of the files listed in .cargo/mutants.toml
# (issue 34): one file at a time, optionally one shard of it, each run
# bounded in time, on 2 cores and at low priority (the machine is shared).
#
#   benches/scripts/mutants.sh [--budget SECS] [--shard K/N] [--re REGEX]
#                              [--iterate] [--list] [FILE...]
#   benches/scripts/mutants.sh --ci
#
#   FILE      a source file of the list (default: every file of it, i.e. the
#             config's examine_globs less its exclude_globs)
#   --budget  wall-clock bound of each file's run, seconds (default 1800);
#             a run cut short says so and keeps what it finished
#   --shard   K/N: only the K-th of N slices of each file's mutants (the
#             same N for every shard; CI runs one small fixed shard)
#   --re      only the mutants whose name (as --list shows it) matches
#   --iterate skip the mutants caught by the previous run of the same file
#             (its target/mutants/<file>/ output), e.g. after adding tests
#   --list    list the mutants that would be tested, run nothing
#   --ci      the fixed CI shard (see ci_shard below): a few minutes after
#             a warm build; exits 1 when a mutant of it is missed or times
#             out, or the run does not complete
#
# MUTANTS_IN_PLACE=1 mutates this checkout's files in place (cargo-mutants'
# --in-place) instead of a copy of the tree: meant for a checkout of its
# own (`git worktree add --detach DIR`). Each copy is a new path, so its
# baseline rebuilds the workspace's crates (about 3 min for `tiering` on
# this host); in place, the baseline build is incremental. A mutated file
# must be unchanged in git at the start, and it is restored from git after
# the run (a run cut by its budget can leave its last mutant in the file).
#
# Each mutant is built and tested by the tests that guard its file (see
# tests_for below), not the whole workspace: the memory layer's unit tests
# for tiering/src/mem, the policies' for tiering/src/policy, the seccomp and
# dirty-log tests of tiervm-core, the service's admission tests (and, for
# host.rs, its lifecycle and requests on stand-in workers).
#
# Test tool: cargo-nextest when it is installed (MUTANTS_TEST_TOOL=cargo
# forces `cargo test`): it stops a mutant's tests at the first failure, so a
# caught mutant of the memory layer costs its build and about a second
# instead of the whole 10-11 s of tests; a missed one costs the same. The
# first failure also ends the tests still running (`--max-fail=1:immediate`):
# a mutant that hangs some tests (a lock or a wait never released) is caught
# by another test's failure instead of waiting out the timeout. The filters
# are the same (nextest takes libtest's `-- NAME...`). The CI shard
# keeps `cargo test` (nothing more to install there).
#
# Output: target/mutants/<file>/ (cargo-mutants' outcomes.json and
# caught.txt, missed.txt, timeout.txt, unviable.txt, with a diff and a log per
# mutant; for a run cut short, not_reached.txt; caught_by.txt, the tests that
# failed for each caught mutant, and catches_by_test.txt), and per file one line on
# stdout for docs/results.md:
#   file | mutants | caught | missed | timed out | unviable | complete
# Needs: cargo install --locked cargo-mutants.
set -euo pipefail
cd "$(dirname "$0")/../.."

budget=1800
shard=""
re=""
iterate=0
list=0
ci=0
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget="$2"; shift 2 ;;
    --shard) shard="$2"; shift 2 ;;
    --re) re="$2"; shift 2 ;;
    --iterate) iterate=1; shift ;;
    --list) list=1; shift ;;
    --ci) ci=1; shift ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 1 ;;
    *) files+=("$1"); shift ;;
  esac
done

if ! command -v cargo-mutants >/dev/null 2>&1; then
  echo "cargo-mutants is not installed: cargo install --locked cargo-mutants" >&2
  exit 1
fi

# The config's files: examine_globs less exclude_globs.
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(python3 - <<'EOF'
import glob, tomllib
cfg = tomllib.load(open(".cargo/mutants.toml", "rb"))
out = set()
for g in cfg.get("examine_globs", []):
    out.update(glob.glob(g, recursive=True))
for g in cfg.get("exclude_globs", []):
    out.difference_update(glob.glob(g, recursive=True))
print("\n".join(sorted(out)))
EOF
)
fi

# The tests that guard a file: arguments to `cargo test` (after the
# package cargo-mutants picks), with test-name filters after `--`.
tests_for() {
  case "$1" in
    tiering/src/mem/*) echo "--lib -- mem::" ;;
    tiering/src/policy/*) echo "--lib -- policy::" ;;
    vmm/core/src/kvm_dirty_log.rs) echo "--lib --test kvm_clear_dirty_log -- kvm_dirty_log clearing_pages segmented manual_protect" ;;
    vmm/core/src/seccomp/*) echo "--lib --test seccomp_denylist -- seccomp no_role the_vcpu a_role" ;;
    # host.rs: also its lifecycle and requests on stand-in workers (in
    # process, about 10 s); tests/serve.rs (real VMs, minutes) is not run.
    vmm/service/src/host.rs) echo "--lib --test create_admission --test host_lifecycle --test host_requests" ;;
    vmm/service/src/*) echo "--lib --test create_admission" ;;
    *) echo "--lib" ;;
  esac
}

# 2 cores: one mutant at a time, two compiler threads, two test threads
# under `cargo test` (four under nextest, below), low priority. A target directory of its own, reused across runs (the
# dependencies are built once).
export CARGO_BUILD_JOBS=2 RUST_TEST_THREADS=2
# MUTANTS_TARGET_DIR: another target directory (CI passes its own, warm
# one; --ci then touches the mutated files at the end, so that no later
# build in the checkout takes the last mutant's artifacts for up to date:
# cargo's fingerprints name sources relative to the package, and
# cargo-mutants builds a copy of the tree elsewhere).
export CARGO_TARGET_DIR="${MUTANTS_TARGET_DIR:-$PWD/target/mutants-target}"
# On a KVM host a test that would skip for a missing feature fails instead
# (a skipped test would count every mutant as missed).
if [ -e /dev/kvm ]; then export TIERVM_REQUIRE_KVM=1; fi

# The config's other settings as options: cargo-mutants adds its
# examine_globs to --file (v27), so the config is not read (--no-config)
# and what else it says is passed here.
mapfile -t config_args < <(python3 - <<'EOF2'
import tomllib
cfg = tomllib.load(open(".cargo/mutants.toml", "rb"))
for r in cfg.get("exclude_re", []):
    print(f"--exclude-re={r}")
if "timeout_multiplier" in cfg:
    print(f"--timeout-multiplier={cfg['timeout_multiplier']}")
if "minimum_test_timeout" in cfg:
    print(f"--minimum-test-timeout={cfg['minimum_test_timeout']}")
EOF2
)

# The test tool of the per-file runs (see the header).
tool_args=()
if [ "${MUTANTS_TEST_TOOL:-}" != cargo ] && cargo nextest --version >/dev/null 2>&1; then
  tool_args=(--test-tool=nextest)
  # Four test threads on two cores: most of the memory layer's test time is
  # waiting (chaos windows, bounded waits on real threads), and its tests
  # end in 10.6-10.8 s so against 20.8 s with two (measured side by side
  # while a cargo-mutants run built on the same cores).
  export NEXTEST_TEST_THREADS=4
fi

count() { if [ -f "$1" ]; then grep -c . "$1" || true; else echo 0; fi; }

# The CI shard (issue 34): a small fixed set of mutants whose bugs let a
# guest out or lose its writes, all caught today, in one cargo-mutants run
# (one baseline): the seccomp allowlists (12 mutants, 7 of them unviable)
# and the KVM dirty log's re-arm of pages (`clear`) and its segment layout
# (`segmented`): 46 mutants, about 3-4 minutes on 2 busy cores after a warm
# build (docs/results.md section 12). Any missed or timed-out mutant, or a
# run cut short, fails it.
if [ "$ci" = 1 ]; then
  out=target/mutants/ci
  rm -rf "$out"
  mkdir -p "$out"
  rc=0
  start=$(date +%s)
  timeout --kill-after=60 "$budget" nice -n 15 cargo mutants --no-config "${config_args[@]}" \
    --jobs 1 --output "$out" \
    --file vmm/core/src/seccomp/allowlist.rs --file vmm/core/src/kvm_dirty_log.rs \
    --re 'seccomp/allowlist\.rs|kvm_dirty_log\.rs:.*(<impl DirtyLog for KvmDirtyLog>::clear( |$)|KvmDirtyLog::segmented)' \
    -- --lib --test seccomp_denylist --test kvm_clear_dirty_log \
    -- seccomp no_role the_vcpu a_role kvm_dirty_log clearing_pages segmented manual_protect \
    >"$out/run.log" 2>&1 || rc=$?
  touch vmm/core/src/seccomp/allowlist.rs vmm/core/src/kvm_dirty_log.rs
  d="$out/mutants.out"
  caught=$(count "$d/caught.txt"); missed=$(count "$d/missed.txt")
  timeout=$(count "$d/timeout.txt"); unviable=$(count "$d/unviable.txt")
  echo "CI shard: $((caught + missed + timeout + unviable)) mutants: $caught caught, $missed missed, $timeout timed out, $unviable unviable; $(( $(date +%s) - start )) s (cargo-mutants exit $rc)"
  for k in missed timeout; do
    if [ -s "$d/$k.txt" ]; then sed "s/^/    $k: /" "$d/$k.txt"; fi
  done
  if [ "$rc" != 0 ] || [ "$missed" != 0 ] || [ "$timeout" != 0 ] || [ "$caught" = 0 ]; then
    echo "CI shard failed: a mutant survived the tests, timed out, or the run failed (see $out/run.log)" >&2
    exit 1
  fi
  exit 0
fi

# The per-file runs build without debug info: each mutant's build is its
# main cost, and a build of the memory layer's tests takes about a quarter
# less time so (5.0-6.1 s against 7.7-8.5 s for one changed line, measured
# side by side). Not for --ci above: it shares CI's warm target directory,
# which a profile change would rebuild.
export CARGO_PROFILE_DEV_DEBUG=0

status=0
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "no such file: $f" >&2; exit 1; }
  in_place=()
  if [ "${MUTANTS_IN_PLACE:-}" = 1 ] && [ "$list" = 0 ]; then
    if ! git diff --quiet HEAD -- "$f"; then
      echo "MUTANTS_IN_PLACE=1: $f has changes git does not have; an interrupted run is restored from git, so commit or stash them first" >&2
      exit 1
    fi
    in_place=(--in-place)  # one mutant at a time already: no --jobs
  fi
  out="target/mutants/$(echo "$f" | tr '/' '_')"
  mkdir -p "$out"
  args=(--no-config "${config_args[@]}" "${tool_args[@]}" --file "$f" --output "$out" ${shard:+--shard "$shard"} ${re:+--re "$re"})
  if [ ${#in_place[@]} -gt 0 ]; then args+=("${in_place[@]}"); else args+=(--jobs 1); fi
  list_args=("${args[@]}")
  if [ "$iterate" = 1 ]; then args+=(--iterate); fi
  if [ "$list" = 1 ]; then
    nice -n 15 cargo mutants "${args[@]}" --list
    continue
  fi
  read -r -a test_args <<<"$(tests_for "$f")"
  if [ ${#tool_args[@]} -gt 0 ]; then test_args=(--max-fail=1:immediate "${test_args[@]}"); fi
  rc=0
  timeout --kill-after=60 "$budget" nice -n 15 \
    cargo mutants "${args[@]}" -- "${test_args[@]}" >"$out/run.log" 2>&1 || rc=$?
  if [ ${#in_place[@]} -gt 0 ] && ! git diff --quiet HEAD -- "$f"; then
    git checkout HEAD -- "$f"
    echo "$f: restored from git (the run left a mutant in it)" >&2
  fi
  d="$out/mutants.out"
  complete=yes
  case "$rc" in
    0|2|3) ;;  # all caught / some missed / some timed out: results
    124|137) complete="no (budget of ${budget} s reached)" ;;
    4) complete="no (the unmutated tests fail: see $out/run.log)"; status=1 ;;
    *) complete="no (cargo-mutants exit $rc: see $out/run.log)"; status=1 ;;
  esac
  caught=$(count "$d/caught.txt")
  missed=$(count "$d/missed.txt")
  timeout=$(count "$d/timeout.txt")
  unviable=$(count "$d/unviable.txt")
  total=$((caught + missed + timeout + unviable))
  echo "$f | $total | $caught | $missed | $timeout | $unviable | $complete"
  if [ "$missed" != 0 ]; then
    sed 's/^/    missed: /' "$d/missed.txt"
  fi
  # The test behind each catch (a flaky test makes false catches: see
  # mutants_caught_by.py), for a reader of the run.
  if [ -f "$d/outcomes.json" ]; then
    python3 benches/scripts/mutants_caught_by.py "$d" >"$d/caught_by.txt" 2>"$d/catches_by_test.txt" || true
  fi
  # A run cut short: which mutants it did not reach (the list less every
  # outcome, and less those an --iterate run skipped as caught before),
  # for a later --iterate or --re run.
  if [ "$complete" != yes ] && [ -d "$d" ]; then
    nice -n 15 cargo mutants "${list_args[@]}" --list 2>/dev/null | sort >"$d/listed.tmp" || true
    for k in caught missed timeout unviable previously_caught; do
      if [ -f "$d/$k.txt" ]; then cat "$d/$k.txt"; fi
    done | sort -u >"$d/done.tmp"
    comm -23 "$d/listed.tmp" "$d/done.tmp" >"$d/not_reached.txt" || true
    rm -f "$d/listed.tmp" "$d/done.tmp"
    echo "    not reached: $(count "$d/not_reached.txt") (listed in $d/not_reached.txt)"
  fi
done
exit "$status"
