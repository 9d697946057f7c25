"""Log lines of serving processes reach the daemon's handlers as plain, checked data.

A serving process may be taken over by the media it decodes; the daemon (root) must
run nothing it sends, and a forged line must not pass for another.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import pickle
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cutfs.vfs.daemon.log_channel import LogChannel, handler


class _Hostile:
    """Unpickled, it runs ``touch`` on the marker."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.marker}",))


def _honest_child(writer: socket.socket) -> None:
    logging.basicConfig(level=logging.INFO, handlers=[handler(writer)], force=True)
    logging.getLogger("cutfs.serving_process").info("serving process %d serves", 7)
    try:
        raise ValueError("a decode went wrong")
    except ValueError:
        logging.getLogger("cutfs.decode_pool").exception("it failed")


def _hostile_child(writer: socket.socket, marker: str) -> None:
    """What a taken-over serving process could send down its log channel."""
    for datagram in (
        pickle.dumps(_Hostile(marker)),
        pickle.dumps(logging.makeLogRecord({"msg": "a pickled record"})),
        b"",  # the daemon's own end-of-relay, forged
        b"{not json",
        json.dumps({"level": 99, "name": "cutfs", "text": "level out of range"}).encode(),
        json.dumps({"level": True, "name": "cutfs", "text": "a boolean level"}).encode(),
        json.dumps({"level": 20, "name": "cutfs mount: forged", "text": "x"}).encode(),
        json.dumps({"level": 20, "name": "cutfs", "text": ["not", "text"]}).encode(),
    ):
        writer.send(datagram)
    forged = "one line\nERROR cutfs.mount: a line of its own\r\x1b[2Kerased"
    writer.send(json.dumps({"level": 40, "name": "cutfs.x", "text": forged}).encode())


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _relayed() -> Iterator[tuple[LogChannel, _Collect]]:
    collect = _Collect()
    root = logging.getLogger()
    root.addHandler(collect)
    channel = LogChannel()
    channel.start()
    try:
        yield channel, collect
    finally:
        channel.stop()  # relays everything sent before it
        root.removeHandler(collect)


def _run(target: object, *args: object) -> int:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert process.pid is not None
    return process.pid


def test_a_serving_processs_lines_reach_the_daemons_handlers() -> None:
    with _relayed() as (channel, collect):
        pid = _run(_honest_child, channel.writer)
    relayed = [r for r in collect.records if r.process == pid]
    assert [(r.name, r.levelno) for r in relayed] == [
        ("cutfs.serving_process", logging.INFO),
        ("cutfs.decode_pool", logging.ERROR),
    ]
    assert relayed[0].getMessage() == "serving process 7 serves"
    failed = relayed[1].getMessage()
    assert failed.startswith("it failed\n    Traceback (most recent call last):")
    assert "ValueError: a decode went wrong" in failed
    assert channel.refused == 0


def test_what_is_not_a_record_is_dropped_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    with _relayed() as (channel, collect):
        pid = _run(_hostile_child, channel.writer, str(marker))
    assert not marker.exists(), "the daemon ran code a serving process sent"
    assert channel.refused == 8
    relayed = [r for r in collect.records if r.process == pid]
    # The one record that is one, after the refusals (a forged end did not stop the relay),
    # with no line of its own and no control character left.
    assert [r.getMessage() for r in relayed] == [
        "one line\n    ERROR cutfs.mount: a line of its own\ufffd\ufffd[2Kerased"
    ]
    warned = [r.getMessage() for r in collect.records if r.name == "cutfs.log_channel"]
    assert len(warned) == 1 and "not a record" in warned[0] and f"pid {pid}" in warned[0]


@pytest.mark.parametrize("size", [10_000, 200_000])
def test_a_long_line_is_cut_not_lost(size: int) -> None:
    with _relayed() as (channel, collect):
        pid = _run(_long_child, channel.writer, size)
    (relayed,) = [r for r in collect.records if r.process == pid]
    assert relayed.getMessage().startswith("xxxx") and relayed.getMessage().endswith("...")
    assert channel.refused == 0


def _long_child(writer: socket.socket, size: int) -> None:
    logging.basicConfig(level=logging.INFO, handlers=[handler(writer)], force=True)
    logging.getLogger("cutfs").warning("x" * size)
