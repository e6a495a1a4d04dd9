"""Per-file test times from a pytest JUnit XML report, for the order in which `make test` hands out its groups.

Usage: ``python bench/test_durations.py REPORT.xml --measured "..." > tests/durations.json``

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--measured", required=True, help="where and on what it was measured (one line)")
    args = parser.parse_args()
    json.dump({"measured": args.measured, "seconds": file_seconds(args.report)}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
