#!/usr/bin/env python3
"""Write the sync SDK modules from their async sources (an unasync-style generator).

The async modules are the source of truth; their sync twins are generated:

    src/forkd/sdk/async_client.py   ->  src/forkd/sdk/_generated/client.py
    src/forkd/sdk/async_sandbox.py  ->  src/forkd/sdk/_generated/sandbox.py
    src/forkd/sdk/async_snapshot.py ->  src/forkd/sdk/_generated/snapshot.py
    src/forkd/sdk/async_guest.py    ->  src/forkd/sdk/_generated/guest.py
    src/forkd/sdk/async_explore.py  ->  src/forkd/sdk/_generated/explore.py
    src/forkd/sdk/async_routes/*.py ->  src/forkd/sdk/_generated/routes/*.py  (the client's parts)

``forkd.sdk`` exports the sync classes by their public names (``Controller``,
``Sandbox``, ...). ``src/forkd/sdk/_generated/`` holds generated modules only,
so no one edits one by mistake: this script also writes its ``__init__.py``, and
``--check`` fails on a file there that differs from what its generator writes or
that no generator writes (``models.py`` is ``scripts/gen_sdk_models.py``'s).

Each source is rewritten by the explicit table of substitutions in ``RULES``,
applied in order to the whole text, and the result gets a ``GENERATED`` header.
A source may use only names the table knows: any ``async``, ``await``,
``asyncio`` or ``Async*`` token left in the output is an error, so a new async
construct has to be added to the table rather than slip through unconverted.
Where the sync API must differ in shape, the source carries a marker from
``forkd.sdk._twins`` that the table rewrites (``@sync_property``).

Usage::

    python scripts/unasync_sdk.py           # rewrite the sync modules
    python scripts/unasync_sdk.py --check   # exit 1 and show a diff if they are stale
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDK = Path("src/forkd/sdk")
GENERATED = SDK / "_generated"

# (async source, generated sync module), relative to the repository root.
TWINS: tuple[tuple[Path, Path], ...] = (
    (SDK / "async_client.py", GENERATED / "client.py"),
    (SDK / "async_sandbox.py", GENERATED / "sandbox.py"),
    (SDK / "async_snapshot.py", GENERATED / "snapshot.py"),
    (SDK / "async_guest.py", GENERATED / "guest.py"),
    (SDK / "async_explore.py", GENERATED / "explore.py"),
    *(
        (SDK / "async_routes" / name, GENERATED / "routes" / name)
        for name in ("__init__.py", "transport.py", "snapshots.py", "sandboxes.py", "processes.py",
                     "files.py", "forks.py", "pools.py", "secrets.py")
    ),
)

# (pattern, replacement), applied in this order with re.MULTILINE. Identifiers
# are matched as whole words.
RULES: tuple[tuple[str, str], ...] = (
    # Imports that only the async flavour needs.
    (r"^import asyncio\n", ""),
    (r"^from forkd\.sdk\._twins import sync_property\n", ""),
    # Markers for the places where the two APIs differ in shape.
    (r"^(\s*)@sync_property$", r"\1@property"),
    # Syntax.
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b_twins\.asettle\b", "_twins.settle"),
    (r"\bcontextlib\.aclosing\b", "contextlib.closing"),
    # httpx.
    (r"\bhttpx\.AsyncClient\b", "httpx.Client"),
    (r"\bhttpx\.AsyncBaseTransport\b", "httpx.BaseTransport"),
    (r"\baiter_bytes\b", "iter_bytes"),
    (r"\baiter_lines\b", "iter_lines"),
    (r"\baread\b", "read"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncGenerator\[([^\]]*), None\]", r"Generator[\1, None, None]"),
    (r"\baclose\b", "close"),
    # The SDK's own names and modules.
    (r"\bforkd\.sdk\.async_client\b", "forkd.sdk._generated.client"),
    (r"\bforkd\.sdk\.async_sandbox\b", "forkd.sdk._generated.sandbox"),
    (r"\bforkd\.sdk\.async_snapshot\b", "forkd.sdk._generated.snapshot"),
    (r"\bforkd\.sdk\.async_guest\b", "forkd.sdk._generated.guest"),
    (r"\bforkd\.sdk\.async_explore\b", "forkd.sdk._generated.explore"),
    (r"\bforkd\.sdk\.async_routes\b", "forkd.sdk._generated.routes"),
    (r"\bAsyncTransport\b", "Transport"),
    (r"\bAsync(\w+Routes)\b", r"\1"),
    (r"\bAsyncController\b", "Controller"),
    (r"\bAsyncSandbox\b", "Sandbox"),
    (r"\bAsyncSnapshot\b", "Snapshot"),
    (r"\bAsyncCommands\b", "Commands"),
    (r"\bAsyncCommandHandle\b", "CommandHandle"),
    (r"\bAsyncFiles\b", "Files"),
    (r"\bAsyncTerminal\b", "Terminal"),
    (r"\bdefault_async_controller\b", "default_controller"),
)

# Tokens that must not survive into a sync module.
LEFTOVER = re.compile(r"\b(async|await|asyncio|aclose|__aenter__|__aexit__|Async\w*|\w*_async\w*)\b")

HEADER = (
    "# GENERATED from {source} by scripts/unasync_sdk.py — do not edit.\n"
    "# Edit the async source, then run: python scripts/unasync_sdk.py\n"
)


# The generated folder's package marker, written by this script like the rest of the folder.
PACKAGE_INIT = (
    "# GENERATED by scripts/unasync_sdk.py — do not edit.\n"
    '"""Generated modules only: the sync SDK (from its async source, scripts/unasync_sdk.py) and\n'
    "the REST API's types (from the OpenAPI document, scripts/gen_sdk_models.py). Edit the sources\n"
    'and regenerate; `make lint` fails while a file here differs from what its generator writes."""\n'
)

# Files of the generated folder that another generator writes (and checks).
OTHER_WRITERS: dict[Path, str] = {GENERATED / "models.py": "scripts/gen_sdk_models.py"}


class UnasyncError(Exception):
    """The rule table does not cover something in an async source."""


def unasync(text: str) -> str:
    """The sync twin of one async module's text, without the header."""
    for pattern, replacement in RULES:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return text


def generate(text: str, source: Path) -> str:
    """The complete sync module for the async module ``source`` whose text is ``text``."""
    body = unasync(text)
    leftovers = [
        f"{source}:{number}: {line.strip()}"
        for number, line in enumerate(body.splitlines(), 1)
        if LEFTOVER.search(line)
    ]
    if leftovers:
        raise UnasyncError(
            "async tokens left after the substitutions; extend RULES in scripts/unasync_sdk.py:\n  "
            + "\n  ".join(leftovers)
        )
    return HEADER.format(source=source.as_posix()) + body


def wanted_files(root: Path) -> dict[Path, tuple[str, str]]:
    """Every file this script writes: target -> (its text, what it is generated from)."""
    out = {GENERATED / "__init__.py": (PACKAGE_INIT, "this script")}
    for source, target in TWINS:
        out[target] = (generate((root / source).read_text(encoding="utf-8"), source), str(source))
    return out


def strays(root: Path, ours: Iterable[Path]) -> list[Path]:
    """Files in the generated folder that no generator writes (a hand-made module, a leftover)."""
    known = {*ours, *OTHER_WRITERS}
    found = (p.relative_to(root) for p in (root / GENERATED).rglob("*") if p.is_file())
    return sorted(p for p in found if p not in known and "__pycache__" not in p.parts)


def main(argv: Sequence[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a sync module is stale"
    )
    args = parser.parse_args(argv)
    try:
        wanted = wanted_files(root)
    except UnasyncError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stale = []
    for target, (text, source) in wanted.items():
        path = root / target
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current == text:
            continue
        stale.append(target)
        if args.check:
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    fromfile=f"{target} (on disk)",
                    tofile=f"{target} (generated from {source})",
                )
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {target}")
    unknown = strays(root, wanted)
    if unknown:
        # Never deleted here: a stray may be someone's work, put in the wrong folder.
        print(
            f"\n{GENERATED}/ holds only generated files; no generator writes "
            + ", ".join(str(p) for p in unknown)
            + ": move it out (or add it to a generator)",
            file=sys.stderr,
        )
    if args.check and stale:
        names = ", ".join(str(t) for t in stale)
        print(
            f"\n{names}: out of date with the async source; run python scripts/unasync_sdk.py",
            file=sys.stderr,
        )
        return 1
    return 1 if unknown else 0


if __name__ == "__main__":
    sys.exit(main())
