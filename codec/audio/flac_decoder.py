"""FLAC decoded by libFLAC itself, from a seek point, into a slice of 16-bit samples.

libsndfile (python-soundfile) decodes FLAC with libFLAC too, but copies every block
libFLAC hands it into 16-bit samples one sample at a time, with a bounds check and two
loads through pointers per sample: sampled with ``py-spy --native`` under load, that
copy (``flac_buffer_copy``) took 40 % of a FLAC decode.  libFLAC's own output is one
array of 32-bit integers per channel per block (1152 to 4608 samples as encoders
choose them), which numpy converts in one vectorised step, so the whole cost besides
libFLAC is a Python call per block: a warm 10 s cut of 16 kHz mono (1152-sample blocks)
decoded in 1.92-2.13 ms against 2.17-2.44 through libsndfile (medians of 40 cuts of a
2-hour recording, the two interleaved, two runs).  It also needs no memory file:
libFLAC pulls the bytes through a read callback straight from the blob.

libFLAC is the system's shared library (``libFLAC.so.12``, Debian's ``libflac12``;
FLAC 1.3's ``libFLAC.so.8`` has the same decoder interface), loaded with ctypes; where
there is none, :func:`thread_decoder` says so and the caller decodes through
libsndfile instead.  ctypes calls into libFLAC without the GIL; the callbacks take it.

Nothing a stream says is trusted: every error libFLAC reports (lost sync, a bad frame
header, a CRC mismatch, an unparseable or bad stream) fails the decode, and so does a
frame whose channel count or sample size the stream cannot have, or that does not end
at the byte a seek point of the span says (:class:`FrameBounds`).  libFLAC bounds its
own buffers by the format's largest block (65535 samples per channel).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from cutfs.codec.audio.pcm import Int16Array


class FlacStreamError(ValueError):
    """The bytes are not a FLAC stream that decodes to the frames expected."""


class ByteSource(Protocol):
    """Where a decoder reads its stream: :class:`cutfs.codec.audio.decoder.SpliceReader`."""

    def readinto(self, buffer: Any) -> int: ...

    def tell(self) -> int: ...


@dataclass(frozen=True)
class FrameBounds:
    """Where frames of the stream must end: stream samples (increasing) and, for each,
    the byte of the stream where the frame that ends there ends (the seek index's points
    inside the span, as bytes of the splice).

    libFLAC numbers a frame by its header, but from 1.4 on it decodes silence in place of
    frames that are missing and numbers what follows as if nothing were (1.4.2 without
    a word; later versions report it): checked against the index, frames cut out of a
    stream fail the decode instead of moving every later sample early."""

    samples: list[int]
    byte_offsets: list[int]


#: Names the library goes by (FLAC 1.4, then 1.3), tried in order before asking the linker
#: (``ctypes.util.find_library`` runs ``ldconfig``: 6 ms, against 1.2 for a ``dlopen``).
LIBRARY_NAMES: Final = ("libFLAC.so.12", "libFLAC.so.8")

_READ_CONTINUE: Final = 0
_READ_END_OF_STREAM: Final = 1
_READ_ABORT: Final = 2
_WRITE_CONTINUE: Final = 0
_WRITE_ABORT: Final = 1
_STATE_END_OF_STREAM: Final = 4
_SAMPLE_NUMBER: Final = 1  # FLAC__FRAME_NUMBER_TYPE_SAMPLE_NUMBER
_ERRORS: Final = {
    0: "lost sync (bytes that are not a frame)",
    1: "a bad frame header",
    2: "a frame whose CRC does not match",
    3: "an unparseable stream",
    4: "bad metadata",
    5: "a frame out of bounds",
    6: "a missing frame",
}
_STATES: Final = {
    0: "searching for metadata",
    1: "reading metadata",
    2: "searching for a frame",
    3: "reading a frame",
    4: "at the end of the stream",
    5: "an Ogg error",
    6: "a seek error",
    7: "aborted",
    8: "out of memory",
    9: "not initialised",
}

_ReadCallback = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.c_void_p,
)
_WriteCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p
)
_ErrorCallback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
_TellCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p
)


class _FrameHeader(ctypes.Structure):
    """``FLAC__FrameHeader``, the start of the ``FLAC__Frame`` a write callback gets."""

    _fields_ = (
        ("blocksize", ctypes.c_uint32),
        ("sample_rate", ctypes.c_uint32),
        ("channels", ctypes.c_uint32),
        ("channel_assignment", ctypes.c_int),
        ("bits_per_sample", ctypes.c_uint32),
        ("number_type", ctypes.c_int),
        ("number", ctypes.c_uint64),  # a union of a 32-bit frame and a 64-bit sample number
        ("crc", ctypes.c_uint8),
    )


@functools.cache
def load_library() -> ctypes.CDLL | None:
    """The system's libFLAC with the stream decoder's signatures, or None if there is none.

    Loaded when this module is imported, so that a daemon's first FLAC cut does not wait
    for it."""
    for name in _library_names():
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        _declare(library)
        return library
    return None


def _library_names() -> Iterator[str]:
    yield from LIBRARY_NAMES
    found = ctypes.util.find_library("FLAC")  # only if those are not there: it is slow
    if found:
        yield found


def _declare(library: ctypes.CDLL) -> None:
    decoder = [ctypes.c_void_p]
    library.FLAC__stream_decoder_new.restype = ctypes.c_void_p
    library.FLAC__stream_decoder_new.argtypes = []
    library.FLAC__stream_decoder_delete.restype = None
    library.FLAC__stream_decoder_delete.argtypes = decoder
    library.FLAC__stream_decoder_init_stream.restype = ctypes.c_int
    library.FLAC__stream_decoder_init_stream.argtypes = [
        ctypes.c_void_p,
        _ReadCallback,
        ctypes.c_void_p,  # seek: none (the stream is read forward)
        _TellCallback,
        ctypes.c_void_p,  # length, eof: none
        ctypes.c_void_p,
        _WriteCallback,
        ctypes.c_void_p,  # metadata: none (the recording's plan has what is needed)
        _ErrorCallback,
        ctypes.c_void_p,
    ]
    for name in ("process_single", "finish"):
        function = getattr(library, f"FLAC__stream_decoder_{name}")
        function.restype = ctypes.c_int
        function.argtypes = decoder
    library.FLAC__stream_decoder_get_state.restype = ctypes.c_int
    library.FLAC__stream_decoder_get_state.argtypes = decoder
    library.FLAC__stream_decoder_get_decode_position.restype = ctypes.c_int
    library.FLAC__stream_decoder_get_decode_position.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint64),
    ]


class FlacDecoder:
    """One libFLAC stream decoder, for one thread at a time (see :func:`thread_decoder`).

    :meth:`decode_into` decodes a stream that starts with FLAC metadata and goes on
    with frames from any frame of the original stream (a splice), keeping a range of
    its samples.
    """

    def __init__(self, library: ctypes.CDLL) -> None:
        self._library = library
        handle = library.FLAC__stream_decoder_new()
        if not handle:
            raise MemoryError("libFLAC could not make a decoder")
        self._handle: int = handle
        # Kept as attributes: libFLAC holds the pointers while a stream is open.
        self._read_callback = _ReadCallback(self._on_read)
        self._write_callback = _WriteCallback(self._on_write)
        self._error_callback = _ErrorCallback(self._on_error)
        self._tell_callback = _TellCallback(self._on_tell)
        self._bounds = FrameBounds([], [])
        self._next_bound = 0
        self._decode_position = ctypes.c_uint64()
        self._source: ByteSource | None = None
        self._output: Int16Array = np.zeros((0, 1), dtype=np.int16)
        self._position = 0  # the stream sample the next frame starts at
        self._keep_from = 0  # the stream sample ``_output`` starts at
        self._failure: BaseException | None = None
        self._errors: list[int] = []
        self._views: dict[int, npt.NDArray[np.int32]] = {}

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle:
            self._library.FLAC__stream_decoder_delete(handle)

    def decode_into(
        self,
        source: ByteSource,
        first_sample: int,
        skip_frames: int,
        output: Int16Array,
        bounds: FrameBounds,
    ) -> int:
        """Decode the stream ``source`` reads, whose first frame starts at stream sample
        ``first_sample``, dropping ``skip_frames`` frames, into ``output`` (frames by
        channels, filled from the start); the frames decoded, those dropped included.

        Stops once ``output`` is full, or at the end of the stream (fewer frames: the
        caller decides whether that is an error).  Raises :class:`FlacStreamError` for
        a stream that does not decode, or whose frames do not end where ``bounds`` says,
        and what ``source`` raised, as it was.
        """
        self._source = source
        self._bounds = bounds
        self._next_bound = 0
        self._output = output
        self._position = first_sample
        self._keep_from = first_sample + skip_frames
        self._failure = None
        self._errors.clear()
        library, handle = self._library, self._handle
        status = library.FLAC__stream_decoder_init_stream(
            handle, self._read_callback, None, self._tell_callback, None, None,
            self._write_callback, None, self._error_callback, None,
        )  # fmt: skip
        if status != 0:
            raise FlacStreamError(f"libFLAC would not start a stream (status {status})")
        end = self._keep_from + len(output)
        try:
            while self._position < end:
                progressed = library.FLAC__stream_decoder_process_single(handle)
                self._raise_failure()
                state = library.FLAC__stream_decoder_get_state(handle)
                if state == _STATE_END_OF_STREAM:
                    break
                if not progressed:
                    raise FlacStreamError(f"libFLAC stopped: {_STATES.get(state, state)}")
        finally:
            library.FLAC__stream_decoder_finish(handle)
            # Nothing of this decode is held on to (the source holds views of the
            # store's maps, which cannot be closed while a view is alive).
            self._source = None
            self._output = np.zeros((0, 1), dtype=np.int16)
            self._bounds = FrameBounds([], [])
            self._failure = None
        return self._position - first_sample

    def _raise_failure(self) -> None:
        """What went wrong in the callbacks: what the source raised first, then what
        libFLAC found, then what a frame failed."""
        if self._failure is not None and not isinstance(self._failure, FlacStreamError):
            raise self._failure
        if self._errors:
            found = _ERRORS.get(self._errors[0], f"error {self._errors[0]}")
            raise FlacStreamError(f"libFLAC found {found} near stream sample {self._position}")
        if self._failure is not None:
            raise self._failure

    # The callbacks run inside libFLAC: an exception must not cross back into C (ctypes
    # would print it and return 0, which libFLAC reads as "go on").  Each keeps what went
    # wrong for decode_into, and asks libFLAC to stop.

    def _on_read(self, _decoder: Any, buffer: Any, size: Any, _client: Any) -> int:
        try:
            source = self._source
            wanted = size[0]
            if source is None or wanted <= 0:
                size[0] = 0
                return _READ_ABORT
            got = source.readinto((ctypes.c_ubyte * wanted).from_address(buffer))
            size[0] = got
            return _READ_CONTINUE if got else _READ_END_OF_STREAM
        except BaseException as exc:  # kept, and raised by decode_into
            self._failure = exc
            size[0] = 0
            return _READ_ABORT

    def _on_write(self, _decoder: Any, frame: Any, buffer: Any, _client: Any) -> int:
        try:
            self._take(_FrameHeader.from_address(frame), buffer)
            return _WRITE_CONTINUE
        except BaseException as exc:  # kept, and raised by decode_into
            self._failure = exc
            return _WRITE_ABORT

    def _on_error(self, _decoder: Any, status: int, _client: Any) -> None:
        self._errors.append(status)

    def _on_tell(self, _decoder: Any, position: Any, _client: Any) -> int:
        try:
            position[0] = self._source.tell() if self._source is not None else 0
            return 0  # FLAC__STREAM_DECODER_TELL_STATUS_OK
        except BaseException as exc:  # kept, and raised by decode_into
            self._failure = exc
            return 1  # FLAC__STREAM_DECODER_TELL_STATUS_ERROR

    def _take(self, header: _FrameHeader, buffer: Any) -> None:
        """Keep what ``output`` wants of one decoded block."""
        output = self._output
        block, channels, bits = header.blocksize, header.channels, header.bits_per_sample
        if channels != output.shape[1]:
            raise FlacStreamError(
                f"a frame of {channels} channels in a stream of {output.shape[1]}"
            )
        if not 4 <= bits <= 32:
            raise FlacStreamError(f"a frame of {bits}-bit samples")
        if header.number_type == _SAMPLE_NUMBER and header.number != self._position:
            raise FlacStreamError(
                f"a frame of stream sample {header.number} where {self._position} was next"
            )
        start = self._position
        self._position += block
        self._check_bound(self._position)
        keep_from = max(self._keep_from - start, 0)
        keep_to = min(self._keep_from + len(output) - start, block)
        if keep_to <= keep_from:
            return
        into = output[start + keep_from - self._keep_from : start + keep_to - self._keep_from]
        for channel in range(channels):
            samples = self._block_at(buffer[channel])[keep_from:keep_to]
            # As libsndfile does: the top 16 bits of wider samples, narrower ones scaled up.
            if bits > 16:
                samples = samples >> (bits - 16)
            elif bits < 16:
                samples = samples << (16 - bits)
            into[:, channel] = samples

    def _check_bound(self, frame_end: int) -> None:
        """The frame just decoded, which ends at stream sample ``frame_end``, ends at the
        byte its seek point says, if one says."""
        samples = self._bounds.samples
        bound = self._next_bound
        while bound < len(samples) and samples[bound] < frame_end:
            bound += 1
        self._next_bound = bound
        if bound == len(samples) or samples[bound] != frame_end:
            return
        position = self._decode_position
        if not self._library.FLAC__stream_decoder_get_decode_position(
            self._handle, ctypes.byref(position)
        ):
            raise FlacStreamError("libFLAC could not say where in the stream it was")
        expected = self._bounds.byte_offsets[bound]
        if position.value != expected:
            raise FlacStreamError(
                f"the frames before stream sample {frame_end} end at byte {position.value} "
                f"of the span, where the seek index says {expected}: frames missing, or "
                "the index wrong"
            )

    def _block_at(self, address: int) -> npt.NDArray[np.int32]:
        """libFLAC's output buffer of a channel at ``address``, as an array as long as the
        longest block (only the current block's samples are read).

        libFLAC keeps its buffers from block to block, so the arrays are made once, not
        for each of the 140 blocks of a 10 s cut (1 µs each)."""
        view = self._views.get(address)
        if view is None:
            if len(self._views) >= _MOST_VIEWS:
                self._views.clear()
            array = (ctypes.c_int32 * _MAX_BLOCK_SAMPLES).from_address(address)
            view = self._views[address] = np.frombuffer(memoryview(array), dtype=np.int32)
        return view


#: The longest block the format allows (samples per channel).
_MAX_BLOCK_SAMPLES: Final = 65535
#: Buffers remembered at once (libFLAC has one per channel, at most 8, and moves them
#: only when a longer block comes).
_MOST_VIEWS: Final = 16

_decoders = threading.local()


def thread_decoder() -> FlacDecoder | None:
    """This thread's decoder (made on first use; it goes with the thread), or None when
    the system has no libFLAC."""
    decoder: FlacDecoder | None = getattr(_decoders, "decoder", None)
    if decoder is None:
        library = load_library()
        if library is None:
            return None
        decoder = _decoders.decoder = FlacDecoder(library)
    return decoder


load_library()
