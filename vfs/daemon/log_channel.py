"""Log records from the serving processes to the daemon's handlers, as plain data.

Serving processes log through the daemon (its syslog, file or journal handler).
They decode other people's media and may run as an unprivileged user, while the
daemon keeps root: a process taken over by a media bug must not get code run by
the daemon through its log lines.  :mod:`logging.handlers`' queue pickles records,
and unpickling runs code the message names, so records travel instead as one
JSON datagram each (level, logger name, text) over a Unix datagram socket.  The
daemon checks every field, takes the sender's pid from the kernel (its
credentials, not the record), indents continuation lines and replaces control
characters (a record cannot pass for another), and hands the record to its
handlers.  A datagram that is not a record is dropped, with a warning for the
first and every thousandth.

A process whose log lines are not read for :data:`SEND_TIMEOUT_SECONDS` drops
them rather than stop serving.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import struct
import threading
from typing import Any, Final

log = logging.getLogger("cutfs.log_channel")

#: The longest record a serving process sends (a traceback fits; longer text is cut).
MOST_RECORD_BYTES: Final = 32 << 10
#: How long a serving process waits to hand a record over before it drops it.
SEND_TIMEOUT_SECONDS: Final = 1.0
#: The text of a record is cut to this many characters (its JSON may escape each to 6
#: bytes: it stays below MOST_RECORD_BYTES).
_MOST_TEXT_CHARS: Final = 5000
#: A logger's name (cutfs's own, or a library's such as botocore's).
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
#: Control characters other than tab and newline, shown as U+FFFD.
_CONTROLS = {code: "\ufffd" for code in [*range(0x20), 0x7F] if chr(code) not in "\t\n"}
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_REFUSALS_LOGGED_EVERY: Final = 1000


class LogChannel:
    """The daemon's end: a socket pair whose writing end the serving processes inherit,
    and a thread that hands what they send to the daemon's handlers."""

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._reader.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._thread: threading.Thread | None = None
        self.refused = 0

    @property
    def writer(self) -> socket.socket:
        """The end to give a serving process (:func:`handler` there)."""
        return self._writer

    def start(self) -> None:
        self._thread = threading.Thread(target=self._relay, name="cutfs-log-channel", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Hand on what was sent so far, then stop (the processes have ended)."""
        if self._thread is not None:
            self._writer.send(b"")  # an empty datagram from the daemon itself: the end
            self._thread.join(timeout=5)
            self._thread = None
        self._reader.close()
        self._writer.close()

    def _relay(self) -> None:
        space = socket.CMSG_SPACE(_CREDENTIALS.size)
        while True:
            try:
                data, ancillary, _, _ = self._reader.recvmsg(MOST_RECORD_BYTES, space)
            except OSError:
                return
            pid = _sender(ancillary)
            if not data and pid == os.getpid():
                return  # the daemon's own end of the relay (a process's would be refused)
            record = _record(data, pid)
            if record is None:
                self.refused += 1
                if self.refused % _REFUSALS_LOGGED_EVERY == 1:
                    log.warning(
                        "a serving process (pid %s) sent a log line that is not a record: "
                        "dropped (%d so far)",
                        pid,
                        self.refused,
                    )
                continue
            logging.getLogger(record.name).handle(record)


def handler(writer: socket.socket) -> logging.Handler:
    """A serving process's handler: each record, formatted, as one datagram to the daemon."""
    writer.settimeout(SEND_TIMEOUT_SECONDS)
    return _ChannelHandler(writer)


class _ChannelHandler(logging.Handler):
    def __init__(self, writer: socket.socket) -> None:
        super().__init__()
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        if len(text) > _MOST_TEXT_CHARS:
            text = text[: _MOST_TEXT_CHARS - 3] + "..."
        fields = {"level": record.levelno, "name": record.name, "text": text}
        # The daemon gone or not reading: serving goes on without the line.
        with contextlib.suppress(OSError):
            self._writer.send(json.dumps(fields).encode())


def _sender(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid, _, _ = _CREDENTIALS.unpack(data[: _CREDENTIALS.size])
            return int(pid)
    return None


def _record(data: bytes, pid: int | None) -> logging.LogRecord | None:
    """The record a datagram holds, checked and made safe to print; None if it is not one."""
    try:
        fields: Any = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(fields, dict):
        return None
    level, name, text = fields.get("level"), fields.get("name"), fields.get("text")
    if not (isinstance(level, int) and not isinstance(level, bool) and 0 <= level <= 50):
        return None
    if not (isinstance(name, str) and _NAME.fullmatch(name) and isinstance(text, str)):
        return None
    text = text[:_MOST_TEXT_CHARS].translate(_CONTROLS).replace("\n", "\n    ")
    record = logging.LogRecord(name, level, "", 0, text, None, None)
    record.processName = "cutfs-serving"
    if pid is not None:
        record.process = pid
    return record
