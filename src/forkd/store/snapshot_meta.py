"""``snapshot.json``, checked field by field before anything uses it.

A snapshot's metadata is written by this forkd (controller/templates.py, branch.py,
compaction.py), but it also arrives from elsewhere: as a manifest's ``meta`` from an object
store or a pack archive (store/manifest.py). Its fields reach QEMU's command line (``config``),
the host's ``ip -batch`` and nftables scripts (``tap``, ``dns``), the guest's kernel command line
(``warm_imports``) and paths the daemon opens (``image.name``, ``kernel``, ``rootfs``). So every
field has a schema with bounds here, and :func:`check` is applied wherever a ``snapshot.json`` is
read or imported: a value outside it is refused, never used. Fields this module does not know are
dropped, so nothing unchecked can reach a use.

The host-local paths (``kernel``, ``rootfs``) only mean something on the host that wrote them:
:func:`for_import` drops them from a snapshot that travelled, and the importer sets ``rootfs`` from
its own configuration (the base image it installed); a tap's name is this host's default one.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from typing import Any

from forkd import bounds
from forkd.errors import InvalidRequest
from forkd.host import childnet, netns, netplan
from forkd.host.accel import VMConfig
from forkd.store import volume_spec

VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_~:() -]{0,127}$")
KEY_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
MAX_STEP_CHARS = 64 * 1024
MAX_ARGV = 4096  # words in one setup step
MAX_PATH_CHARS = 4096
MAX_TEXT = 1024
MODES = ("full", "diff", "live")
LOCAL_PATHS = ("kernel", "rootfs")


class BadMeta(InvalidRequest):
    """A ``snapshot.json`` field outside its schema; the message names the field."""


Check = Callable[[Any, str], Any]


def _optional(check: Check) -> Check:
    def run(v: Any, what: str) -> Any:
        return None if v is None else check(v, what)
    return run


def _tag(v: Any, what: str) -> str:
    if not isinstance(v, str) or not bounds.TAG_RE.match(v):
        raise BadMeta(f"{what} is not a valid snapshot tag")
    return v


def _sandbox_id(v: Any, what: str) -> str:
    if not isinstance(v, str) or not bounds.SANDBOX_ID_RE.match(v):
        raise BadMeta(f"{what} is not a valid sandbox id")
    return v


def _unix(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 40:
        raise BadMeta(f"{what} must be an integer time in unix seconds")
    return v


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v < 1e12:
        raise BadMeta(f"{what} must be a non-negative number")
    return v


def _bool(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise BadMeta(f"{what} must be true or false")
    return v


def _text(limit: int, pattern: re.Pattern[str] | None = None) -> Check:
    def run(v: Any, what: str) -> str:
        if not isinstance(v, str) or len(v) > limit or "\x00" in v or (pattern and not pattern.match(v)):
            raise BadMeta(f"{what} must be a string of at most {limit} characters"
                          + (f" matching {pattern.pattern}" if pattern else ""))
        return v
    return run


def _path(v: Any, what: str) -> str:
    if not isinstance(v, str) or not v.startswith("/") or len(v) > MAX_PATH_CHARS or "\x00" in v \
            or "\n" in v:
        raise BadMeta(f"{what} must be an absolute path")
    return v


def _list(item: Check, limit: int) -> Check:
    def run(v: Any, what: str) -> list[Any]:
        if not isinstance(v, list) or len(v) > limit:
            raise BadMeta(f"{what} must be a list of at most {limit} entries")
        return [item(x, f"{what}[{i}]") for i, x in enumerate(v)]
    return run


def _config(v: Any, what: str) -> dict[str, Any]:
    try:
        return VMConfig.from_json(v).to_json()
    except (ValueError, TypeError) as exc:
        raise BadMeta(f"{what}: {exc}") from None


def _image(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BadMeta(f"{what} must be an object")
    # The name is a directory under the data dir's images/: the snapshot tag rules keep it one.
    out: dict[str, Any] = {"name": _tag(v.get("name"), f"{what}.name")}
    if v.get("key") is not None:
        out["key"] = _text(128, KEY_RE)(v["key"], f"{what}.key")
    if v.get("kernel_version") is not None:
        out["kernel_version"] = _text(128, VERSION_RE)(v["kernel_version"], f"{what}.kernel_version")
    return out


def _tap(v: Any, what: str) -> str:
    try:
        return netns.check_tap_name(v)
    except InvalidRequest as exc:
        raise BadMeta(f"{what}: {exc}") from None


def _ipv4(v: Any, what: str) -> str:
    # A resolver lands in the guest's kernel command line and in nftables rules: a plain address.
    if not isinstance(v, str) or len(v) > 15:
        raise BadMeta(f"{what} must be an IPv4 address")
    try:
        return str(ipaddress.IPv4Address(v))
    except ValueError:
        raise BadMeta(f"{what} must be an IPv4 address") from None


def _mode(v: Any, what: str) -> str:
    if v not in MODES:
        raise BadMeta(f"{what} must be one of {', '.join(MODES)}")
    return str(v)


def _volume(v: Any, what: str) -> dict[str, Any]:
    try:
        return volume_spec.check_meta_entry(v, what)
    except BadMeta:
        raise
    except InvalidRequest as exc:
        raise BadMeta(str(exc)) from None


def _imported(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BadMeta(f"{what} must be an object")
    return {"from": _text(MAX_TEXT)(v.get("from"), f"{what}.from"),
            "at_unix": _unix(v.get("at_unix"), f"{what}.at_unix"),
            "chain_of": _tag(v.get("chain_of"), f"{what}.chain_of")}


# Every field of snapshot.json and its schema (a snapshot children fork from also needs "config").
FIELDS: dict[str, Check] = {
    "tag": _tag,
    "created_at_unix": _unix,
    "config": _config,
    "image": _optional(_image),
    "kernel": _optional(_path),
    "rootfs": _optional(_path),
    # Module names, as a request's warm_imports (they reach the guest's kernel command line).
    "warm_imports": _optional(_list(_text(256, bounds.MODULE_RE), bounds.MAX_WARM_IMPORTS)),
    # Each setup step is an argv (controller/templates.py: SnapshotSpec.setup).
    "setup": _optional(_list(_list(_text(MAX_STEP_CHARS), MAX_ARGV), bounds.MAX_SETUP_STEPS)),
    "setup_eval": _optional(_list(_text(MAX_STEP_CHARS), bounds.MAX_SETUP_STEPS)),
    "jupyter_kernel": _optional(_bool),
    "numpy_version": _optional(_text(128, VERSION_RE)),
    "python_version": _optional(_text(128, VERSION_RE)),
    "qemu_version": _optional(_text(256, VERSION_RE)),
    "boot_secs": _optional(_number),
    "save_state_ms": _optional(_number),
    "convert_secs": _optional(_number),
    "pause_ms": _optional(_number),
    "parent_tag": _optional(_tag),
    "branched_from": _optional(_sandbox_id),
    "compacted_from": _optional(_tag),
    "mode": _optional(_mode),
    "tap": _optional(_tap),
    "dns": _optional(_list(_ipv4, childnet.MAX_DNS)),
    "imported": _optional(_imported),
    # The volumes attached after the root disk, in device order (store/volume_spec.py): part of
    # the device configuration every child and branch restores into.
    "volumes": _optional(_list(_volume, bounds.MAX_VOLUMES)),
}


def check(raw: Any, what: str = "snapshot.json") -> dict[str, Any]:
    """``raw`` with every known field checked against its schema and the unknown ones dropped.

    Raises :class:`BadMeta` naming the first field out of bounds."""
    if not isinstance(raw, dict):
        raise BadMeta(f"{what} must be an object")
    return {key: FIELDS[key](value, f"{what} field {key!r}") for key, value in raw.items() if key in FIELDS}


def for_import(raw: Any, what: str) -> dict[str, Any]:
    """A travelling snapshot's meta: checked, and without the paths of the host that wrote it."""
    meta = check(raw, what)
    for key in LOCAL_PATHS:
        meta.pop(key, None)
    if meta.get("tap") is not None:
        # Only the NIC is part of the device state, not its tap's name: children of an imported
        # snapshot get this host's default tap, a name no store chose.
        meta["tap"] = netplan.DEFAULT_TAP
    return meta


def check_record(raw: Any, what: str) -> dict[str, Any]:
    """A manifest's ``record`` (what a SnapshotRecord keeps of a travelling snapshot), checked."""
    if not isinstance(raw, dict):
        raise BadMeta(f"{what} must be an object")
    fields = {"branched_from": _optional(_sandbox_id), "pause_ms": _optional(_number),
              "mode": _optional(_mode)}
    return {key: fields[key](value, f"{what} field {key!r}") for key, value in raw.items() if key in fields}


__all__ = ["FIELDS", "BadMeta", "check", "check_record", "for_import"]
