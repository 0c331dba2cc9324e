#!/usr/bin/env python3
"""Which tests failed for each caught mutant of a cargo-mutants run.

    benches/scripts/mutants_caught_by.py DIR   (DIR: a run's mutants.out)

One line per caught mutant, `file:line:col: what -> test, test...` (the tests
nextest or libtest reported as failed, in the order seen), then, on stderr,
the tests by the number of mutants they caught. A catch is only as good as
the test behind it: a test that can fail on unmutated code (a timing bound
on a loaded host) counts a mutant as caught that nothing catches. The
twenty-ninth session found one such false catch this way (docs/results.md,
section 12): read this list before counting a file's run as confirmed.
"""
import collections
import json
import os
import re
import sys

# nextest: "        FAIL [   0.185s] ( 28/205) tiering mem::x::y" (not
# SIGTERM: the tests still running that nextest ends after the first
# failure); libtest: "test mem::x::y ... FAILED".
NEXTEST = re.compile(r"^\s+(?:FAIL|TIMEOUT|SIGSEGV|SIGABRT|SIGBUS)\s+\[.*?\]\s+(?:\(\s*\S+\)\s+)?\S+ (\S+)")
LIBTEST = re.compile(r"^test (\S+) \.\.\. FAILED")


def failed_tests(log):
    out = []
    try:
        with open(log, errors="replace") as f:
            for line in f:
                m = NEXTEST.search(line) or LIBTEST.search(line)
                if m and m.group(1) not in out:
                    out.append(m.group(1))
    except OSError:
        pass
    return out


def main():
    if len(sys.argv) != 2 or not os.path.isfile(os.path.join(sys.argv[1], "outcomes.json")):
        sys.exit("usage: mutants_caught_by.py DIR (a cargo-mutants output directory, with outcomes.json)")
    d = sys.argv[1]
    with open(os.path.join(d, "outcomes.json")) as f:
        outcomes = json.load(f)["outcomes"]
    by_test = collections.Counter()
    for oc in outcomes:
        if oc.get("summary") != "CaughtMutant" or not isinstance(oc.get("scenario"), dict):
            continue
        name = oc["scenario"]["Mutant"]["name"]
        tests = failed_tests(os.path.join(d, oc["log_path"]))
        by_test.update(tests)
        print(f'{name} -> {", ".join(tests) or "(no failed test in the log: a build or timeout outcome)"}')
    for t, n in by_test.most_common():
        print(f"{n:5} {t}", file=sys.stderr)


if __name__ == "__main__":
    main()
