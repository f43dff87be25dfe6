"""The warm imports: modules imported once at boot, before the template is snapshotted.

Every child forked from the snapshot inherits them already imported in PID 1,
so an ``eval`` that uses numpy pays no import cost. A module that fails to
import is reported (``ping``'s ``warm_errors``), never fatal: PID 1 must live.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

DEFAULT_WARM = "numpy"  # when the kernel command line has no forkd.warm=


def warm_list(option: str | None) -> list[str]:
    """The modules named by ``forkd.warm=a,b.c`` (the default when absent)."""
    return [m for m in (DEFAULT_WARM if option is None else option).split(",") if m]


def warm_up(modules: list[str], namespace: dict[str, Any]) -> dict[str, str]:
    """Import the warm modules into the eval namespace; return import errors."""
    errors: dict[str, str] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # a missing optional module must not kill PID 1
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        namespace[name.split(".")[0]] = sys.modules[name.split(".")[0]]
        if name == "numpy":
            namespace["np"] = module
    return errors
