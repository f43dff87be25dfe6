"""What the kernel runner says to IRkernel, R's Jupyter kernel, beside a cell: silent cells of R.

IRkernel is not one of forkd's wrapper kernels, so it takes no cell metadata:
like IPython, it gets a cell's environment variables, and a restored copy's
environment and seed, as silent cells (``kernel_client``) in its own language.
``env_in`` sets a cell's variables and keeps what they were in ``.forkd_saved``
(a dot name: ``ls()`` does not show it), ``env_out`` puts them back (unsetting
those that were unset), and ``restored`` takes a restored child's environment
and seeds R's RNG anew (the siblings share the template's state).

Strings reach R as JSON string literals without ``ensure_ascii``: the escapes
JSON writes then (``\\"``, ``\\\\``, ``\\n``, ``\\r``, ``\\t``, ``\\b``, ``\\f``,
``\\u00XX``) are R's too. Everything is wrapped in ``invisible(local(...))``, so
nothing prints and no name is left but ``.forkd_saved``.
"""

from __future__ import annotations

import json


def _string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _vector(values: list[str]) -> str:
    return f"c({', '.join(_string(v) for v in values)})"


def _setenv(env: dict[str, str]) -> str:
    """R that sets ``env`` (non-empty): Sys.setenv with its names as strings, whatever they are."""
    return (f"do.call(Sys.setenv, setNames(as.list({_vector(list(env.values()))}), "
            f"{_vector(list(env))}))")


def env_in(env: dict[str, str]) -> str:
    """A cell's own environment variables (non-empty): set, and what they were kept."""
    return (f"invisible(local({{assign('.forkd_saved', Sys.getenv({_vector(list(env))}, unset = NA, "
            f"names = TRUE), envir = globalenv()); {_setenv(env)}}}))")


# What env_in changed, back as it was: the unset ones unset again.
ENV_OUT = ("invisible(local({saved <- get('.forkd_saved', envir = globalenv()); "
           "rm('.forkd_saved', envir = globalenv()); unset <- is.na(saved); "
           "if (any(unset)) Sys.unsetenv(names(saved)[unset]); "
           "if (any(!unset)) do.call(Sys.setenv, as.list(saved[!unset]))}))")


def restored(env: dict[str, str], seed: bytes) -> str:
    """A restored child's environment, and a new seed for R's RNG (an int of R's: below 2**31 - 1)."""
    seed31 = int.from_bytes(seed[:4], "big") % ((1 << 31) - 1)
    return f"invisible(local({{{_setenv(env) + '; ' if env else ''}set.seed({seed31})}}))"
