"""The error the filesystem raises for the kernel: an errno value and a message."""

from __future__ import annotations

import os


class FsError(Exception):
    """An error for the kernel, carrying its errno value."""

    def __init__(self, error_number: int, message: str = "") -> None:
        super().__init__(error_number, message or os.strerror(error_number))
        self.errno = error_number
