"""``python -m forkd.cli``: the same as the ``forkd`` command."""

from forkd.cli.main import app

app(prog_name="forkd")
