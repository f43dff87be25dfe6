"""Image recipes' packages: the built-in code-interpreter recipe, pip pins in the cache keys, and
how pip packages go into a tree (the host's pip, for the tree's python; no VM, no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from forkd.errors import InvalidRequest
from forkd.image import builder, rootfs

MIRROR = "http://deb.example/debian"


def test_code_interpreter_recipe_pins_e2b_charts_and_its_wheels() -> None:
    recipe = builder.recipe_for("code-interpreter", mirror=MIRROR)
    named = builder.NAMED_RECIPES["code-interpreter"]
    assert recipe.apt_packages == named.apt and recipe.pip_packages == named.pip
    recipe.validate()
    pins = dict(pin.split("==") for pin in recipe.pip_packages)
    assert len(pins) == len(recipe.pip_packages)  # one pin a package
    def version(name: str) -> tuple[int, ...]:
        return tuple(int(part) for part in pins[name].split(".")[:2])

    # e2b-charts' own requirements, newer than Debian 12's.
    assert "e2b-charts" in pins and version("matplotlib") >= (3, 10) and version("numpy") >= (2, 2)
    # Debian's data libraries are built against numpy 1.24: the wheels replace them, not shadow them.
    assert not {"python3-matplotlib", "python3-pandas"} & set(recipe.apt_packages)
    kernels = {"python3-ipykernel", "python3-jupyter-client", "nodejs", "r-base-core", "r-cran-irkernel"}
    assert kernels <= set(recipe.apt_packages)
    # A user's tree takes no named packages.
    assert builder.recipe_for("code-interpreter", rootfs_source="/").pip_packages == ()


@pytest.mark.parametrize("pin", ["numpy", "numpy>=2", "numpy==", "-e git+x==1", "numpy==2.3 ; x"])
def test_pip_packages_must_be_exact_pins(pin: str) -> None:
    with pytest.raises(InvalidRequest, match="NAME==VERSION"):
        builder.ImageRecipe(mirror=MIRROR, pip_packages=(pin,)).validate()


def test_pip_pins_are_part_of_the_image_and_tree_keys(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    one = builder.ImageRecipe(mirror=MIRROR, apt_packages=("nodejs",), pip_packages=("numpy==2.3.5",))
    other = builder.ImageRecipe(mirror=MIRROR, apt_packages=("nodejs",), pip_packages=("numpy==2.3.4",))
    assert one.key() != other.key() and one.base_key() == other.base_key()

    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(rootfs, "unpack_user_rootfs", lambda source, target: calls.append(("copy", target)))
    monkeypatch.setattr(rootfs, "install_packages", lambda root, pkgs, log: calls.append(("apt", pkgs)))
    monkeypatch.setattr(rootfs, "install_pip_packages", lambda root, pins, log: calls.append(("pip", pins)))
    trees = {builder._cached_apt_tree(tmp_path, tmp_path / "base", recipe, tmp_path / "log",
                                      lambda step, fraction: None)
             for recipe in (one, other)}
    assert len(trees) == 2 and all(tree.is_dir() for tree in trees)
    assert [c for c in calls if c[0] != "copy"] == [("apt", ["nodejs"]), ("pip", ["numpy==2.3.5"]),
                                                   ("apt", ["nodejs"]), ("pip", ["numpy==2.3.4"])]
    # Cached: a second build of the same recipe installs nothing.
    calls.clear()
    builder._cached_apt_tree(tmp_path, tmp_path / "base", one, tmp_path / "log", lambda step, fraction: None)
    assert calls == []
    # A recipe without pip packages keeps the tree key it had before they existed.
    plain = builder.ImageRecipe(mirror=MIRROR, apt_packages=("nodejs",))
    tree = builder._cached_apt_tree(tmp_path, tmp_path / "base", plain, tmp_path / "log",
                                    lambda step, fraction: None)
    assert tree.name == "rootfs-" + builder.digest_of({"base": plain.base_key(), "apt": ["nodejs"]})[:16]
    assert not [c for c in calls if c[0] == "pip"]


def test_install_pip_packages_fetches_wheels_for_the_trees_python(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "lib" / "python3.11").mkdir(parents=True)
    (root / "usr" / "lib" / "python3.11" / "os.py").write_text("")
    (root / "tmp").mkdir()
    site = root / "usr/local/lib/python3.11/dist-packages"
    site.mkdir(parents=True)
    (site / "numpy").mkdir()
    (site / "numpy" / "old.py").write_text("")  # an older install of a package: replaced whole
    runs: list[list[str]] = []

    def fake_run(args: list[str], what: str, log: Path | None = None) -> None:
        runs.append(args)
        if "pip" in args:  # what pip --target leaves: packages, and scripts naming the host's python
            target = Path(args[args.index("--target") + 1])
            for rel in ("numpy/__init__.py", "e2b_charts/__init__.py", "bin/f2py"):
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                (target / rel).write_text("")

    monkeypatch.setattr(rootfs, "_run", fake_run)
    monkeypatch.setattr(rootfs, "_guest_platform", lambda root, log: ("x86_64", (2, 36)))
    monkeypatch.setattr(rootfs.prereqs, "require_root", lambda why: None)
    rootfs.install_pip_packages(root, ["numpy==2.3.5", "e2b-charts==1.0.0"], tmp_path / "log")

    pip, compile_ = runs
    assert pip[1:4] == ["-m", "pip", "install"] and pip[-2:] == ["numpy==2.3.5", "e2b-charts==1.0.0"]
    for flag in ("--no-deps", "--only-binary=:all:", "--python-version=3.11", "--implementation=cp",
                 "--platform=manylinux_2_17_x86_64", "--platform=manylinux_2_36_x86_64",
                 "--platform=manylinux2014_x86_64"):
        assert flag in pip
    assert sorted(p.name for p in site.iterdir()) == ["e2b_charts", "numpy"]
    assert not (site / "numpy" / "old.py").exists()
    assert list((root / "tmp").iterdir()) == []  # pip's staging folder is gone
    assert compile_ == ["chroot", str(root), "python3", "-m", "compileall", "-q", "-j0",
                        "/usr/local/lib/python3.11/dist-packages"]
    rootfs.install_pip_packages(root, [], tmp_path / "log")  # nothing to install: nothing run
    assert len(runs) == 2
