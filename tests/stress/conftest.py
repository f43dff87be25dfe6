"""Opt-in stress runs: ``make stress`` (or ``pytest -m stress tests/stress``).

They reuse the integration fixtures (one template boot per session).
"""

from tests.integration.conftest import data_dir, loop, runtime, snapshot  # noqa: F401
