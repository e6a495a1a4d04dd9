"""Per-file test times from a pytest JUnit XML report, for the order in which `make test` hands out its groups.

Usage: ``python bench/test_durations.py REPORT.xml --measured "..." > tests/durations.json``, or
``python bench/test_durations.py REPORT.xml --cpu 40`` for the 40 tests that used the most CPU (tests/conftest.py
records each test's CPU-seconds in the report)

Writes JSON ``{"measured": "<where>", "seconds": {"test_x.py": seconds, ...}}``: per test file, the sum of its tests'
times (setup, call and teardown, as pytest's JUnit report counts them; a session fixture's setup is charged to the
first test that used it). tests/conftest.py reads it to start the longest groups first; a file missing from it is
guessed from its tests' markers. Re-measure after a clean-clone run of the suite with
``PYTEST_ADDOPTS=--junitxml=REPORT.xml``.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ElementTree


def file_seconds(report: str) -> dict[str, float]:
    """Seconds per test file name (``test_x.py``) in the JUnit XML file ``report``, rounded to 0.1 s."""
    seconds: dict[str, float] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        name = next((p for p in parts if p.startswith("test_")), None)
        if name is None:
            continue
        seconds[f"{name}.py"] = seconds.get(f"{name}.py", 0.0) + float(case.get("time", 0))
    return {name: round(value, 1) for name, value in sorted(seconds.items())}


def cpu_seconds(report: str) -> list[tuple[float, float, float, str]]:
    """Per test in the JUnit XML file ``report``: (``cpu_s``, ``machine_cpu_s``, wall seconds, node id), the CPU
    properties tests/conftest.py records (a report written without them gives none), largest ``cpu_s`` first."""
    rows = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        found = {p.get("name"): float(p.get("value")) for p in case.iter("property")}
        if "cpu_s" in found:
            name = f"{case.get('classname')}::{case.get('name')}"
            rows.append((found["cpu_s"], found.get("machine_cpu_s", 0.0), float(case.get("time", 0)), name))
    return sorted(rows, reverse=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--measured", help="where and on what it was measured (one line); needed without --cpu")
    parser.add_argument("--cpu", type=int, metavar="N", help="print the N tests that used the most CPU instead")
    args = parser.parse_args()
    if args.cpu:
        rows = cpu_seconds(args.report)
        total = sum(row[0] for row in rows)
        print(f"{'cpu_s':>8} {'machine':>8} {'wall_s':>8}  test   (all {len(rows)} tests: cpu_s {total:.0f})")
        for own, machine, wall, name in rows[: args.cpu]:
            print(f"{own:8.1f} {machine:8.1f} {wall:8.1f}  {name}")
        return 0
    if not args.measured:
        parser.error("--measured is needed to write durations.json")
    json.dump({"measured": args.measured, "seconds": file_seconds(args.report)}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
