"""Token hygiene (issue 24, low): a token file other users can read, and a short or
single-class token, are accepted (the operator's choice) but no longer silently."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from forkd.api import server as server_mod
from forkd.api.auth import STRONG_TOKEN_CHARS, token_warnings
from forkd.api.settings import Settings

STRONG = "Q3vJ8kz0xWmT5cR1yLbN7dHf2sGpA9eU"  # 32, mixed


def _file(tmp_path: Path, token: str, mode: int) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


def test_a_private_strong_token_has_no_warning(tmp_path: Path) -> None:
    assert len(STRONG) == STRONG_TOKEN_CHARS
    assert token_warnings(_file(tmp_path, STRONG, 0o600), STRONG) == []
    hex64 = "9f" * 32  # openssl rand -hex 32: digits and lowercase letters
    assert token_warnings(_file(tmp_path, hex64, 0o400), hex64) == []


@pytest.mark.parametrize(("token", "mode", "words"), [
    (STRONG, 0o644, ["mode 0644", "chmod 600"]),
    (STRONG, 0o640, ["mode 0640"]),
    ("qwertyuiopasdfgh", 0o600, ["weak (16 characters, of one kind only)"]),  # the report's
    ("Qw3rtyuiopasdfgh", 0o600, ["weak (16 characters)"]),
    ("q" + "wertyuiopasdfghjklzxcvbnmqwertyu", 0o600, ["of one kind only"]),
])
def test_weak_tokens_and_readable_files_are_named(tmp_path: Path, token: str, mode: int,
                                                  words: list[str]) -> None:
    warnings = " | ".join(token_warnings(_file(tmp_path, token, mode), token))
    for word in words:
        assert word in warnings, warnings


def test_the_daemon_logs_them_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    class NoServer:
        started = True

        def __init__(self, *args: object) -> None:
            pass

        def run(self) -> None:
            pass

    monkeypatch.setattr(server_mod, "_Server", NoServer)
    monkeypatch.setattr(server_mod, "create_app", lambda settings: None)
    path = _file(tmp_path, "qwertyuiopasdfgh", 0o644)
    with caplog.at_level(logging.WARNING, logger=server_mod.log.name):
        server_mod.serve(Settings(token_file=path, data_dir=tmp_path / "data",
                                  audit_log=tmp_path / "audit.log"))
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("mode 0644" in m for m in logged) and any("weak" in m for m in logged), logged
