"""The Dockerfile parser (controller/dockerfile.py), the layer cache key and build contexts."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from forkd import bounds
from forkd.api.e2b.template_steps import StepPlan
from forkd.controller.build_contexts import BuildContexts
from forkd.controller.dockerfile import Copy, Run, parse, step_canonical
from forkd.controller.template_build import layer_tag, step_key
from forkd.errors import InvalidRequest, NotFound, TooLarge
from forkd.image.oci import ImageDefaults
from tests.fakes.app import AUTH, Daemon, daemon_app, guest_image


def test_steps_carry_the_env_workdir_and_user_in_effect() -> None:
    plan = parse("""\
ARG BASE=default
FROM forkd/${BASE}
ARG V=1
ENV A="a b" PATH=/opt/bin:$PATH
RUN echo $A && \\
    echo hi
WORKDIR /app
WORKDIR sub
USER user
COPY --chown=user:user --chmod=755 src/ ./lib/
RUN ["ls", "-l"]
ENV B=$A-$V
CMD ["python"]
""", {"V": "2"})
    assert plan.base == "default"
    run, copy, run2 = plan.steps
    assert isinstance(run, Run) and isinstance(copy, Copy) and isinstance(run2, Run)
    assert run.argv == ("/bin/sh", "-c", "echo $A &&     echo hi")
    path = "/opt/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the guest's PATH
    assert dict(run.env) == {"A": "a b", "PATH": path, "V": "2"}
    assert run.workdir == "/" and run.user is None
    assert copy.sources == ("src",) and copy.dest == "/app/sub/lib/"
    assert copy.chown == "user:user" and copy.chmod == "755"
    assert run2.argv == ("ls", "-l") and run2.workdir == "/app/sub" and run2.user == "user"
    assert plan.env == {"A": "a b", "PATH": path, "B": "a b-2"}  # ARG is build-time only
    assert plan.workdir == "/app/sub" and plan.user == "user"
    assert any("CMD is skipped" in w for w in plan.warnings)


def test_copy_destination_rules() -> None:
    steps = parse("FROM default\nCOPY a /x\nCOPY a b /y\nCOPY ../../etc/passwd /z/\n").steps
    assert [(s.sources, s.dest) for s in steps if isinstance(s, Copy)] == [
        (("a",), "/x"), (("a", "b"), "/y/"), (("etc/passwd",), "/z/")]  # cannot climb out


@pytest.mark.parametrize("text, message", [
    ("RUN true", "before FROM"),
    ("FROM default\nFROM default", "multi-stage"),
    ("FROM Debian:12", "not an image reference"),
    ("FROM debian:12:13", "not an image reference"),
    ("FROM default\nRUN --mount=type=cache,target=/x true", "--mount"),
    ("FROM default\nCOPY --from=build /a /b", "--from"),
    ("FROM default\nCOPY *.py /app/", "wildcards"),
    ("FROM default\nADD https://example.com/x /x", "URL"),
    ("FROM default\nSHELL [\"/bin/bash\", \"-c\"]", "SHELL is not supported"),
    ("FROM default\nRUN <<EOF\necho\nEOF", "heredocs"),
    ("FROM default\nUSER 'bad name'", "invalid user"),
    ("", "no FROM"),
])
def test_unsupported_is_refused_with_its_line(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        parse(text)


def test_bounds() -> None:
    with pytest.raises(InvalidRequest, match="bytes"):
        parse("FROM default\n" + "#" * bounds.MAX_DOCKERFILE_BYTES)
    with pytest.raises(InvalidRequest, match="instructions"):
        parse("FROM default\n" + "RUN true\n" * bounds.MAX_TEMPLATE_STEPS)
    with pytest.raises(InvalidRequest, match="build arg"):
        parse("FROM default", {"bad-name": "x"})


def test_the_cache_key_chains_parent_step_and_files() -> None:
    a, b = parse("FROM default\nRUN a\nRUN b\n").steps
    base = "0" * 64
    k1 = step_key(base, a)
    assert k1 == step_key(base, a)  # stable
    assert step_key(k1, b) != step_key(step_key("1" * 64, a), b)  # a parent's change reaches children
    assert step_key(base, a, "f1") != step_key(base, a, "f2")  # COPY: the files' digest
    # ENV changes the environment the next RUN sees, so its key; a trailing ENV changes no key.
    env_a, = parse("FROM default\nENV X=1\nRUN a\n").steps
    env_b, = parse("FROM default\nENV X=2\nRUN a\nENV Y=3\n").steps
    assert step_canonical(env_a) != step_canonical(env_b)
    assert step_canonical(a) == step_canonical(parse("FROM default\nRUN a\nENV Y=3\n").steps[0])
    assert layer_tag(k1) == "layer-" + k1[:20] and bounds.TAG_RE.match(layer_tag(k1))


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _tar(files: dict[str, bytes], extra: tarfile.TarInfo | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra is not None:
            tar.addfile(extra)
    return buf.getvalue()


def test_contexts_select_and_digest(tmp_path: Path) -> None:
    store = BuildContexts(tmp_path / "ctx")
    digest = asyncio.run(store.put(_one(_tar({"app/a.py": b"a", "app/b/c.txt": b"c", "other": b"o"}))))
    assert store.path(digest).is_file()
    d1 = store.select(digest, ("app",), tmp_path / "s1.tar")
    with tarfile.open(tmp_path / "s1.tar") as sub:
        assert sorted(sub.getnames()) == ["app/a.py", "app/b/c.txt"]
    changed = asyncio.run(store.put(_one(_tar({"app/a.py": b"A", "app/b/c.txt": b"c", "other": b"o"}))))
    assert store.select(changed, ("app",), tmp_path / "s2.tar") != d1  # content is in the key
    other = asyncio.run(store.put(_one(_tar({"app/a.py": b"a", "app/b/c.txt": b"c", "other": b"X"}))))
    assert store.select(other, ("app",), tmp_path / "s3.tar") == d1  # files it does not copy are not
    with pytest.raises(InvalidRequest, match="not in the build context"):
        store.select(digest, ("missing",), tmp_path / "s4.tar")
    with pytest.raises(NotFound):
        store.path("f" * 64)
    with pytest.raises(InvalidRequest):
        store.path("../etc")


def test_contexts_refuse_escapes_devices_and_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = BuildContexts(tmp_path / "ctx")
    with pytest.raises(InvalidRequest, match="leaves the context"):
        asyncio.run(store.put(_one(_tar({"../x": b"1"}))))
    dev = tarfile.TarInfo("dev")
    dev.type = tarfile.CHRTYPE
    with pytest.raises(InvalidRequest, match="only files"):
        asyncio.run(store.put(_one(_tar({}, dev))))
    with pytest.raises(InvalidRequest, match="not a tar"):
        asyncio.run(store.put(_one(b"not a tar" * 100)))
    empty = asyncio.run(store.put(_one(b"")))  # an empty context: a build that copies nothing
    assert store.path(empty).stat().st_size == 0
    with pytest.raises(InvalidRequest, match="is empty"):
        store.select(empty, ("a",), tmp_path / "none.tar")
    monkeypatch.setattr(bounds, "MAX_BUILD_CONTEXT_BYTES", 100)
    with pytest.raises(TooLarge):
        asyncio.run(store.put(_one(_tar({"a": b"x" * 200}))))
    assert [p.name for p in (tmp_path / "ctx").iterdir()] == [f"{empty}.tar"]  # nothing half-written


# ------------------------------------------------------------------ the routes, on the real runtime


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, Daemon]]:
    with daemon_app(tmp_path, headers=AUTH, snapshots=(), max_body_bytes=4096) as daemon:
        yield daemon.client, daemon


def test_the_routes_upload_a_context_and_stream_a_build(client: tuple[TestClient, Daemon]) -> None:
    c, daemon = client
    tar = _tar({"app/a.py": b"x" * 10_000})  # over max_body_bytes: the upload streams past it
    resp = c.put("/v1/templates/contexts", content=tar, headers={"Content-Type": "application/x-tar"})
    assert resp.status_code == 200, resp.text
    digest = resp.json()["context"]
    body = {"tag": "web", "context": digest, "dockerfile": "FROM default\nCOPY app /app\nRUN true\nENV A=1"}
    lines = [json.loads(line) for line in c.post("/v1/templates", json=body).iter_lines() if line]
    # The plan, each step (the base's, then the two of the file; with their logs), then the end.
    assert [e["type"] for e in lines if e["type"] != "log"] == ["plan", "step", "step", "step", "done"]
    assert [e["text"] for e in lines if e["type"] == "step"] == ["FROM default", "COPY app /app", "RUN true"]
    assert lines[-1]["env"] == {"A": "1"} and "web" in {s.tag for s in daemon.runtime.list_snapshots()}
    again = [json.loads(line) for line in c.post("/v1/templates", json={**body, "replace": True}).iter_lines()
             if line]
    assert again[-1]["cache_hits"] == 2


def test_the_routes_refuse_up_front(client: tuple[TestClient, Daemon]) -> None:
    c, daemon = client
    daemon.snapshot("web")
    bad = c.post("/v1/templates", json={"tag": "x", "dockerfile": "FROM default\nSHELL [\"a\"]"})
    assert bad.status_code == 400 and "line 2" in bad.json()["error"]
    taken = c.post("/v1/templates", json={"tag": "web", "dockerfile": "FROM default"})
    assert taken.status_code == 409, taken.text
    unknown = c.post("/v1/templates", json={"tag": "x", "dockerfile": "FROM default", "squash": True})
    assert unknown.status_code == 400


def test_the_guest_path_matches_the_agent() -> None:
    from forkd.controller.dockerfile import GUEST_PATH
    from forkd.guest.agent.setup import DEFAULT_PATH

    assert GUEST_PATH == DEFAULT_PATH


def test_from_a_snapshot() -> None:
    assert parse("FROM snapshot:py\nRUN true").base == "snapshot:py"
    # A registry's image: pulled by the build (controller/images.py), planned again from its config.
    assert parse("FROM debian:12").base == "registry:debian:12"
    assert parse("FROM forkd/default").base == "default"
    image = ImageDefaults(env={"PATH": "/usr/local/bin:/usr/bin", "LANG": "C.UTF-8"}, workdir="/srv",
                          user="user")
    plan = parse("FROM python:3.12\nENV A=$PATH\nRUN true", image=image)
    assert plan.env == {"PATH": "/usr/local/bin:/usr/bin", "LANG": "C.UTF-8", "A": "/usr/local/bin:/usr/bin"}
    assert (plan.workdir, plan.user, plan.steps[0].workdir) == ("/srv", "user", "/srv")
    with pytest.raises(InvalidRequest, match="forkd image name"):
        parse("FROM snapshot:../x")


# ------------------------------------------------------------------ E2B's steps as a Dockerfile

def test_e2b_steps_become_a_dockerfile_forkd_parses(tmp_path: Path) -> None:
    from forkd.api.e2b.template_steps import TemplateError, plan, registry_credentials

    files_hash = "a" * 64
    upload = tmp_path / "up.tar"
    upload.write_bytes(_tar({"folder/a.txt": b"a", "folder/b.txt": b"b", "folder/sub/c.txt": b"c"}))
    files = {files_hash: upload}

    def dockerfile(body: dict[str, Any]) -> StepPlan:
        return plan(body, files, lambda tag: tag == "parent")

    steps = dockerfile({"fromImage": "e2bdev/base:latest", "steps": [
        {"type": "COPY", "args": ["folder/*", "folder", "user", "0755"], "filesHash": files_hash},
        {"type": "ENV", "args": ["A", 'x "y" $z', "B", "2"]},
        {"type": "RUN", "args": ["apt-get update && echo 'hi'", "root"]},
        {"type": "WORKDIR", "args": ["/app"]},
        {"type": "RUN", "args": ["pwd"]},
    ]})
    parsed = parse(steps.dockerfile)
    assert parsed.base == "default" and steps.uploads == [files_hash]
    copy, root_run, run = parsed.steps
    assert isinstance(copy, Copy) and copy.sources == ("folder/a.txt", "folder/b.txt", "folder/sub")
    assert copy.dest == "/home/user/folder/" and copy.chown == "user" and copy.chmod == "0755"
    assert isinstance(root_run, Run) and root_run.user is None and root_run.workdir == "/home/user"
    assert root_run.argv == ("/bin/bash", "-c", "apt-get update && echo 'hi'")
    assert isinstance(run, Run) and run.user == "user" and run.workdir == "/app"
    assert parsed.env == {"A": 'x "y" $z', "B": "2"}
    assert steps.step_names == {1: "1", 2: "3", 3: "5"}  # each RUN/COPY's E2B step number
    # A registry's image (from_image, from_dockerfile's FROM): the build pulls it, with the credentials
    # of from_registry.
    assert dockerfile({"fromImage": "ubuntu:22.04"}).dockerfile.startswith("FROM ubuntu:22.04\n")
    assert dockerfile({"fromTemplate": "parent"}).dockerfile.startswith("FROM snapshot:parent\n")
    registry = {"type": "registry", "username": "u", "password": "p"}
    creds = registry_credentials({"fromImageRegistry": registry})
    assert creds is not None and (creds.username, creds.password) == ("u", "p")
    with pytest.raises(TemplateError, match="only type"):
        registry_credentials({"fromImageRegistry": {"type": "gcp", "serviceAccountJson": "{}"}})
    for user, password in (("", "p"), ("u", None), ("u\0", "p"), ("u" * 257, "p"), ("u", "p" * 4097)):
        with pytest.raises(TemplateError, match="needs a username and a password"):
            bad_registry = {**registry, "username": user, "password": password}
            registry_credentials({"fromImageRegistry": bad_registry})
    for bad, message in [({"fromImage": "Ubuntu:22.04"}, "not an image reference"),
                         ({"steps": [{"type": "ARG", "args": []}]}, "not supported"),
                         ({"steps": [{"type": "COPY", "args": ["x", "/x"], "filesHash": "b" * 64}]},
                          "not uploaded"),
                         ({"steps": [{"type": "ENV", "args": ["A", "two\nlines"]}]}, "line break"),
                         ({"fromTemplate": "gone"}, "was not found")]:
        with pytest.raises(TemplateError, match=message):
            dockerfile(bad)


def test_the_image_routes_stream_a_pull_and_refuse_a_bad_reference(client: tuple[TestClient, Daemon]) -> None:
    """POST /v1/images: its up-front 400s, and a pull that fails once streaming ends in an error
    event (here: the docker.io mirror is a closed port). A pull that succeeds, against a real
    registry, is tests/integration/test_oci_images.py's."""
    from forkd.image.oci import Registries

    c, daemon = client
    daemon.runtime.images.registries = Registries(mirrors={"docker.io": "http://127.0.0.1:9"})
    body = {"ref": "python:3.12-slim", "name": "py312", "registry_auth": {"username": "u", "password": "p"}}
    lines = [json.loads(line) for line in c.post("/v1/images", json=body).iter_lines() if line]
    assert lines[0] == {"type": "progress", "step": "resolving python:3.12-slim", "fraction": 0.0}
    assert lines[-1]["type"] == "error" and "127.0.0.1:9" in lines[-1]["error"], lines
    assert isinstance(c.get("/v1/images").json(), list)
    bad = c.post("/v1/images", json={"ref": "UPPER:case:x"})
    assert bad.status_code == 400 and "not an image reference" in bad.json()["error"]
    no_password = c.post("/v1/images", json={"ref": "python:3", "registry_auth": {"username": "u"}})
    assert no_password.status_code == 400


def test_an_image_is_deleted_only_when_no_snapshot_stands_on_it(client: tuple[TestClient, Daemon]) -> None:
    """DELETE /v1/images/{name}: 409 naming the snapshots whose disks stand on it (a template and
    what inherits its image), 204 once none does, then 404; the image's directory is gone."""
    c, daemon = client
    daemon.snapshot("py")
    images = daemon.runtime.data.images
    guest_image(images, "spare")
    assert {"default", "spare"} <= {i["name"] for i in c.get("/v1/images").json()}
    refused = c.delete("/v1/images/default")
    assert refused.status_code == 409 and "snapshot(s) py" in refused.json()["error"], refused.json()
    assert (images / "default" / "image.json").exists()

    assert c.delete("/v1/images/spare").status_code == 204
    assert "spare" not in {i["name"] for i in c.get("/v1/images").json()}
    assert not (images / "spare").exists() and not list(images.glob(".spare*"))
    gone = c.delete("/v1/images/spare")
    assert gone.status_code == 404 and gone.json()["error"]
    assert c.delete("/v1/images/..%2Fetc").status_code in (400, 404)

    assert c.delete("/v1/snapshots/py", params={"cascade": "true", "force": "true"}).status_code in (200, 204)
    assert c.delete("/v1/images/default").status_code == 204


def test_an_image_in_a_shared_images_directory_is_not_deleted(tmp_path: Path) -> None:
    """With FORKD_IMAGES_DIR, other daemons may boot from the same images, and their snapshots are
    not this daemon's to see: it refuses to delete any (409 saying why)."""
    import asyncio

    from forkd.config import DataDir
    from forkd.controller.images import OciImages
    from forkd.errors import Conflict
    from tests.fakes.app import guest_image

    shared = tmp_path / "shared-images"
    guest_image(shared, "spare")
    images = OciImages(DataDir(tmp_path / "data", shared), lambda _name: [])
    with pytest.raises(Conflict, match=r"is shared \(FORKD_IMAGES_DIR\)"):
        asyncio.run(images.remove("spare"))
    assert (shared / "spare" / "image.json").exists()
