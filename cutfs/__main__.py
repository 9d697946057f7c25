"""The ``cutfs`` command (and ``python -m cutfs``), started clean.

Before anything else is imported, the process makes itself a clean start (see
:mod:`cutfs.codec.trust.clean_start`): an isolated interpreter, running from ``/`` with a minimal
environment, so that an administrator who runs ``cutfs`` from a directory a user can write
runs none of that user's files, in this process or in any process it starts.
"""

from __future__ import annotations

import sys

from cutfs.codec.trust.clean_start import restart_clean


def main() -> int:
    restart_clean("cutfs.vfs.cli", sys.argv[1:])
    from cutfs.vfs.cli.command import main as command  # noqa: PLC0415 - only in a clean start

    return command()


if __name__ == "__main__":
    sys.exit(main())
