"""The plain messages of decoder workers: what a reader accepts, and what it refuses.

A worker may be taken over by the media it parses; whatever it sends must come
back as one of its messages with every field in range, or as BadMessageError.
(The end-to-end case, a real worker's pipe, is in test_trust.py.)
"""

from __future__ import annotations

import contextlib
import json
import pickle
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutfs.codec.audio.decoder import DecodeTrace
from cutfs.codec.audio.recording import Recording
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.errors import CorruptDataError, CutfsError, ManifestMismatchError
from cutfs.codec.storage.object_service import ObjectChangedError
from cutfs.vfs.frames.decode_pool import DecodeDeadlineError
from cutfs.vfs.frames.worker_message import (
    BadMessageError,
    CommandStarted,
    Ready,
    Reply,
    SharedFrames,
    StartFailed,
    decode,
    encode,
)


def _header(fields: dict[str, Any], payload: bytes = b"") -> bytes:
    text = json.dumps(fields).encode()
    return struct.pack("<I", len(text)) + text + payload


def _trace() -> DecodeTrace:
    trace = DecodeTrace(decodes=2, frames_decoded=40960, bytes_read=12345, profile=True)
    trace.add_phase("decode", 0.0021)
    trace.notes.append("recording 'a': the manifest declares 10 frames, the audio has 12")
    return trace


def test_frames_come_back_with_their_trace_and_store_counts() -> None:
    frames = np.arange(-3000, 3000, dtype=np.int16).reshape(3000, 2)
    message = decode(encode(Reply((frames, _trace()), {"reads": 3, "requests": 1})))
    assert isinstance(message, Reply) and not isinstance(message.result, CutfsError)
    answer, trace = message.result
    assert isinstance(answer, np.ndarray) and answer.dtype == np.int16
    assert np.array_equal(answer, frames)
    assert trace == _trace()
    assert message.store_grown == {"reads": 3, "requests": 1}


def test_a_plan_comes_back_as_the_shard_holds_it(shard_dir: str) -> None:
    with ShardSet(shard_dir) as library:
        plans = [library.index(index) for index in range(len(library.recording_ids))]
    for plan in plans:
        message = decode(encode(Reply((plan, DecodeTrace()), {})))
        assert isinstance(message, Reply) and not isinstance(message.result, CutfsError)
        back = message.result[0]
        assert isinstance(back, Recording)
        for field in Recording.__slots__:
            if field != "seek_index":
                assert getattr(back, field) == getattr(plan, field), field
        assert np.array_equal(back.seek_index.samples, plan.seek_index.samples)
        assert np.array_equal(back.seek_index.byte_offsets, plan.seek_index.byte_offsets)


@pytest.mark.parametrize(
    "error",
    [
        CorruptDataError("bad frame", where="rec-1"),
        ManifestMismatchError("rate differs", where=None),
        ObjectChangedError("the object changed", where="s3://b/k"),
        DecodeDeadlineError("took longer", where="rec-2"),
    ],
)
def test_errors_come_back_as_the_same_class_with_the_same_words(error: CutfsError) -> None:
    for message in (Reply(error, {}), StartFailed(error)):
        back = decode(encode(message))
        result = back.result if isinstance(back, Reply) else back.error  # type: ignore[union-attr]
        assert type(result) is type(error)
        assert (result.message, result.where) == (error.message, error.where)


def test_an_error_class_that_is_not_cutfss_becomes_a_plain_cutfs_error() -> None:
    fields = {"type": "SystemExit", "message": "x", "where": None}
    back = decode(_header({"kind": "reply", "store_grown": {}, "error": fields}))
    assert isinstance(back, Reply) and type(back.result) is CutfsError


def test_small_messages_come_back() -> None:
    assert decode(encode(Ready())) == Ready()
    assert decode(encode(CommandStarted(4242))) == CommandStarted(4242)
    shared = Reply((SharedFrames((160000, 2)), DecodeTrace()), {})
    assert decode(encode(shared)) == shared


def test_a_pickle_is_refused() -> None:
    for payload in (pickle.dumps(Ready()), pickle.dumps({"kind": "ready"})):
        with pytest.raises(BadMessageError):
            decode(payload)


_TRACE = {
    "decodes": 1,
    "frames_decoded": 1,
    "bytes_read": 1,
    "plans_loaded": 0,
    "profile": False,
    "phase_seconds": {},
    "notes": [],
}


@pytest.mark.parametrize(
    ("fields", "payload"),
    [
        ({"kind": "ready", "extra": 1}, b"x"),  # a payload where none belongs
        ({"kind": "command_started", "group": 0}, b""),  # no process group 0
        ({"kind": "command_started", "group": True}, b""),  # a boolean is not a number
        ({"kind": "command_started", "group": -5}, b""),
        ({"kind": "shutdown"}, b""),
        ({"kind": "reply", "store_grown": {"reads": -1}, "error": None}, b""),
        ({"kind": "reply", "store_grown": {}, "trace": _TRACE, "answer": {"frames": [2, 1]}}, b""),
        (
            {"kind": "reply", "store_grown": {}, "trace": _TRACE, "answer": {"frames": [1, 0]}},
            b"",
        ),  # no channels
        (
            {"kind": "reply", "store_grown": {}, "trace": _TRACE, "answer": {"frames": [1, 257]}},
            b"\0" * 514,
        ),  # more channels than any recording has
        (
            {
                "kind": "reply",
                "store_grown": {},
                "trace": {**_TRACE, "phase_seconds": {"anything": 1.0}},
                "answer": {"shared_frames": [1, 1]},
            },
            b"",
        ),  # a phase that is not timed: would add a histogram per message
        (
            {
                "kind": "reply",
                "store_grown": {},
                "trace": {**_TRACE, "phase_seconds": {"decode": float("nan")}},
                "answer": {"shared_frames": [1, 1]},
            },
            b"",
        ),
        (
            {
                "kind": "reply",
                "store_grown": {str(n): 1 for n in range(65)},
                "trace": _TRACE,
                "answer": {"shared_frames": [1, 1]},
            },
            b"",
        ),
        (
            {
                "kind": "reply",
                "store_grown": {},
                "trace": _TRACE,
                "answer": {"shared_frames": [1 << 40, 256]},
            },
            b"",
        ),  # more than a reply holds
        (
            {"kind": "reply", "store_grown": {}, "trace": _TRACE, "answer": {"plan": {}}},
            b"",
        ),
    ],
)
def test_fields_out_of_range_are_refused(fields: dict[str, Any], payload: bytes) -> None:
    with pytest.raises(BadMessageError):
        decode(_header(fields, payload))


def test_a_plan_out_of_range_is_refused(shard_dir: str) -> None:
    with ShardSet(shard_dir) as library:
        plan = library.index(0)
    data = encode(Reply((plan, DecodeTrace()), {}))
    (length,) = struct.unpack_from("<I", data)
    header = json.loads(data[4 : 4 + length])
    payload = data[4 + length :]
    for field, value in (
        ("sample_rate", 0),
        ("channels", 100_000),
        ("num_frames", -1),
        ("header_bytes", 1 << 62),
        ("method", "exec"),
        ("time_base_denominator", "1"),
    ):
        bad = {**header, "answer": {**header["answer"], "plan": {**header["answer"]["plan"]}}}
        bad["answer"]["plan"][field] = value
        with pytest.raises(BadMessageError):
            decode(_header(bad, payload))
    unsorted = np.frombuffer(payload, dtype="<i8").copy()
    points = header["answer"]["seek_points"]
    if points > 1:
        unsorted[:points] = unsorted[:points][::-1]
        with pytest.raises(BadMessageError):
            decode(_header(header, unsorted.tobytes()))
    with pytest.raises(BadMessageError):
        decode(_header(header, payload[:-8]))  # the payload cut short


_MESSAGES = (Ready, CommandStarted, StartFailed, Reply)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_any_bytes_are_a_message_or_refused(data: bytes) -> None:
    with contextlib.suppress(BadMessageError):
        assert isinstance(decode(data), _MESSAGES)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_message_changed_anywhere_is_a_message_or_refused(data: st.DataObject) -> None:
    frames = np.arange(64, dtype=np.int16).reshape(32, 2)
    original = bytearray(encode(Reply((frames, _trace()), {"reads": 3})))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(original) - 1))
        original[position] = data.draw(st.integers(0, 255))
    with contextlib.suppress(BadMessageError):
        assert isinstance(decode(bytes(original)), _MESSAGES)
