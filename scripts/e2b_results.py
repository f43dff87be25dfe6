#!/usr/bin/env python3
"""E2B's own SDK tests, as scripts/e2b_conformance.sh ran them: counts from their JUnit files.

    python3 scripts/e2b_results.py SYNC.xml [ASYNC.xml]            # counts per directory, failures
    python3 scripts/e2b_results.py --write docs/E2B.md SYNC.xml ASYNC.xml

With ``--write``, the table between docs/E2B.md's ``e2b-conformance`` markers is
replaced by the one these files give (a directory of the suite per row, the sync
and async runs side by side), so the docs say what the last run measured.
Standard library only: it runs with any python3.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

BEGIN, END = "<!-- e2b-conformance:begin -->", "<!-- e2b-conformance:end -->"
ROWS = ("api_*", "sandbox_* (top level)", "sandbox_*/commands", "sandbox_*/files", "sandbox_*/pty",
        "template_* (with methods)")


def group(classname: str) -> str:
    """tests.sync.sandbox_sync.commands.test_run[.Class] -> the row it counts in."""
    parts = classname.split(".")[2:]  # after tests.sync / tests.async
    top = re.sub(r"_(a?sync)$", "_*", parts[0]) if parts else "?"
    if top == "sandbox_*":
        sub = parts[1] if len(parts) > 2 and not parts[1].startswith("test_") else ""
        return f"sandbox_*/{sub}" if sub else "sandbox_* (top level)"
    return "template_* (with methods)" if top == "template_*" else top


def outcomes(junit: Path) -> tuple[dict[str, collections.Counter[str]], list[str]]:
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    failed = []
    for case in ET.parse(junit).iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        outcome = "failed" if bad is not None else "skipped" if case.find("skipped") is not None else "passed"
        counts[group(case.get("classname", ""))][outcome] += 1
        if bad is not None:
            why = (bad.get("message") or "").strip().splitlines()
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            failed.append(f"{name}: {why[0][:160] if why else ''}")
    return counts, failed


def cell(c: collections.Counter[str] | None) -> str:
    if c is None:
        return "not run"
    ran = c["passed"] + c["failed"]
    return f"{c['passed']} / {ran}" + (f" ({c['skipped']} skipped)" if c["skipped"] else "")


def table(runs: list[dict[str, collections.Counter[str]]]) -> str:
    names = ["sync", "async"][:len(runs)]
    lines = ["| directory | " + " | ".join(names) + " |", "|---|" + "---|" * len(runs)]
    rows = [*ROWS, *sorted({r for run in runs for r in run} - set(ROWS))]
    for row in rows:
        if any(row in run for run in runs):
            lines.append(f"| `{row}` | " + " | ".join(cell(run.get(row)) for run in runs) + " |")
    totals = [sum(run.values(), collections.Counter()) for run in runs]
    shares = [(t["passed"], t["passed"] + t["failed"]) for t in totals]
    cells = [f"**{p} / {n}** ({100 * p / max(1, n):.1f}%)" for p, n in shares]
    lines.append("| **total** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", nargs="+", type=Path, help="the sync run's JUnit file, then the async one's")
    parser.add_argument("--write", type=Path,
                        help="replace the table between this file's e2b-conformance markers")
    args = parser.parse_args()
    if len(args.junit) > 2:
        parser.error("at most two JUnit files: sync, then async")
    runs, failures = [], []
    for junit in args.junit:
        counts, failed = outcomes(junit)
        runs.append(counts)
        failures.append(failed)
    text = table(runs)
    print(text)
    for name, failed in zip(("sync", "async"), failures, strict=False):
        print(f"\n{name}: {len(failed)} failed")
        for line in failed:
            print(f"  {line}")
    if args.write:
        doc = args.write.read_text()
        if BEGIN not in doc or END not in doc:
            print(f"{args.write} has no {BEGIN} ... {END} markers", file=sys.stderr)
            return 2
        head, _, rest = doc.partition(BEGIN)
        _, _, tail = rest.partition(END)
        args.write.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
        print(f"\nwrote the table into {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
