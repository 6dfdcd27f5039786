#!/usr/bin/env python3
"""Every ctest entry carries exactly one tier label, `quick` or `slow`, and at
least one label saying what it checks (docs/build.md, "Test tiers"), so that
`ctest -L quick` (tools/test.sh --quick) and the check-<label> targets never
miss a test silently.

    check_test_labels.py --ctest ctest --build-dir build
"""
import argparse
import json
import subprocess
import sys

TIERS = {"quick", "slow"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctest", required=True)
    parser.add_argument("--build-dir", required=True)
    args = parser.parse_args()
    listing = subprocess.run([args.ctest, "--test-dir", args.build_dir, "--show-only=json-v1"],
                             capture_output=True, text=True, check=True)
    tests = json.loads(listing.stdout)["tests"]
    problems = []
    for test in tests:
        labels = set()
        for prop in test.get("properties", []):
            if prop["name"] == "LABELS":
                labels.update(prop["value"])
        tiers = labels & TIERS
        if len(tiers) != 1:
            problems.append(f"{test['name']}: tier labels {sorted(tiers) or 'none'} (one of quick, slow)")
        elif not labels - TIERS:
            problems.append(f"{test['name']}: no label saying what it checks besides its tier")
    if problems:
        sys.exit(f"{len(problems)} of {len(tests)} tests:\n  " + "\n  ".join(problems))
    quick = sum(1 for t in tests for p in t.get("properties", [])
                if p["name"] == "LABELS" and "quick" in p["value"])
    print(f"{len(tests)} tests, each with one tier: {quick} quick, {len(tests) - quick} slow")


if __name__ == "__main__":
    main()
