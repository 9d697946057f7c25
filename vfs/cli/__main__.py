"""``python -m cutfs.vfs.cli``: the command, made a clean start first.

Python has imported this package from the working directory first when it was started
so: for developers only; the installed ``cutfs`` command is the one to run anywhere else
(see :mod:`cutfs.codec.trust.clean_start`).
"""

from __future__ import annotations

import sys

from cutfs.codec.trust.clean_start import restart_clean

restart_clean("cutfs.vfs.cli", sys.argv[1:])

from cutfs.vfs.cli.command import main  # noqa: E402 - only in a clean start

sys.exit(main())
