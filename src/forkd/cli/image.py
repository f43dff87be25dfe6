"""``forkd image build|ls``: guest images, built locally (no daemon involved)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from forkd.cli import output
from forkd.cli.context import JsonFlag, handle_errors, want_json
from forkd.config import DEFAULT_IMAGE, DataDir

image_app = typer.Typer(
    name="image",
    help="Build and list guest images (kernel + initramfs + ext4 root filesystem).",
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
        size = recipe.get("size_mib")
        table.add_row(
            output.fmt(image.name),
            output.fmt(image.meta.get("kernel_version")),
            output.fmt([*recipe.get("packages", []), *recipe.get("extra_packages", []),
                        *recipe.get("apt_packages", []), *recipe.get("pip_packages", [])]),
            f"{size} MiB" if size else "-",
            output.fmt_time(image.meta.get("built_at_unix")),
            output.fmt(str(image.dir)),
        )
    output.console.print(table)
