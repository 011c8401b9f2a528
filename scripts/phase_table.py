"""Print where a run of scripts/test.sh spent its time, from its phase log (JSON lines).

    python3 scripts/phase_table.py LOG START

Each line of LOG is {"kind", "name", "start", "end"} (seconds since the epoch): the script's own
phases (apt packages, pip, the images, the checks, pytest, the quiet tests), the clusters' builds
(tests/phase_log.py) and one line per test with its lane, node id and, where tests/lanecpu.py
counted it, its CPU seconds. START is the run's start. Per lane the table gives its wall time
(first test's start to last test's end) and its tests' summed time, so a lane that waited shows
as the difference, and their CPU; then the tests that took the most CPU. Standard library only:
it runs even when the venv could not be made."""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ORDER = ("setup", "image", "check", "cluster", "lane", "pytest", "total")


def read(path: Path) -> list[dict[str, Any]]:
    phases = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
            phases.append(
                {"kind": str(entry["kind"]), "name": str(entry["name"]),
                 "start": float(entry["start"]), "end": float(entry["end"]),
                 "test": str(entry.get("test", "")), "cpu": float(entry.get("cpu", "nan"))}
            )  # fmt: skip
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a killed process
    return phases


def lanes(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_lane: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for test in tests:
        by_lane[test["name"]].append(test)
    rows = []
    for lane, entries in sorted(by_lane.items()):
        busy = sum(e["end"] - e["start"] for e in entries)
        label = f"lane {lane}" if lane != "-" else "tests of no lane (any free worker)"
        name = f"{label}: {len(entries)} tests, {busy:.0f} s in tests"
        counted = [e["cpu"] for e in entries if not math.isnan(e["cpu"])]
        if counted:
            name += f", {sum(counted):.0f} s of CPU"
        start, end = min(e["start"] for e in entries), max(e["end"] for e in entries)
        rows.append({"kind": "lane", "name": name, "start": start, "end": end})
    return rows


def table(phases: list[dict[str, Any]], start: float) -> str:
    tests = [p for p in phases if p["kind"] == "test"]
    rows = [p for p in phases if p["kind"] != "test"] + lanes(tests)
    rows.sort(key=lambda p: (ORDER.index(p["kind"]) if p["kind"] in ORDER else 0, p["start"]))
    width = max([len(r["name"]) for r in rows] + [5])
    lines = [f"{'phase':<{width}}  {'from':>6}  {'to':>6}  {'wall':>6}"]
    for row in rows:
        begin, end = row["start"] - start, row["end"] - start
        lines.append(f"{row['name']:<{width}}  {begin:6.0f}  {end:6.0f}  {end - begin:6.0f}")
    return "\n".join(lines)


def costliest(tests: list[dict[str, Any]], count: int = 15) -> str:
    """The tests that took the most CPU (where tests/lanecpu.py counted it), or ""."""
    counted = sorted((t for t in tests if not math.isnan(t["cpu"])), key=lambda t: -t["cpu"])
    if not counted:
        return ""
    lines = [f"--- the {min(count, len(counted))} tests that took the most CPU, of {len(counted)}"]
    lines.append(f"{'CPU (s)':>7}  {'wall':>5}  {'lane':<8}  test")
    for test in counted[:count]:
        wall = test["end"] - test["start"]
        lines.append(f"{test['cpu']:7.0f}  {wall:5.0f}  {test['name']:<8}  {test['test']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    path = Path(argv[1])
    if not path.is_file():
        print(f"phase_table: no phase log at {path}", file=sys.stderr)
        return 1
    print("--- where the time went (seconds from the start of scripts/test.sh)")
    phases = read(path)
    print(table(phases, float(argv[2])))
    most = costliest([p for p in phases if p["kind"] == "test"])
    if most:
        print(most)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
