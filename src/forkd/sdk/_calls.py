"""The REST v1 surface as request builders (see :class:`forkd.sdk._http.Call`).

Optional fields are only put in a body when the caller set them, so the
daemon's own defaults apply and older daemons are not sent fields they do not
know.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from forkd.sdk._build import command_args
from forkd.sdk._build import extra as _extra
from forkd.sdk._build import put as _put
from forkd.sdk._build import seg as _seg
from forkd.sdk._http import Call
from forkd.sdk.models import NetworkPolicy

# Extra seconds to wait for an exec reply beyond the command's own timeout: the
# daemon needs time to kill the process group and ship the output back.
EXEC_GRACE_SECS = 30.0


def healthz() -> Call:
    return Call("GET", "/healthz")


def version() -> Call:
    return Call("GET", "/version")


def metrics() -> Call:
    return Call("GET", "/metrics", expect="text")


def list_snapshots() -> Call:
    return Call("GET", "/v1/snapshots")


def get_snapshot(tag: str) -> Call:
    return Call("GET", f"/v1/snapshots/{_seg(tag)}")


def _egress(
    body: dict[str, Any], allow_internet_access: bool, network: NetworkPolicy | None
) -> dict[str, Any]:
    """The egress fields (E2B's names); sent only when they open something."""
    if allow_internet_access:
        body["allow_internet_access"] = True
    if network is not None:
        # As given (lists of destinations, the port proxy's settings, header rules), tuples as lists.
        body["network"] = {k: list(v) if isinstance(v, tuple) else v for k, v in network.items()}
    return body


def create_snapshot(
    tag: str,
    *,
    kernel: str | None,
    rootfs: str | None,
    boot_wait_secs: float | None,
    image: str | None,
    mem_mib: int | None,
    vcpus: int | None,
    warm_imports: Sequence[str] | None,
    setup: Sequence[str | Sequence[str]] | None,
    extra: Mapping[str, object],
    nic: bool = False,
    allow_internet_access: bool = False,
    network: NetworkPolicy | None = None,
) -> Call:
    body = _put(
        {"tag": tag},
        kernel=kernel,
        rootfs=rootfs,
        boot_wait_secs=boot_wait_secs,
        image=image,
        mem_mib=mem_mib,
        vcpus=vcpus,
        warm_imports=list(warm_imports) if warm_imports is not None else None,
        # The daemon takes argv lists; a plain string is a shell command line.
        setup=[command_args(step) for step in setup] if setup is not None else None,
    )
    if nic:
        body["nic"] = True
    _egress(body, allow_internet_access, network)
    _extra(body, extra)
    return Call("POST", "/v1/snapshots", json=body, read_timeout=None)


def list_images() -> Call:
    return Call("GET", "/v1/images")


def delete_image(name: str) -> Call:
    return Call("DELETE", f"/v1/images/{_seg(name)}")


def delete_snapshot(tag: str, *, cascade: bool, force: bool) -> Call:
    params = {name: "true" for name, on in (("cascade", cascade), ("force", force)) if on}
    return Call("DELETE", f"/v1/snapshots/{_seg(tag)}", params=params)


def _child_options(
    body: dict[str, Any],
    *,
    per_child_netns: bool,
    memory_limit_mib: int | None,
    live_fork: bool,
    env: Mapping[str, str] | None,
    child_env: Sequence[Mapping[str, str]] | None,
    metadata: Mapping[str, str] | None,
    timeout_secs: float | None = None,
    allow_internet_access: bool = False,
    network: NetworkPolicy | None = None,
) -> dict[str, Any]:
    """The spawn options that POST /v1/sandboxes and the fork routes share."""
    _egress(body, allow_internet_access, network)
    if per_child_netns:
        body["per_child_netns"] = True
    if memory_limit_mib is not None:
        body["memory_limit_mib"] = memory_limit_mib
    if live_fork:
        body["live_fork"] = True
    return _put(
        body,
        env=dict(env) if env is not None else None,
        child_env=[dict(e) for e in child_env] if child_env is not None else None,
        metadata=dict(metadata) if metadata is not None else None,
        timeout_secs=timeout_secs,
    )


def spawn_sandboxes(
    tag: str,
    *,
    n: int,
    per_child_netns: bool,
    memory_limit_mib: int | None,
    live_fork: bool,
    env: Mapping[str, str] | None = None,
    child_env: Sequence[Mapping[str, str]] | None = None,
    metadata: Mapping[str, str] | None = None,
    timeout_secs: float | None = None,
    idle_pause_secs: float | None = None,
    allow_internet_access: bool = False,
    network: NetworkPolicy | None = None,
    extra: Mapping[str, object] | None = None,
) -> Call:
    body = _child_options(
        {"snapshot_tag": tag, "n": n},
        allow_internet_access=allow_internet_access,
        network=network,
        per_child_netns=per_child_netns,
        memory_limit_mib=memory_limit_mib,
        live_fork=live_fork,
        env=env,
        child_env=child_env,
        metadata=metadata,
        timeout_secs=timeout_secs,
    )
    if idle_pause_secs is not None:
        body["idle_pause_secs"] = idle_pause_secs
    _extra(body, extra)
    return Call("POST", "/v1/sandboxes", json=body, read_timeout=None)


def list_sandboxes(
    *, snapshot_tag: str | None = None, metadata: Mapping[str, str] | None = None,
    state: str | None = None, limit: int | None = None, after: str | None = None,
) -> Call:
    params: dict[str, str | list[str]] = {}
    for key, value in (("snapshot_tag", snapshot_tag), ("state", state), ("after", after)):
        if value is not None:
            params[key] = value
    if limit is not None:
        params["limit"] = str(limit)
    if metadata:
        # Repeated, one key=value each; the daemon keeps sandboxes matching all.
        params["metadata"] = [f"{key}={value}" for key, value in metadata.items()]
    return Call("GET", "/v1/sandboxes", params=params)


def get_sandbox(sandbox_id: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{_seg(sandbox_id)}")


def sandbox_diff(sandbox_id: str, against: str = "parent", include: list[str] | None = None,
                 exclude: list[str] | None = None, format: str = "json") -> Call:
    params: dict[str, str | list[str]] = {"against": against, "format": format}
    if include is not None:
        params["include"] = list(include)
    if exclude is not None:
        params["exclude"] = list(exclude)
    expect: Literal["json", "text", "bytes"] = (
        "json" if format == "json" else "text" if format == "patch" else "bytes")
    return Call("GET", f"/v1/sandboxes/{_seg(sandbox_id)}/diff", params=params, read_timeout=None,
                expect=expect)


def apply_changes(sandbox_id: str, source: str, paths: list[str] | None = None) -> Call:
    body: dict[str, Any] = {"from": source}
    if paths is not None:
        body["paths"] = list(paths)
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/apply", json=body, read_timeout=None)


def sandbox_memory(sandbox_id: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{_seg(sandbox_id)}/memory")


def network_log(sandbox_id: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{_seg(sandbox_id)}/network/log")


def kill_sandbox(sandbox_id: str) -> Call:
    return Call("DELETE", f"/v1/sandboxes/{_seg(sandbox_id)}")


def hibernate(sandbox_id: str, memory: bool = True) -> Call:
    # The memory-keeping default sends no body, as before the option.
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/hibernate",
                json=None if memory else {"memory": False})


def set_timeout(sandbox_id: str, timeout_secs: float) -> Call:
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/timeout", json={"timeout_secs": timeout_secs})


def update_network(sandbox_id: str, *, allow_internet_access: bool = False,
                   network: Mapping[str, Any] | None = None) -> Call:
    """The whole new policy: what ``network`` omits takes a spawn's default."""
    body: dict[str, Any] = {key: list(value) if key in ("allow_out", "deny_out") else value
                            for key, value in (network or {}).items()}
    body["allow_internet_access"] = allow_internet_access
    return Call("PUT", f"/v1/sandboxes/{_seg(sandbox_id)}/network", json=body)


def ping(sandbox_id: str) -> Call:
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/ping")


def exec_(
    sandbox_id: str,
    args: str | Sequence[str],
    *,
    timeout_secs: float,
    env: Mapping[str, str] | None,
    cwd: str | None,
    stdin: str | None,
    user: str | None = None,
) -> Call:
    body = _put(
        {"args": command_args(args), "timeout_secs": timeout_secs},
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=stdin,
        user=user,
    )
    return Call(
        "POST",
        f"/v1/sandboxes/{_seg(sandbox_id)}/exec",
        json=body,
        read_timeout=timeout_secs + EXEC_GRACE_SECS,
    )


def eval_(sandbox_id: str, code: str, *, timeout: float | None) -> Call:
    # The daemon bounds one eval at ``timeout`` (default forkd.bounds.EVAL_TIMEOUT_SECS,
    # 60 s). When that expires the guest agent interrupts the evaluation (an
    # EvalTimeout, a BaseException like KeyboardInterrupt, is raised inside the
    # evaluated code) and answers {"result": null, "error": "TimeoutError: ...",
    # "exit_code": 1}; code stuck inside a C call is answered about a second
    # later, and later evals wait for it. Either way the daemon answers within
    # about that bound: the client waits that long plus a grace.
    body = _put({"code": code}, timeout_secs=timeout)
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/eval", json=body,
                read_timeout=None if timeout is None else timeout + EXEC_GRACE_SECS)


def cancel_eval(sandbox_id: str) -> Call:
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/eval/cancel")


def branch_sandbox(
    sandbox_id: str,
    *,
    tag: str | None,
    mode: str | None,
    wait: bool,
    diff: bool | None,
    extra: Mapping[str, object] | None = None,
) -> Call:
    body = _put({}, tag=tag, mode=mode, diff=diff)
    if not wait:  # the daemon's default is true; only the opt-out is sent
        body["wait"] = False
    _extra(body, extra)
    return Call(
        "POST", f"/v1/sandboxes/{_seg(sandbox_id)}/branch", json=body, read_timeout=None
    )


def fork_sandbox(
    sandbox_id: str,
    *,
    tree: bool,
    count: int,
    per_child_netns: bool,
    memory_limit_mib: int | None,
    child_memory_limit_mib: Sequence[int | None] | None,
    live_fork: bool,
    env: Mapping[str, str] | None,
    child_env: Sequence[Mapping[str, str]] | None,
    metadata: Mapping[str, str] | None,
    keep_snapshot: bool,
    timeout_secs: float | None = None,
    allow_internet_access: bool = False,
    network: NetworkPolicy | None = None,
    extra: Mapping[str, object] | None = None,
) -> Call:
    body = _child_options(
        {"count": count},
        allow_internet_access=allow_internet_access,
        network=network,
        per_child_netns=per_child_netns,
        memory_limit_mib=memory_limit_mib,
        live_fork=live_fork,
        env=env,
        child_env=child_env,
        metadata=metadata,
        timeout_secs=timeout_secs,
    )
    if child_memory_limit_mib is not None:
        body["child_memory_limit_mib"] = list(child_memory_limit_mib)
    if keep_snapshot:
        body["keep_snapshot"] = True
    _extra(body, extra)
    route = "fork-tree" if tree else "fork"
    # A branch plus count restores: as long as a spawn, so no read timeout.
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/{route}", json=body, read_timeout=None)


def promote_sandbox(
    sandbox_id: str, *, tree_id: str | None, cleanup_siblings: bool, replace_parent: bool
) -> Call:
    body = _put({}, tree_id=tree_id)
    if not cleanup_siblings:  # the daemon's default is true; only the opt-out is sent
        body["cleanup_siblings"] = False
    if replace_parent:
        body["replace_parent"] = True
    # Killing many siblings takes a while; the daemon answers once they are gone.
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/promote", json=body, read_timeout=None)


def set_checkpoints(sandbox_id: str, *, every: int, keep: int | None, mode: str | None) -> Call:
    body = _put({"every": every}, keep=keep, mode=mode)
    return Call("POST", f"/v1/sandboxes/{_seg(sandbox_id)}/checkpoints", json=body)


def get_checkpoints(sandbox_id: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{_seg(sandbox_id)}/checkpoints")


def delete_checkpoints(sandbox_id: str) -> Call:
    return Call("DELETE", f"/v1/sandboxes/{_seg(sandbox_id)}/checkpoints")


def set_pool(
    tag: str,
    size: int,
    *,
    memory_limit_mib: int | None,
    per_child_netns: bool,
    live_fork: bool,
    allow_internet_access: bool = False,
    network: NetworkPolicy | None = None,
    extra: Mapping[str, object] | None = None,
) -> Call:
    body = _egress(_put({"size": size}, memory_limit_mib=memory_limit_mib), allow_internet_access, network)
    if per_child_netns:
        body["per_child_netns"] = True
    if live_fork:
        body["live_fork"] = True
    _extra(body, extra)
    # Shrinking or draining waits for members to be torn down: no read timeout.
    return Call("PUT", f"/v1/snapshots/{_seg(tag)}/pool", json=body, read_timeout=None)


def get_pool(tag: str) -> Call:
    return Call("GET", f"/v1/snapshots/{_seg(tag)}/pool")


def list_pools() -> Call:
    return Call("GET", "/v1/pools")


# Moving a snapshot's files to or from the object store takes as long as it takes.
def push_snapshot(tag: str, *, force: bool) -> Call:
    return Call("POST", f"/v1/snapshots/{_seg(tag)}/push", json={"force": True} if force else None,
                read_timeout=None)


def pull_snapshot(tag: str) -> Call:
    return Call("POST", f"/v1/snapshots/{_seg(tag)}/pull", read_timeout=None)


def compact_snapshot(tag: str, to: str) -> Call:
    # Copies the whole flattened disk and memory: as long as that takes.
    return Call("POST", f"/v1/snapshots/{_seg(tag)}/compact", json={"to": to}, read_timeout=None)


# -------------------------------------------------------------- workspaces

def _workspace(name: str, what: str = "") -> str:
    return f"/v1/workspaces/{_seg(name)}{what}"


def create_workspace(name: str, snapshot_tag: str, *, per_child_netns: bool,
                     memory_limit_mib: int | None) -> Call:
    body = _put({"name": name, "snapshot_tag": snapshot_tag}, memory_limit_mib=memory_limit_mib)
    if per_child_netns:
        body["per_child_netns"] = True
    return Call("POST", "/v1/workspaces", json=body, read_timeout=None)


def list_workspaces() -> Call:
    return Call("GET", "/v1/workspaces")


def get_workspace(name: str) -> Call:
    return Call("GET", _workspace(name))


def delete_workspace(name: str) -> Call:
    return Call("DELETE", _workspace(name))


# A suspend is a branch and a resume a restore: both wait as long as the daemon takes.
def suspend_workspace(name: str, *, diff: bool) -> Call:
    return Call("POST", _workspace(name, "/suspend"), json={"diff": True} if diff else None,
                read_timeout=None)


def resume_workspace(name: str) -> Call:
    return Call("POST", _workspace(name, "/resume"), read_timeout=None)




# -------------------------------------------------------------- volumes

def create_volume(name: str, *, size_mib: int | None, source: str | None, fs: str | None = None) -> Call:
    body = _put({"name": name}, size_mib=size_mib, source=source, fs=fs)
    # Making the filesystem (and copying a source into it) takes as long as it takes.
    return Call("POST", "/v1/volumes", json=body, read_timeout=None)


def list_volumes() -> Call:
    return Call("GET", "/v1/volumes")


def get_volume(name: str) -> Call:
    return Call("GET", f"/v1/volumes/{_seg(name)}")


def export_volume(name: str, to: str, *, snapshot: str | None) -> Call:
    # Copies every file of the volume: as long as that takes.
    return Call("POST", f"/v1/volumes/{_seg(name)}/export", json=_put({"to": to}, snapshot=snapshot),
                read_timeout=None)


def delete_volume(name: str) -> Call:
    return Call("DELETE", f"/v1/volumes/{_seg(name)}")


def put_build_context() -> Call:
    return Call("PUT", "/v1/templates/contexts", read_timeout=None)


def build_template(tag: str, dockerfile: str, *, context: str | None, extra: Mapping[str, object]) -> Call:
    body = _extra({"tag": tag, "dockerfile": dockerfile, "context": context}, extra)
    # The stream lasts as long as the build (minutes): no read timeout between its lines.
    return Call("POST", "/v1/templates", json=body, read_timeout=None)
