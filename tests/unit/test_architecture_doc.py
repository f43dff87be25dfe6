"""docs/ARCHITECTURE.md's module map names every module of src/forkd, and nothing else; the layers
it draws are the import-linter contract in pyproject.toml, and the code keeps that contract."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts: list[dict[str, object]] = config["contracts"]
    return contracts


def test_module_map_matches_the_tree() -> None:
    doc = DOC.read_text()
    documented = re.findall(r"^- `(forkd/[\w/]+\.py)`", doc, flags=re.MULTILINE)
    assert len(documented) == len(set(documented)), "a module is listed twice"
    tree = sorted(str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "forkd").rglob("*.py"))
    assert sorted(documented) == tree


def test_the_drawn_layers_are_the_contract() -> None:
    """The diagram at the top of the doc, line by line, is the layers contract (siblings: ``|``)."""
    drawing = DOC.read_text().split("```\n", 2)[1]
    drawn = []
    for line in drawing.splitlines():
        names = line.split("  ")[0].strip()  # the first column, up to the description
        drawn.append(" | ".join(re.sub(r"(/|\.py)$", "", n.strip()) for n in names.split("|")))
    layers = next(c for c in _contracts() if c["type"] == "layers")
    assert drawn[-1] == "sdk", "the SDK is drawn last, beside the layers (contract 'sdk-alone')"
    assert drawn[:-1] == layers["layers"]


def test_the_code_keeps_the_contracts() -> None:
    """``lint-imports`` (make lint) passes: no layer imports one above it, and no contract is broken."""
    ids = {c["id"] for c in _contracts()}
    assert {"layers", "runtime-facade", "cli-is-a-client", "sdk-alone"} <= ids
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_the_contracts_do_not_whitelist_the_layers() -> None:
    """The only ignored imports are the Runtime facade's door, its options types and its result
    types; the layers contract ignores none."""
    for contract in _contracts():
        ignored = contract.get("ignore_imports", [])
        if contract["id"] == "runtime-facade":
            assert ignored == ["forkd.api.** -> forkd.controller.runtime",
                               "forkd.api.** -> forkd.controller.options",
                               "forkd.api.** -> forkd.controller.results"]
        else:
            assert not ignored, contract["id"]
