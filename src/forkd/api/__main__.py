"""``python -m forkd.api``: the daemon, the same command as ``forkd daemon``.

The command line (options, ``FORKD_*`` variables, help, exit statuses) is
defined once, in :mod:`forkd.api.command`; this module only runs it under its
own name. ``python -m forkd.api --help`` lists the options.
"""

from __future__ import annotations

import sys

from forkd.api.command import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
