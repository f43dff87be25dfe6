"""What the benchmarks share: a scratch Runtime that leaves nothing behind, host facts,
per-process CPU and memory readings, percentiles, and writing results.

Every benchmark opens its Runtime on a throwaway data directory (sharing the
built guest image) under ``FORKD_BENCH_SCRATCH`` when ``bench/run_all.py`` sets
it, so that the runner can kill whatever a failed part left running by that
path alone, never another user's VMs.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from forkd.config import DataDir, default_data_dir
from forkd.controller.runtime import Runtime
from forkd.vmm import probe

RESULTS = Path(__file__).resolve().parent / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- statistics


def percentile(samples: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(samples)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(samples: list[float], digits: int = 4) -> dict[str, Any]:
    return {"n": len(samples), "min": round(min(samples), digits),
            "p50": round(statistics.median(samples), digits),
            "p99": round(percentile(samples, 0.99), digits), "max": round(max(samples), digits)}


# ---------------------------------------------------------------- processes


def cpu_ms(pid: int) -> float:
    """CPU time (user + system) a process has used, in ms; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * 1000 / CLK_TCK


def smaps_kib(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup`` in KiB (Rss, Pss, Pss_Anon, ...); {} once it is gone."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, value = line.split(":", 1)
            out[key] = int(value.split()[0])
    except (OSError, ValueError):
        return {}
    return out


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return math.nan


def qemu_pids(marker: str | None = None) -> list[int]:
    """PIDs of qemu-system processes (whose command line mentions ``marker``, if given)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"qemu-system" in argv[0] and (marker is None or marker.encode() in b" ".join(argv)):
            pids.append(int(d.name))
    return pids


def kill_qemus_under(root: Path) -> list[int]:
    """SIGKILL every QEMU whose command line names a path under ``root``: a failed part's leftovers."""
    killed = []
    for pid in qemu_pids(str(root)):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


# ---------------------------------------------------------------- host facts


def host_facts() -> dict[str, Any]:
    """Cores, memory, CPU model, kernel, QEMU version, load: what bounds every figure here."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_total = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_total = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1]) // 1024
    kvm = Path("/dev/kvm").exists()
    kvm_module = ""
    with contextlib.suppress(OSError):
        mods = Path("/proc/modules").read_text()
        kvm_module = next((m for m in ("kvm_pvm", "kvm_intel", "kvm_amd") if m + " " in mods), "")
    gpu = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=5)
        gpu = r.stdout.strip() if r.returncode == 0 else ""
    return {
        "cores": os.cpu_count(), "cpu_model": model, "mem_total_mib": mem_total,
        "kernel": platform.release(), "qemu": probe.qemu_version(),
        "dev_kvm": f"present ({kvm_module or 'unknown module'})" if kvm else "absent",
        "gpu": gpu or "none", "python": platform.python_version(),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "other_qemu": len(qemu_pids()),
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


# ---------------------------------------------------------------- runtime


def scratch_data(prefix: str) -> DataDir:
    """A throwaway data dir sharing the real one's image (under FORKD_BENCH_SCRATCH if set)."""
    parent = os.environ.get("FORKD_BENCH_SCRATCH")
    if not parent:
        return DataDir.scratch(prefix)
    # No prefix under the runner's directory: QEMU's socket paths must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="", dir=parent))
    real = default_data_dir()
    probe_file = real / "host-probe.json"
    if probe_file.exists():
        shutil.copy(probe_file, root / "host-probe.json")
    images = os.environ.get("FORKD_IMAGES_DIR")
    return DataDir(root, Path(images) if images else real / "images")


@contextlib.asynccontextmanager
async def scratch_runtime(prefix: str) -> AsyncIterator[Runtime]:
    """A Runtime on a scratch data dir; on the way out every VM it started is gone, and the dir."""
    data = scratch_data(prefix)
    rt: Runtime | None = None
    try:
        rt = await Runtime.open(data)
        yield rt
    finally:
        shm = rt.shm.dir if rt is not None else None
        if rt is not None:
            with contextlib.suppress(Exception):
                await rt.close()
        kill_qemus_under(data.root)
        if shm is not None:
            kill_qemus_under(shm)
            shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(data.root, ignore_errors=True)


def write_result(name: str, results: dict[str, Any], out: str | None = None) -> Path:
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    results.setdefault("host_end", {"loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())})
    results["measured_at_unix"] = int(time.time())
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {path}", flush=True)
    return path


# ---------------------------------------------------------------- a daemon process

FORKD = Path(sys.executable).with_name("forkd")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    url: str
    process: subprocess.Popen[bytes]
    serving_s: float  # from the spawn to the first 200 of /healthz


@contextlib.contextmanager
def forkd_daemon(data: DataDir, token_file: Path, log_path: Path, *, extra_args: tuple[str, ...] = (),
                 timeout_s: float = 120) -> Iterator[Daemon]:
    """A real ``forkd daemon`` on a free loopback port over ``data``, once it answers /healthz;
    stopped with SIGTERM on the way out (it kills its sandboxes unless told to keep them)."""
    port = free_port()
    with forkd_process(["daemon", "--bind", f"127.0.0.1:{port}", "--data-dir", str(data.root),
                        "--token-file", str(token_file), *extra_args], f"http://127.0.0.1:{port}",
                       log_path, env={"FORKD_IMAGES_DIR": str(data.images)}, timeout_s=timeout_s) as daemon:
        yield daemon


@contextlib.contextmanager
def forkd_process(args: list[str], url: str, log_path: Path, *, env: dict[str, str] | None = None,
                  timeout_s: float = 120) -> Iterator[Daemon]:
    """``forkd ARGS`` (a daemon, a gateway) serving at ``url``, once it answers /healthz; stopped with
    SIGTERM on the way out (SIGKILL after 120 s). Its environment: ours without FORKD_*, plus ``env``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    environment.update(env or {})
    with log_path.open("ab") as log:
        started = time.perf_counter()
        process = subprocess.Popen(
            [str(FORKD), *args], env=environment, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"forkd {args[0]} exited with {process.returncode}; see {log_path}")
                try:
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.perf_counter() - started > timeout_s:
                    raise RuntimeError(f"forkd {args[0]} did not answer /healthz within {timeout_s:.0f} s; "
                                       f"see {log_path}")
                time.sleep(0.05)
            yield Daemon(url, process, time.perf_counter() - started)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
