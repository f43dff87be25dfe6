"""A host's ceilings (controller/capacity.py): a spawn past --max-sandboxes or below the memory
reserve is a 503 with code no_capacity and a Retry-After, and the SDKs raise a typed error for it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from forkd.api.handlers import install_exception_handlers
from forkd.config import HostLimits
from forkd.controller.capacity import RETRY_AFTER_SECS, HostCapacity, available_mib
from forkd.errors import NoCapacity
from forkd.sdk import Controller, NoCapacityError, ServiceUnavailable


def test_max_sandboxes_counts_live_vms_and_those_being_admitted() -> None:
    live = [3]
    capacity = HostCapacity(live=lambda: live[0], limits=HostLimits(max_sandboxes=5))
    capacity.check(2)  # 3 + 2 = 5: fits
    with pytest.raises(NoCapacity, match=r"3 of its 5 sandboxes .* 3 more were asked for \(2 free\)"):
        capacity.check(3)
    with capacity.admit(2):  # two restoring: no place is left for a concurrent spawn
        with pytest.raises(NoCapacity) as refused:
            capacity.check(1)
        assert refused.value.retry_after_secs == RETRY_AFTER_SECS and refused.value.status == 503
    capacity.check(2)  # released when the block ends (the children that started count as live)
    with pytest.raises(NoCapacity), capacity.admit(3):
        pass
    capacity.check(2)  # a refused admit holds nothing
    HostCapacity(live=lambda: 10_000).check(100)  # no limit: anything goes


def test_the_memory_reserve_reads_memavailable(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:    2097152 kB\n")
    assert available_mib(meminfo) == 2048
    HostCapacity(lambda: 0, HostLimits(memory_reserve_mib=2048), meminfo).check(1)
    with pytest.raises(NoCapacity, match="2048 MiB available, below its reserve of 4096 MiB"):
        HostCapacity(lambda: 0, HostLimits(memory_reserve_mib=4096), meminfo).check(1)
    meminfo.write_text("garbage")
    HostCapacity(lambda: 0, HostLimits(memory_reserve_mib=4096), meminfo).check(1)  # unreadable: no guess
    assert available_mib(Path("/proc/meminfo")) is not None


@pytest.mark.parametrize("limits", [{"max_sandboxes": 0}, {"max_sandboxes": 10**7},
                                    {"memory_reserve_mib": -1}])
def test_limits_out_of_range_are_refused(limits: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be between"):
        HostLimits(**limits)


def test_the_answer_is_a_503_with_its_code_and_retry_after() -> None:
    app = FastAPI()
    install_exception_handlers(app)

    @app.post("/v1/sandboxes")
    async def spawn() -> None:
        HostCapacity(lambda: 2, HostLimits(max_sandboxes=2)).check(1)

    r = TestClient(app).post("/v1/sandboxes")
    assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_SECS)
    assert r.json()["code"] == "no_capacity" and "--max-sandboxes" in r.json()["error"]


def test_the_sdk_raises_a_typed_error_with_the_retry_after() -> None:
    def daemon(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(503, json={"error": "this host is at capacity", "code": "no_capacity"},
                                  headers={"Retry-After": "5"})
        return httpx.Response(503, json={"error": "the daemon is still starting; retry shortly"})

    controller = Controller("http://forkd.test", transport=httpx.MockTransport(daemon))
    with pytest.raises(NoCapacityError) as full:
        controller.spawn_sandboxes("py")
    assert full.value.retry_after == 5 and full.value.status == 503 and "capacity" in full.value.message
    with pytest.raises(ServiceUnavailable) as busy:  # a 503 without the code stays the plain one
        controller.list_sandboxes()
    assert not isinstance(busy.value, NoCapacityError)


def test_e2b_clients_get_the_503_and_its_retry_after_in_e2bs_shape() -> None:
    from forkd.api.e2b import control, handlers

    app = FastAPI()
    handlers.install(app, control._json_error, "supported by forkd")  # as the control plane does

    @app.post("/sandboxes")
    async def create() -> None:
        HostCapacity(lambda: 1, HostLimits(max_sandboxes=1)).check(1)

    r = TestClient(app).post("/sandboxes")
    assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_SECS)
    assert r.json()["code"] == 503 and "capacity" in r.json()["message"]  # E2B's {"code", "message"}
