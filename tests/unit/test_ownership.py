"""Owners enforced (docs/ARCHITECTURE.md, "Who owns what"): each registry table's writable object
reaches only its owner, the other owners get read-only views or one-column writers, and only the
runtime's wiring (and the offline pack/unpack's) holds the database itself.

Checked two ways: no module names a writable table class but its owner (imports, by AST), and no
controller class takes one in its constructor but its owner (annotations). mypy --strict then keeps
an owner handed a ``...Reader`` from calling a setter on it."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "forkd"

# Writable table objects (store/rows/) -> the one controller module, and class, that may hold them.
OWNERS = {
    "SnapshotRows": ("forkd.controller.snapshots", "SnapshotStore"),
    "SandboxRows": ("forkd.controller.sandboxes", "SandboxTable"),
    "PrefixRows": ("forkd.controller.sandboxes", "SandboxTable"),
    "AliasRows": ("forkd.controller.forks", "Forker"),
    "PausedRows": ("forkd.controller.suspend", "Suspender"),
    "WorkspaceRows": ("forkd.controller.workspaces", "Workspaces"),
    "PoolRows": ("forkd.controller.pools", "PoolKeeper"),
    # One column of the sandboxes row each (a reader plus that setter).
    "DiskChainRows": ("forkd.controller.branch", "Brancher"),
    "CheckpointPolicyRows": ("forkd.controller.checkpoints", "Checkpointer"),
    "IdlePauseRows": ("forkd.controller.idle", "IdlePauser"),
    "ExpiryRows": ("forkd.controller.lifetimes", "DeadlineKeeper"),
    "NetworkRows": ("forkd.controller.network", "Networks"),
}
# The wiring: the only modules that open the database and hand its tables out.
WIRING = {"forkd.controller.runtime", "forkd.controller.travel_offline"}


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _store_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names imported from forkd.store.registry / forkd.store.rows.*, modules imported whole)."""
    names: set[str] = set()
    whole: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "forkd.store.registry" or node.module.startswith("forkd.store.rows"):
                names.update(a.name for a in node.names)
            if node.module == "forkd.store":  # a module of the store imported by name
                whole.update(f"forkd.store.{a.name}" for a in node.names if a.name in ("registry", "rows"))
            if node.module == "forkd.store.rows":
                whole.update(f"forkd.store.rows.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            whole.update(a.name for a in node.names
                         if a.name == "forkd.store.registry" or a.name.startswith("forkd.store.rows"))
    return names, whole


def test_only_the_wiring_holds_the_database() -> None:
    for module, tree in _modules().items():
        if module.startswith("forkd.store"):
            continue
        names, whole = _store_names(tree)
        assert not whole, f"{module} imports {whole} whole: name what it uses, so ownership stays checkable"
        if "Registry" in names:
            assert module in WIRING, f"{module} holds the Registry; only {sorted(WIRING)} wire it"


def test_each_writable_table_is_named_only_by_its_owner() -> None:
    for module, tree in _modules().items():
        if module.startswith("forkd.store"):
            continue
        names, _ = _store_names(tree)
        for name in names & set(OWNERS):
            owner = OWNERS[name][0]
            assert module == owner, (f"{module} imports {name}, which only {owner} may hold; take a "
                                     "read-only view (a ...Reader) or go through the owner")


@pytest.mark.parametrize("module", sorted({m for m in _modules() if m.startswith("forkd.controller.")}))
def test_constructors_take_writable_tables_only_as_their_owner(module: str) -> None:
    mod = importlib.import_module(module)
    for cls_name, cls in vars(mod).items():
        if not inspect.isclass(cls) or cls.__module__ != module or "__init__" not in vars(cls):
            continue
        for param in inspect.signature(cls.__init__).parameters.values():
            annotation = param.annotation if isinstance(param.annotation, str) else repr(param.annotation)
            for name in set(re.findall(r"\w+", annotation)) & set(OWNERS):
                assert OWNERS[name] == (module, cls_name), (
                    f"{module}.{cls_name}({param.name}: {annotation}): {name} belongs to "
                    f"{'.'.join(OWNERS[name])}")


def test_every_owner_takes_its_table() -> None:
    """The map above is not stale: each owner's constructor does take the table it owns."""
    for name, (module, cls_name) in OWNERS.items():
        init = getattr(importlib.import_module(module), cls_name).__init__
        annotations = " ".join(str(p.annotation) for p in inspect.signature(init).parameters.values())
        assert name in re.findall(r"\w+", annotations), f"{module}.{cls_name} does not take {name}"

