"""``forkd image build|pull|import|ls|rm``: guest images, built or pulled locally (no daemon involved),
and removed through the daemon, which knows what stands on them.

``pull`` and ``import`` convert an OCI/Docker image (forkd.image.oci: skopeo and umoci) into
the local images directory; a daemon pulls the same way for ``POST /v1/images`` and a
Dockerfile's ``FROM REF``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, state, want_json
from forkd.config import DEFAULT_IMAGE, DataDir

image_app = typer.Typer(
    name="image",
    help="Build, pull and list guest images (kernel + initramfs + ext4 root filesystem).",
    no_args_is_help=True,
)

DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", envvar="FORKD_DATA_DIR",
        help="State directory (default ~/.local/share/forkd; images may live in FORKD_IMAGES_DIR).",
    ),
]


def split_csv(values: list[str] | None) -> list[str]:
    """``--packages a,b --packages c`` → ``["a", "b", "c"]``."""
    return [item.strip() for value in values or [] for item in value.split(",") if item.strip()]


def _image_json(image: Any) -> dict[str, Any]:
    return {"name": image.name, "dir": str(image.dir), **image.meta}


@image_app.command("build")
@handle_errors
def build(
    ctx: typer.Context,
    name: Annotated[str, typer.Option("--name", help="Image name.")] = DEFAULT_IMAGE,
    rootfs: Annotated[
        Path | None,
        typer.Option(
            "--rootfs", metavar="DIR_OR_TAR",
            help="Use this directory or tarball as the root filesystem instead of debootstrap.",
        ),
    ] = None,
    packages: Annotated[
        list[str] | None,
        typer.Option(
            "--packages", metavar="PKG,PKG",
            help="Extra Debian packages, comma-separated (repeatable).",
        ),
    ] = None,
    size_mib: Annotated[
        int | None, typer.Option("--size-mib", min=256, help="Root filesystem size in MiB.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if cached.")] = False,
    data_dir: DataDirOpt = None,
    json_: JsonFlag = False,
) -> None:
    """Build (or reuse from cache) a guest image. Runs locally and needs root.

    The first build downloads a Debian kernel and debootstraps a root
    filesystem (about a minute); later builds with the same recipe are instant.

    Examples:
      sudo forkd image build
      sudo forkd image build --name ml --packages python3-pandas,git
      sudo forkd image build --name code-interpreter   # built-in: IPython, pandas, matplotlib, e2b-charts
      sudo forkd image build --name custom --rootfs ./rootfs.tar
    """
    from forkd.image.builder import build_image, recipe_for

    recipe_args: dict[str, Any] = {
        "rootfs_source": str(rootfs) if rootfs is not None else None,
        "extra_packages": tuple(split_csv(packages)),
    }
    if size_mib is not None:
        recipe_args["size_mib"] = size_mib
    recipe = recipe_for(name, **recipe_args)
    data = DataDir.from_env(data_dir)

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=output.err_console,
        transient=True,
    )
    steps: list[str] = []
    with progress:
        task = progress.add_task(f"building image {escape(name)}", total=1.0)

        def on_progress(step: str, fraction: float) -> None:
            steps.append(step)
            progress.update(
                task, completed=max(0.0, min(fraction, 1.0)),
                description=f"{escape(name)}: {escape(step)}",
            )

        image = build_image(data, recipe, force=force, progress=on_progress)

    if want_json(ctx, json_):
        output.emit_json(_image_json(image))
        return
    meta = image.meta
    # The builder reports the single step "cached" when the recipe was unchanged.
    built = "cached" if steps == ["cached"] else f"built in {meta.get('build_secs', '?')} s"
    output.console.print(
        f"[green]image {escape(image.name)} ready[/] ({built}): {escape(str(image.dir))}"
    )
    output.console.print(
        output.details_table({
            "kernel": meta.get("kernel_version"),
            "packages": [*meta.get("recipe", {}).get("packages", []),
                         *meta.get("recipe", {}).get("extra_packages", []),
                         *meta.get("recipe", {}).get("apt_packages", []),
                         *meta.get("recipe", {}).get("pip_packages", [])],
            "built_at_unix": meta.get("built_at_unix"),
        })
    )


def _progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                    console=output.err_console, transient=True)


ProgressFn = Callable[[str, float], None]


def _convert(ctx: typer.Context, label: str, json_: bool, work: Callable[[ProgressFn], Any]) -> None:
    """Run a pull or an import under a progress bar, then say what image it made."""
    steps: list[str] = []
    progress = _progress_bar()
    with progress:
        task = progress.add_task(escape(label), total=1.0)

        def on_progress(step: str, fraction: float) -> None:
            steps.append(step)
            progress.update(task, completed=max(0.0, min(fraction, 1.0)),
                            description=f"{escape(label)}: {escape(step)}")

        image = work(on_progress)
    if want_json(ctx, json_):
        output.emit_json(_image_json(image))
        return
    oci_meta = image.meta.get("oci", {})
    built = "cached" if steps[-1:] == ["cached"] else f"converted in {image.meta.get('build_secs', '?')} s"
    output.console.print(f"[green]image {escape(image.name)} ready[/] ({built}): {escape(str(image.dir))}")
    output.console.print(output.details_table({
        "from": oci_meta.get("ref"), "digest": oci_meta.get("digest"),
        **{k: v for k, v in (oci_meta.get("defaults") or {}).items() if v},
    }))


NameOpt = Annotated[str | None, typer.Option(
    "--name", help="The image's name here (default: from the reference, e.g. python-3.12).")]


@image_app.command("pull")
@handle_errors
def pull(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="registry/name:tag or name@sha256:…; python:3.12 is "
                                       "docker.io/library/python:3.12.")],
    name: NameOpt = None,
    registry_mirror: Annotated[list[str] | None, typer.Option(
        "--registry-mirror", envvar="FORKD_REGISTRY_MIRROR", metavar="REGISTRY=URL",
        help="Pull REGISTRY's images from this mirror (e.g. docker.io=http://127.0.0.1:5000; http: no TLS).",
    )] = None,
    registry_auth: Annotated[Path | None, typer.Option(
        "--registry-auth", envvar="FORKD_REGISTRY_AUTH", metavar="CONFIG_JSON",
        help="Registry credentials in Docker's config.json format.")] = None,
    username: Annotated[str | None, typer.Option("--username", help="Registry user name; the password or "
                                                 "token is read from stdin.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Convert again even if cached.")] = False,
    data_dir: DataDirOpt = None,
    json_: JsonFlag = False,
) -> None:
    """Pull an OCI/Docker image from a registry and convert it to a guest image. Runs locally as root.

    The image's layers are cached by digest: a second pull of the same image
    fetches nothing. The image needs Python 3.11 or newer (the agent runs on it).

    Examples:
      sudo forkd image pull python:3.12-slim
      sudo forkd image pull ghcr.io/org/tool:v1 --name tool --registry-auth ~/.docker/config.json
      echo "$TOKEN" | sudo forkd image pull registry.example.com/app:1 --username ci
      sudo forkd image pull python:3.12 --registry-mirror docker.io=http://127.0.0.1:5000
    """
    import sys

    from forkd.api.settings import parse_mirrors
    from forkd.image import oci
    from forkd.image.oci_build import build_oci_image

    data = DataDir.from_env(data_dir)
    registries = oci.Registries(parse_mirrors(registry_mirror), registry_auth)
    credentials = oci.Credentials(username, sys.stdin.readline().rstrip("\n")) if username else None

    def work(progress: Callable[[str, float], None]) -> Any:
        pulled = oci.pull(data.images, ref, registries, credentials, progress)
        return build_oci_image(data, pulled, name, force=force, progress=progress)

    _convert(ctx, ref, json_, work)


@image_app.command("import")
@handle_errors
def import_(
    ctx: typer.Context,
    source: Annotated[Path, typer.Argument(help="A `docker save` tarball or an OCI layout directory.")],
    name: NameOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Convert again even if cached.")] = False,
    data_dir: DataDirOpt = None,
    json_: JsonFlag = False,
) -> None:
    """Convert a `docker save` tarball or an OCI layout directory (one image) to a guest image.

    Examples:
      docker save python:3.12-slim -o py.tar && sudo forkd image import py.tar --name py312
      sudo forkd image import ./layout --name tool
    """
    from forkd.image import oci
    from forkd.image.oci_build import build_oci_image

    data = DataDir.from_env(data_dir)

    def work(progress: Callable[[str, float], None]) -> Any:
        pulled = oci.import_archive(data.images, source, progress)
        return build_oci_image(data, pulled, name or source.name.rsplit(".", 1)[0], force=force,
                               progress=progress)

    _convert(ctx, str(source), json_, work)


@image_app.command("ls")
@handle_errors
def ls(ctx: typer.Context, data_dir: DataDirOpt = None, json_: JsonFlag = False) -> None:
    """List built guest images.

    Reads the local images directory; no daemon needed.

    Example:
      forkd image ls
    """
    from forkd.image.builder import list_images

    images = list_images(DataDir.from_env(data_dir))
    if want_json(ctx, json_):
        output.emit_json([_image_json(image) for image in images])
        return
    if not images:
        output.console.print("no images built yet; build one with: forkd image build")
        return
    table = Table()
    table.add_column("NAME", style="cyan", no_wrap=True)
    table.add_column("KERNEL")
    table.add_column("PACKAGES")
    table.add_column("SIZE", justify="right")
    table.add_column("BUILT")
    table.add_column("DIR")
    for image in images:
        recipe = image.meta.get("recipe", {})
        size = recipe.get("size_mib") or image.meta.get("size_mib")
        pulled_from = image.meta.get("oci", {}).get("ref")  # a registry's image: where it came from
        table.add_row(
            output.fmt(image.name),
            output.fmt(image.meta.get("kernel_version")),
            output.fmt(f"from {pulled_from}" if pulled_from else
                       [*recipe.get("packages", []), *recipe.get("extra_packages", []),
                        *recipe.get("apt_packages", []), *recipe.get("pip_packages", [])]),
            f"{size} MiB" if size else "-",
            output.fmt_time(image.meta.get("built_at_unix")),
            output.fmt(str(image.dir)),
        )
    output.console.print(table)


@image_app.command("rm")
@handle_errors
def rm(ctx: typer.Context, names: Annotated[list[str], typer.Argument(help="Image name(s) to delete.")],
       json_: JsonFlag = False) -> None:
    """Delete guest image(s) that no snapshot stands on, through the daemon.

    The daemon knows which snapshots stand on an image (their disks' backing
    file is its root filesystem): while any does, the image is kept and the
    error names them; delete those first (forkd rmi TAG --cascade).

    Example:
      forkd image rm busybox-1
    """
    from forkd.sdk.errors import ForkdAPIError

    controller = state(ctx).controller()
    deleted: list[str] = []
    failed: dict[str, str] = {}
    for name in names:
        try:
            controller.delete_image(name)
            deleted.append(name)
        except ForkdAPIError as exc:  # per-image failure; connection errors abort
            failed[name] = str(exc)
            if not want_json(ctx, json_):
                output.error(f"{name}: {exc}")
    if want_json(ctx, json_):
        output.emit_json({"deleted": deleted, "failed": failed})
    else:
        for name in deleted:
            output.console.print(f"deleted image {escape(name)}")
    if failed:
        raise typer.Exit(1)
