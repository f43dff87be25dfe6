"""Where forkd keeps its state, and the defaults every layer shares."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

VERSION = "0.1.0"
API_VERSION = "v1"

DEFAULT_BIND = "127.0.0.1:8889"
DEFAULT_MEM_MIB = 512
DEFAULT_VCPUS = 1
DEFAULT_IMAGE = "default"
DEFAULT_WARM_IMPORTS = ("numpy",)


def default_data_dir() -> Path:
    """``$FORKD_DATA_DIR``, else ``$XDG_DATA_HOME/forkd`` (``~/.local/share/forkd``)."""
    if env := os.environ.get("FORKD_DATA_DIR"):
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "forkd"


@dataclass(frozen=True)
class DataDir:
    """The on-disk layout under one data directory.

    ``images/`` can live elsewhere (``$FORKD_IMAGES_DIR``) so that throwaway data
    directories, as the tests use, still share one cached guest image.
    """

    root: Path
    images_override: Path | None = None

    @classmethod
    def from_env(cls, root: Path | str | None = None) -> DataDir:
        images = os.environ.get("FORKD_IMAGES_DIR")
        return cls(
            Path(root) if root else default_data_dir(), Path(images) if images else None
        )

    @property
    def images(self) -> Path:
        return self.images_override or self.root / "images"

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    @property
    def sandboxes(self) -> Path:
        return self.root / "sandboxes"

    @property
    def registry(self) -> Path:
        return self.root / "forkd.db"

    @property
    def lock(self) -> Path:
        """Shared by every Runtime on this dir, taken alone by offline pack/unpack (store/datalock.py)."""
        return self.root / "forkd.lock"

    @property
    def volumes(self) -> Path:
        """Named volumes (controller/volumes.py): ``<name>/disk.qcow2`` each."""
        return self.root / "volumes"

    @property
    def secrets_key(self) -> Path:
        """The key secrets are sealed under (store/secret_box.py): 0600, never in a snapshot or pack."""
        return self.root / "secrets.key"

    @property
    def travel(self) -> Path:
        """Snapshots on the move (controller/travel.py): imported base images, digests, staging."""
        return self.root / "travel"

    @property
    def host_probe(self) -> Path:
        return self.root / "host-probe.json"

    @property
    def tmp(self) -> Path:
        """The daemon's scratch files (template builds, the accelerator probe's console): under the
        data dir, not /tmp, so a crash leaves them where the next start collects them
        (``clear_tmp``) and nothing of forkd's lingers in the host's shared /tmp."""
        return self.root / "tmp"

    def clear_tmp(self) -> None:
        """Remove what a dead process left in ``tmp`` (only call it with the dir held alone)."""
        if not self.tmp.is_dir():
            return
        for entry in self.tmp.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    @classmethod
    def scratch(cls, prefix: str = "forkd-") -> DataDir:
        """A throwaway data dir (tests, benchmarks, the demo) that shares the real one's image.

        It lives directly under /tmp because QEMU's unix sockets live under it
        (108-byte limit). The accelerator probe result is copied from the real
        data dir: re-probing costs ~20 s on hosts where KVM hangs.
        """
        real = default_data_dir()
        root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        probe = real / "host-probe.json"
        if probe.exists():
            shutil.copy(probe, root / "host-probe.json")
        images = os.environ.get("FORKD_IMAGES_DIR")
        return cls(root, Path(images) if images else real / "images")

    def ensure(self) -> DataDir:
        for path in (self.root, self.images, self.snapshots, self.sandboxes, self.tmp):
            path.mkdir(parents=True, exist_ok=True)
        # Guest memory (a warm parent's secrets), disks, sockets and logs live
        # below these two: private to the daemon's user whatever the umask. The
        # root itself may be shared (e.g. a FORKD_DATA_DIR of /tmp): left alone.
        for path in (self.snapshots, self.sandboxes, self.tmp):
            path.chmod(0o700)
        return self


# The ceiling a host may set on its sandboxes (controller/capacity.py): far past any host, but bounded.
MAX_SANDBOXES_LIMIT = 1_000_000


@dataclass(frozen=True)
class HostLimits:
    """This host's ceilings (``forkd daemon --max-sandboxes``, ``--memory-reserve-mib``); None/0: none."""

    max_sandboxes: int | None = None
    memory_reserve_mib: int = 0

    def __post_init__(self) -> None:
        if self.max_sandboxes is not None and not 1 <= self.max_sandboxes <= MAX_SANDBOXES_LIMIT:
            raise ValueError(f"max_sandboxes must be between 1 and {MAX_SANDBOXES_LIMIT}")
        if not 0 <= self.memory_reserve_mib <= 1 << 30:
            raise ValueError("memory_reserve_mib must be between 0 and 2^30")
