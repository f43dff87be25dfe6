"""The ``forkd`` command line (entry point ``forkd.cli.main:app``)."""
