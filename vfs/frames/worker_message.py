"""The messages a decoder worker sends the process it decodes for, as plain data.

A worker parses media from other people, so the process reading its pipe
must not trust what comes through it: a worker taken over by a hostile file
(an FFmpeg or libsndfile bug) must gain nothing by what it sends.  Pickle
would hand it the reader's process (unpickling runs code the message names),
and the reader may keep root as its saved id.  So every message is a small
JSON header, checked field by field, and at most one binary payload of
numbers (PCM samples, or the two columns of a seek index):

    4 bytes  length of the header, little-endian
    header   UTF-8 JSON object with a "kind"
    payload  the rest of the message

:func:`encode` writes one message; :func:`decode` reads one back and raises
:class:`BadMessageError` for anything that is not exactly a message a worker
may send, numbers out of range included.  The reader receives with a bound
(:data:`MOST_MESSAGE_BYTES`), so memory is bounded too.  What a message
*says* (samples, a plan) can still be wrong: a worker decodes, and wrong
samples from a hostile one cannot be told apart from right ones.  The
reader's own checks of a plan (:func:`~cutfs.codec.catalogue.recording_table.recording_from_row`)
and of the frames' shape apply as to anything read from a shard.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from cutfs.codec import errors
from cutfs.codec.audio.decoder import DECODE_PHASES, DecodeTrace
from cutfs.codec.audio.pcm import Int16Array
from cutfs.codec.audio.recording import Recording
from cutfs.codec.audio.seek_index import SeekIndex
from cutfs.codec.catalogue.recording_table import recording_from_row, recording_row
from cutfs.codec.errors import CutfsError
from cutfs.codec.trust.limits import MAX_CHANNELS, MAX_FRAMES

#: The longest message a reader accepts: the largest PCM reply that may go through the
#: pipe instead of the shared buffer, or a plan's seek index (a week of audio with a point
#: a second is 10 MB).
MOST_MESSAGE_BYTES: Final = 96 << 20
#: The longest JSON header (a plan's fields, a trace, an error's message).
_MOST_HEADER_BYTES: Final = 1 << 20
#: The longest text a message may carry (an error's message or place, a note).
_MOST_TEXT_CHARS: Final = 8192
#: The most entries of a header's mapping or list (store counters, phases, notes).
_MOST_ENTRIES: Final = 64
#: Counters are non-negative and below this.
_MOST_COUNT: Final = 1 << 62
_LENGTH = struct.Struct("<I")


class BadMessageError(Exception):
    """What a worker sent is not a message it may send (taken over, or out of step)."""


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker opened the library and takes requests."""


@dataclass(frozen=True, slots=True)
class CommandStarted:
    """The worker started a command in this process group
    (see :mod:`cutfs.codec.trust.command_runner`)."""

    group: int


@dataclass(frozen=True, slots=True)
class StartFailed:
    """The worker could not open the library (or become its user), and ends."""

    error: CutfsError


@dataclass(frozen=True, slots=True)
class SharedFrames:
    """A reply's frames are in the worker's shared PCM buffer, with this shape (int16)."""

    shape: tuple[int, int]


#: What a request came back as: frames, frames left in the shared buffer, or a plan.
Answer = Int16Array | SharedFrames | Recording


@dataclass(frozen=True, slots=True)
class Reply:
    """A worker's answer to a request (its result, or the error it raised), with how much
    its store's counters grew meanwhile: one message, one wake-up of the event loop."""

    result: tuple[Answer, DecodeTrace] | CutfsError
    store_grown: dict[str, int]


Message = Ready | CommandStarted | StartFailed | Reply


def encode(message: Message) -> bytes:
    """The bytes of one message (for ``Connection.send_bytes``)."""
    payload = b""
    if isinstance(message, Ready):
        header: dict[str, Any] = {"kind": "ready"}
    elif isinstance(message, CommandStarted):
        header = {"kind": "command_started", "group": message.group}
    elif isinstance(message, StartFailed):
        header = {"kind": "start_failed", "error": _error_fields(message.error)}
    else:
        header = {"kind": "reply", "store_grown": message.store_grown}
        if isinstance(message.result, CutfsError):
            header["error"] = _error_fields(message.result)
        else:
            answer, trace = message.result
            header["trace"] = _trace_fields(trace)
            header["answer"], payload = _answer_fields(answer)
    text = json.dumps(header, separators=(",", ":")).encode()
    return _LENGTH.pack(len(text)) + text + payload


def decode(data: bytes) -> Message:
    """The message ``data`` holds, every field checked; raises :class:`BadMessageError`."""
    try:
        return _decode(memoryview(data))
    except BadMessageError:
        raise
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError, CutfsError) as exc:
        # json's and the checks' own errors: the message is not one a worker sends.
        raise BadMessageError(f"not a worker's message ({type(exc).__name__}: {exc})") from None


def _decode(data: memoryview) -> Message:
    if len(data) < _LENGTH.size:
        raise BadMessageError("a message shorter than its header's length")
    (length,) = _LENGTH.unpack_from(data)
    if length > min(_MOST_HEADER_BYTES, len(data) - _LENGTH.size):
        raise BadMessageError(f"a header of {length} bytes")
    header = json.loads(bytes(data[_LENGTH.size : _LENGTH.size + length]))
    payload = data[_LENGTH.size + length :]
    if not isinstance(header, dict):
        raise BadMessageError("a header that is not an object")
    kind = header.get("kind")
    if kind != "reply" and len(payload):
        raise BadMessageError(f"a {kind!r} message with a payload")
    if kind == "ready":
        return Ready()
    if kind == "command_started":
        return CommandStarted(_whole(header["group"], 1, 1 << 31))
    if kind == "start_failed":
        return StartFailed(_error(header["error"]))
    if kind == "reply":
        grown = _counts(header["store_grown"])
        if "error" in header:
            if len(payload):
                raise BadMessageError("an error with a payload")
            return Reply(_error(header["error"]), grown)
        trace = _trace(header["trace"])
        return Reply((_answer(header["answer"], payload), trace), grown)
    raise BadMessageError(f"a message of kind {kind!r}")


# -- errors -------------------------------------------------------------------------------


def _error_fields(error: CutfsError) -> dict[str, Any]:
    return {"type": type(error).__name__, "message": error.message, "where": error.where}


def _error(fields: Any) -> CutfsError:
    """The error a worker raised, rebuilt as one of cutfs's own classes (by name; an
    unknown name becomes a plain :class:`CutfsError` with the same words)."""
    fields = _mapping(fields)
    where = fields["where"]
    error_class = _error_classes().get(_text(fields["type"]), CutfsError)
    return error_class(_text(fields["message"]), where=None if where is None else _text(where))


def _error_classes() -> dict[str, type[CutfsError]]:
    """cutfs's error classes that a worker's error may be rebuilt as: those of
    :mod:`cutfs.codec.errors` and their subclasses in cutfs's own modules."""
    found: dict[str, type[CutfsError]] = {}
    pending: list[type[CutfsError]] = [errors.CutfsError]
    while pending:
        error_class = pending.pop()
        if error_class.__module__.startswith("cutfs."):
            found.setdefault(error_class.__name__, error_class)
        pending.extend(error_class.__subclasses__())
    return found


# -- traces -------------------------------------------------------------------------------


def _trace_fields(trace: DecodeTrace) -> dict[str, Any]:
    return {
        "decodes": trace.decodes,
        "frames_decoded": trace.frames_decoded,
        "bytes_read": trace.bytes_read,
        "plans_loaded": trace.plans_loaded,
        "profile": trace.profile,
        "phase_seconds": trace.phase_seconds,
        "notes": trace.notes,
    }


def _trace(fields: Any) -> DecodeTrace:
    fields = _mapping(fields)
    phases = _mapping(fields["phase_seconds"])
    notes = fields["notes"]
    if not isinstance(notes, list) or len(notes) > _MOST_ENTRIES:
        raise BadMessageError("a trace's notes are not a short list")
    profile = fields["profile"]
    if not isinstance(profile, bool):
        raise BadMessageError("a trace's profile flag is not a boolean")
    return DecodeTrace(
        decodes=_whole(fields["decodes"]),
        frames_decoded=_whole(fields["frames_decoded"]),
        bytes_read=_whole(fields["bytes_read"]),
        plans_loaded=_whole(fields["plans_loaded"]),
        profile=profile,
        phase_seconds={_phase(name): _seconds(value) for name, value in phases.items()},
        notes=[_text(note) for note in notes],
    )


# -- answers ------------------------------------------------------------------------------


def _answer_fields(answer: Answer) -> tuple[dict[str, Any], bytes]:
    if isinstance(answer, SharedFrames):
        return {"shared_frames": list(answer.shape)}, b""
    if isinstance(answer, Recording):
        row = recording_row(answer, -1, -1, 0, "", 0)
        samples = row.pop("seek_samples")
        offsets = row.pop("seek_byte_offsets")
        columns = np.concatenate([samples, offsets]).astype("<i8", copy=False)
        return {"plan": row, "seek_points": len(samples)}, columns.tobytes()
    frames = np.ascontiguousarray(answer, dtype="<i2")
    if frames.ndim != 2:
        raise ValueError("frames are (frames, channels)")
    return {"frames": list(frames.shape)}, frames.tobytes()


def _answer(fields: Any, payload: memoryview) -> Answer:
    fields = _mapping(fields)
    if "shared_frames" in fields:
        if len(payload):
            raise BadMessageError("shared frames with a payload")
        return SharedFrames(_shape(fields["shared_frames"]))
    if "frames" in fields:
        shape = _shape(fields["frames"])
        if len(payload) != 2 * shape[0] * shape[1]:
            raise BadMessageError(f"{len(payload)} bytes of frames of shape {shape}")
        frames: Int16Array = np.frombuffer(payload, dtype="<i2").astype(np.int16).reshape(shape)
        return frames
    if "plan" in fields:
        return _plan(_mapping(fields["plan"]), _whole(fields["seek_points"], 1), payload)
    raise BadMessageError("an answer that is neither frames nor a plan")


def _plan(row: dict[str, Any], points: int, payload: memoryview) -> Recording:
    """A plan, checked as a row read from a shard is (every number in range), with its
    seek index from the payload (sorted: checked whole, it is one recording's)."""
    if len(payload) != 16 * points:
        raise BadMessageError(f"{len(payload)} bytes for a seek index of {points} points")
    columns = np.frombuffer(payload, dtype="<i8").astype(np.int64)
    seek_index = SeekIndex(columns[:points], columns[points:])
    if "seek_samples" in row or "seek_byte_offsets" in row:
        raise BadMessageError("a plan with its seek index in its header")
    return recording_from_row(row, seek_index)


def _shape(value: Any) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise BadMessageError("a shape that is not (frames, channels)")
    frames, channels = _whole(value[0], 0, MAX_FRAMES), _whole(value[1], 1, MAX_CHANNELS)
    if 2 * math.prod((frames, channels)) > MOST_MESSAGE_BYTES:
        raise BadMessageError(f"frames of shape {(frames, channels)}, more than a reply holds")
    return frames, channels


# -- checked values -----------------------------------------------------------------------


def _mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > _MOST_ENTRIES:
        raise BadMessageError("a field that is not a small object")
    return value


def _counts(value: Any) -> dict[str, int]:
    return {_text(name): _whole(count) for name, count in _mapping(value).items()}


def _whole(value: Any, least: int = 0, most: int = _MOST_COUNT) -> int:
    # bool is an int to Python, not a count to a worker.
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
        raise BadMessageError(f"{value!r} where a whole number in [{least}, {most}] belongs")
    return value


def _seconds(value: Any) -> float:
    if not isinstance(value, float | int) or isinstance(value, bool):
        raise BadMessageError(f"{value!r} where seconds belong")
    if not 0 <= value < 1e9:  # also refuses NaN, which json reads from a worker's NaN
        raise BadMessageError(f"{value!r} seconds")
    return float(value)


def _phase(value: Any) -> str:
    if value not in DECODE_PHASES:
        raise BadMessageError(f"a trace of a phase {value!r}")
    return str(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or len(value) > _MOST_TEXT_CHARS:
        raise BadMessageError("a field that is not a short text")
    return value
