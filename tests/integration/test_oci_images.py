"""OCI/Docker images pulled from a real registry on loopback (docker-registry), pushed there by
skopeo from images made here, and applied onto a tree by umoci (forkd.image.oci).

Host CPU only, no VM: the layers' semantics, the cache, credentials and mirrors, and the
hostile layers that must be refused with nothing written outside the work dir.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from forkd.config import DataDir
from forkd.errors import ForkdError, ImageError, InvalidRequest, TooLarge
from forkd.image import oci, oci_layers
from forkd.image.oci_build import build_oci_image

from .oci_material import (
    Registry,
    add_layer,
    entry,
    file,
    new_layout,
    outside_untouched,
    registry,
    set_config,
    write_tar,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="umoci applies owners and setuid bits as root")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


def mirror(reg: Registry) -> oci.Registries:
    return oci.Registries(mirrors={"docker.io": f"http://{reg.host}"})


def layered(work: Path) -> Path:
    """Two layers: the second whites out a file, makes a dir opaque, adds a setuid file, a hard
    link to it, an absolute symlink and an xattr."""
    layout = new_layout(work / "layered")
    add_layer(layout, write_tar(work / "l1.tar", [
        entry("etc", tarfile.DIRTYPE), file("etc/gone", b"old"), file("etc/kept", b"kept"),
        entry("d", tarfile.DIRTYPE), file("d/old1", b"1"), file("d/old2", b"2"),
    ]))
    add_layer(layout, write_tar(work / "l2.tar", [
        file("etc/.wh.gone"), entry("d", tarfile.DIRTYPE), file("d/.wh..wh..opq"), file("d/new", b"n"),
        entry("usr", tarfile.DIRTYPE), entry("usr/bin", tarfile.DIRTYPE),
        file("usr/bin/tool", b"#!/bin/sh\n", mode=0o4755),
        entry("usr/bin/tool-link", tarfile.LNKTYPE, link="usr/bin/tool"),
        entry("etc/host-link", tarfile.SYMTYPE, link="/etc/kept"),
        file("etc/owned", b"x", uid=1000), _with_xattr(file("etc/xattr", b"x")),
    ]))
    set_config(layout, "--config.env=GREETING=hello world", "--config.env=PATH=/usr/local/bin:/usr/bin:/bin",
               "--config.workingdir=/srv/app", "--config.user=1000", "--config.entrypoint=/usr/bin/tool",
               "--config.cmd=serve")
    return layout


def _with_xattr(member: tuple[tarfile.TarInfo, bytes]) -> tuple[tarfile.TarInfo, bytes]:
    member[0].pax_headers = {"SCHILY.xattr.user.forkd": "kept"}
    return member


def test_layers_apply_in_order_and_a_second_pull_fetches_nothing(plain: Registry, tmp_path: Path) -> None:
    plain.push(layered(tmp_path), "t", "forkd-test/layered:1")
    images = tmp_path / "images"
    steps: list[str] = []
    # A Hub short name, sent to the loopback registry by the mirror setting.
    pulled = oci.pull(images, "forkd-test/layered:1", mirror(plain), progress=lambda s, _f: steps.append(s))
    assert pulled.ref == "docker.io/forkd-test/layered:1"
    assert steps == ["pulling docker.io/forkd-test/layered:1"]
    tree = tmp_path / "tree"
    oci_layers.unpack(pulled, tree)
    assert not (tree / "etc/gone").exists() and (tree / "etc/kept").read_text() == "kept"  # whiteout
    assert sorted(os.listdir(tree / "d")) == ["new"]  # the opaque dir hides the lower layer's files
    tool = (tree / "usr/bin/tool").stat()
    assert stat.S_IMODE(tool.st_mode) == 0o4755 and tool.st_uid == 0  # setuid kept
    assert (tree / "usr/bin/tool-link").stat().st_ino == tool.st_ino  # a hard link, not a copy
    assert os.readlink(tree / "etc/host-link") == "/etc/kept"  # absolute: resolved in the guest, kept
    assert (tree / "etc/owned").stat().st_uid == 1000
    assert os.getxattr(tree / "etc/xattr", "user.forkd") == b"kept"
    defaults = pulled.defaults
    assert defaults.env["GREETING"] == "hello world" and defaults.workdir == "/srv/app"
    assert (defaults.user, defaults.entrypoint, defaults.cmd) == ("1000", ["/usr/bin/tool"], ["serve"])

    # The same image again, by tag and by digest: nothing is copied, the same cached image answers.
    steps.clear()
    again = oci.pull(images, "docker.io/forkd-test/layered:1", mirror(plain),
                     progress=lambda s, _f: steps.append(s))
    by_digest = oci.pull(images, f"forkd-test/layered@{pulled.digest}", mirror(plain))
    assert steps == ["cached"] and again.digest == by_digest.digest == pulled.digest


def test_short_names_and_references() -> None:
    parse = oci.ImageRef.parse
    assert str(parse("python:3.12")) == "docker.io/library/python:3.12"
    assert str(parse("python")) == "docker.io/library/python:latest"
    assert str(parse("someone/tool")) == "docker.io/someone/tool:latest"
    assert str(parse("ghcr.io/org/img:v1")) == "ghcr.io/org/img:v1"
    assert str(parse("localhost:5000/img")) == "localhost:5000/img:latest"
    digest = "sha256:" + "a" * 64
    assert str(parse(f"busybox@{digest}")) == f"docker.io/library/busybox@{digest}"
    for bad in ("UPPER/case", "a b", "x:" + "y" * 200, "../etc", ""):
        with pytest.raises(InvalidRequest):
            parse(bad)


def test_private_registry_takes_credentials_per_request_and_from_an_auth_file(tmp_path: Path) -> None:
    with registry(tmp_path / "reg", user="forkd", password="s3cret-pw") as reg:
        layout = new_layout(tmp_path / "small")
        add_layer(layout, write_tar(tmp_path / "s.tar", [entry("etc", tarfile.DIRTYPE), file("etc/x", b"x")]))
        reg.push(layout, "t", "private/small:1")
        ref = f"{reg.host}/private/small:1"
        insecure = oci.Registries(mirrors={reg.host: f"http://{reg.host}"})  # plain http, this host only
        with pytest.raises(ImageError, match=r"(?i)unauthorized|authentication"):
            oci.pull(tmp_path / "images", ref, insecure)
        pulled = oci.pull(tmp_path / "images", ref, insecure, oci.Credentials("forkd", "s3cret-pw"))
        authfile = tmp_path / "config.json"  # Docker's format, as `docker login` writes it
        authfile.write_text(json.dumps({"auths": {reg.host: {"auth": "Zm9ya2Q6czNjcmV0LXB3"}}}))
        from_file = oci.pull(tmp_path / "images2", ref,
                             oci.Registries(mirrors=insecure.mirrors, authfile=authfile))
        assert pulled.digest == from_file.digest


def _hostile(work: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    layout = new_layout(work / "hostile")
    add_layer(layout, write_tar(work / "h.tar", members))
    return layout


@pytest.mark.parametrize("case", ["dotdot", "absolute", "device", "hardlink-out", "through-symlink"])
def test_a_hostile_layer_is_refused_and_writes_nothing_outside(plain: Registry, tmp_path: Path,
                                                               case: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    members = {
        "dotdot": [file("../../outside/pwned", b"x")],
        "absolute": [file(f"{outside}/pwned", b"x")],
        "device": [entry("dev", tarfile.DIRTYPE), entry("dev/mem", tarfile.CHRTYPE, mode=0o666)],
        "hardlink-out": [entry("shadow", tarfile.LNKTYPE, link="../../../etc/shadow")],
        "through-symlink": [entry("evil", tarfile.SYMTYPE, link=str(outside)), file("evil/pwned", b"x")],
    }[case]
    work = tmp_path / "work"
    work.mkdir()
    plain.push(_hostile(tmp_path, members), "t", f"forkd-test/hostile-{case}:1")
    pulled = oci.pull(work / "images", f"forkd-test/hostile-{case}:1", mirror(plain))
    with pytest.raises(InvalidRequest, match=r"outside the root|device node|goes through the symlink"):
        oci_layers.unpack(pulled, work / "tree")
    assert not (work / "tree").exists()
    assert outside_untouched(outside) == []


def test_a_symlink_of_a_lower_layer_cannot_lead_a_later_one_out(plain: Registry, tmp_path: Path) -> None:
    """Across layers the symlink is umoci's to resolve: inside the tree, never on the host."""
    outside = tmp_path / "outside"
    outside.mkdir()
    layout = new_layout(tmp_path / "cross")
    add_layer(layout, write_tar(tmp_path / "a.tar", [entry("evil", tarfile.SYMTYPE, link=str(outside))]))
    add_layer(layout, write_tar(tmp_path / "b.tar", [entry("evil", tarfile.DIRTYPE),
                                                     file("evil/pwned", b"x")]))
    plain.push(layout, "t", "forkd-test/cross:1")
    pulled = oci.pull(tmp_path / "images", "forkd-test/cross:1", mirror(plain))
    tree = tmp_path / "tree"
    with contextlib.suppress(ForkdError):  # refused is as good as confined
        oci_layers.unpack(pulled, tree)
    assert outside_untouched(outside) == []


def test_a_layer_bigger_than_declared_or_than_the_limit_is_refused(plain: Registry, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    layout = _hostile(tmp_path, [file("big", b"\0" * (1 << 20))])
    # The manifest says the layer is 10 bytes: a registry or archive that lies about a size.
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"].split(":")[1]).read_bytes())
    manifest["layers"][0]["size"] = 10
    raw = json.dumps(manifest).encode()
    digest = hashlib.sha256(raw).hexdigest()
    (blobs / digest).write_bytes(raw)
    index["manifests"][0].update(digest=f"sha256:{digest}", size=len(raw))
    (layout / "index.json").write_text(json.dumps(index))
    work = tmp_path / "work"
    with pytest.raises(ForkdError, match=r"not the 10 its manifest declares|size"):
        oci_layers.unpack(oci.import_archive(work / "images", layout), work / "tree")
    assert not (work / "tree").exists()

    # A tar bomb: more bytes unpacked than the limit, refused before umoci writes any of them.
    monkeypatch.setattr(oci_layers, "MAX_UNPACKED_BYTES", 1 << 19)
    (tmp_path / "bomb").mkdir()
    bomb = _hostile(tmp_path / "bomb", [file("big", b"\0" * (1 << 20))])
    pulled = oci.import_archive(work / "images", bomb)
    with pytest.raises(TooLarge, match=r"unpacks to over"):
        oci_layers.unpack(pulled, work / "tree")
    assert not (work / "tree").exists()


def test_an_image_without_python_is_refused_with_why(plain: Registry, tmp_path: Path) -> None:
    layout = _hostile(tmp_path, [entry("bin", tarfile.DIRTYPE), file("bin/sh", b"", mode=0o755)])
    images = DataDir(tmp_path / "data", tmp_path / "images")
    kernel_cache = Path(os.environ.get("FORKD_IMAGES_DIR") or DataDir.from_env().images) / ".cache"
    (images.images / ".cache").mkdir(parents=True)
    for k in kernel_cache.glob("kernel-*"):
        (images.images / ".cache" / k.name).symlink_to(k)
    pulled = oci.import_archive(images.images, layout)
    with pytest.raises(InvalidRequest, match=r"has no python3.*images without one are not supported"):
        build_oci_image(images, pulled, "nopython")
    assert [p.name for p in images.images.iterdir()] == [".cache"]  # no half-built image left
