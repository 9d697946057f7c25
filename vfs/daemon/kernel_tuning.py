"""Optional kernel settings of one FUSE mount, applied through sysfs after mounting.

pyfuse3 cannot pass ``max_read``, ``max_background`` or ``max_readahead`` to the
kernel, but root can change two of them afterwards: the read-ahead of the mount's
backing device (``/sys/class/bdi/MAJ:MIN/read_ahead_kb``) and the number of
background requests the kernel keeps in flight (``max_background`` under
``/sys/fs/fuse/connections/MIN/``, when the fusectl filesystem is mounted there).
Nothing here is required: every setting that cannot be applied is reported with
the reason, and the mount works the same.
"""

from __future__ import annotations

import re


def device_of(mountpoint: str) -> tuple[int, int] | None:
    """The (major, minor) device numbers of a mount, from /proc/self/mountinfo.

    Read from the mount table rather than with ``stat``, which would send a
    request to the FUSE daemon, possibly the caller itself.  The last matching
    line wins: it is the mount on top.
    """
    device = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
            for line in table:
                fields = line.split()
                if len(fields) > 4 and _unescape(fields[4]) == mountpoint:
                    major, minor = fields[2].split(":")
                    device = (int(major), int(minor))
    except (OSError, ValueError):
        return None
    return device


def abort_connection(device: tuple[int, int]) -> bool:
    """Abort the FUSE connection of the mount on ``device`` (see :func:`device_of`), as
    ``echo 1 > /sys/fs/fuse/connections/N/abort`` does: every request waiting ends with
    an error and the mount reads "Transport endpoint is not connected".  Whether it
    could (root, and the fusectl file system mounted where systemd mounts it)."""
    try:
        with open(f"/sys/fs/fuse/connections/{device[1]}/abort", "w") as abort:
            abort.write("1")
    except OSError:
        return False
    return True


def apply(mountpoint: str, read_ahead_kb: int | None, max_background: int | None) -> dict[str, str]:
    """Apply the settings asked for; returns what happened to each, for the statistics."""
    report: dict[str, str] = {}
    if read_ahead_kb is None and max_background is None:
        return report
    device = device_of(mountpoint)
    if device is None:
        return {"error": "the mount is not in /proc/self/mountinfo"}
    major, minor = device
    if read_ahead_kb is not None:
        path = f"/sys/class/bdi/{major}:{minor}/read_ahead_kb"
        report["read_ahead_kb"] = _write(path, read_ahead_kb)
    if max_background is not None:
        path = f"/sys/fs/fuse/connections/{minor}/max_background"
        report["max_background"] = _write(path, max_background)
    return report


def _write(path: str, value: int) -> str:
    try:
        with open(path, "w", encoding="ascii") as setting:
            setting.write(f"{value}\n")
        with open(path, encoding="ascii") as setting:
            return f"set to {setting.read().strip()} ({path})"
    except OSError as exc:
        reason = (
            "not mounted (mount -t fusectl none /sys/fs/fuse/connections)"
            if (exc.errno == 2 and "/fuse/connections/" in path)
            else exc.strerror
        )
        return f"not applied: {reason} ({path})"


def _unescape(field: str) -> str:
    """Undo mountinfo's octal escapes (a space is written as \\040)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)
