"""docs/ARCHITECTURE.md's module map names every module of src/forkd, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_module_map_matches_the_tree() -> None:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    documented = re.findall(r"^- `(forkd/[\w/]+\.py)`", doc, flags=re.MULTILINE)
    assert len(documented) == len(set(documented)), "a module is listed twice"
    tree = sorted(str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "forkd").rglob("*.py"))
    assert sorted(documented) == tree
