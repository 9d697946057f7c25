"""Decoding of any frame range of a stored recording, from its nearest seek point.

:func:`decode_frames` never decodes from the start of a recording unless the
range begins near it: it starts at the seek point at or before the first
wanted frame minus the codec's pre-roll, places every decoded frame by its
timestamp, and keeps only the wanted range.  The result equals the same range
of a full sequential decode (bit-identical for PCM and FLAC; lossy codecs are
checked against a sequential decode at pack time).

The blob is a :class:`cutfs.codec.storage.blob.Blob`, typically a range of a
memory-mapped shard or of an object behind the piece cache; only the bytes the
demuxer asks for are read, by bounded ranges.

PyAV is imported where it decodes, not with this module: a serving process imports
the library to open its source and says it serves before any decode (the import
takes 0.07-0.16 s here; the process loads it in the background once it serves).
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import soundfile

from cutfs.codec.audio.flac_decoder import FrameBounds, thread_decoder
from cutfs.codec.audio.flac_frame import MAX_HEADER_BYTES, frame_first_sample
from cutfs.codec.audio.float_staging import FLOAT_FORMATS, FloatStaging
from cutfs.codec.audio.pcm import Int16Array, float_to_s16, int_to_s16, packed_to_s16, sample_bytes
from cutfs.codec.audio.recording import DecodeMethod, FrameTiming, Recording, pts_to_frames
from cutfs.codec.audio.seek_index import SeekPoint
from cutfs.codec.errors import CorruptDataError, CutfsError
from cutfs.codec.storage.blob import Blob

_SIGNED_BITS = {"s16": 16, "s16p": 16, "s32": 32, "s32p": 32}
#: The demuxers cutfs lets FFmpeg use (short names; FFmpeg matches any alias).  Media
#: come from other people: a playlist or session demuxer (concat, hls, sdp) named
#: ``x.wav`` would open other files, fetch URLs or bind sockets.
SAFE_DEMUXERS = "wav,w64,flac,mp3,ogg,mov,aac,matroska,asf,wv,aiff,caf,nistsphere"
#: Options for every FFmpeg input: only :data:`SAFE_DEMUXERS`, and no protocol at all,
#: so that no demuxer opens anything besides the bytes it is given.
_SAFE_INPUT: dict[str, str] = {"format_whitelist": SAFE_DEMUXERS, "protocol_whitelist": ""}


#: The phases a profiled trace times (see :class:`DecodeTrace`).
DECODE_PHASES: Final = frozenset({"fetch", "open", "decode", "convert"})


@dataclass
class DecodeTrace:
    """Counts of the work done by decodes, accumulated over the calls given it.

    ``frames_decoded`` counts every frame that came out of the decoder,
    including pre-roll and the frames before the wanted range;
    ``bytes_read`` counts the stored bytes read (header splice included);
    ``plans_loaded`` counts the plans an index found in its cache rather than computed.

    With ``profile`` set, ``phase_seconds`` also accumulates where the time
    went: ``open`` (demuxer set-up and seek), ``decode`` (the decoder),
    ``convert`` (to 16-bit interleaved PCM), and the store's ``fetch``
    (:data:`DECODE_PHASES`).  Without it nothing is timed.
    """

    decodes: int = 0
    frames_decoded: int = 0
    bytes_read: int = 0
    plans_loaded: int = 0
    profile: bool = False
    phase_seconds: dict[str, float] = field(default_factory=dict)
    #: Things the caller should log once, such as audio that disagrees with its manifest.
    notes: list[str] = field(default_factory=list)

    def add_phase(self, phase: str, seconds: float) -> None:
        self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + seconds


def decode_frames(
    blob: Blob,
    recording: Recording,
    first: int,
    end: int,
    trace: DecodeTrace | None = None,
    *,
    arriving: bool = False,
) -> Int16Array:
    """Frames ``[first, end)`` of ``recording`` as int16 of shape (frames, channels).

    ``trace``, when given, accumulates the work done.  ``arriving`` says that the bytes
    are still being fetched: decoding then starts on the first of them rather than
    after the last (FLAC; the other decoders always read as they go).  Raises
    :class:`CorruptDataError` naming the recording when the bytes do not
    decode to the frames promised (truncated or corrupt data).
    """
    import av  # noqa: PLC0415 - see the module's docstring

    if not 0 <= first <= end <= recording.num_frames:
        raise ValueError(f"frame range [{first}, {end}) outside [0, {recording.num_frames})")
    if first == end:
        return np.zeros((0, recording.channels), dtype=np.int16)
    trace = trace if trace is not None else DecodeTrace()
    trace.decodes += 1
    try:
        if recording.method is DecodeMethod.PCM:
            return _pcm_frames(blob, recording, first, end, trace)
        if recording.method is DecodeMethod.SNDFILE:
            return _sndfile_frames(blob, recording, first, end, trace, arriving)
        return _decoded_frames(blob, recording, first, end, trace)
    except CorruptDataError:
        raise
    except (
        av.error.FFmpegError,
        soundfile.LibsndfileError,
        ValueError,
        EOFError,
        IndexError,
        RuntimeError,
    ) as exc:
        raise CorruptDataError(
            f"cannot decode frames [{first}, {end}): {ffmpeg_message(exc)}",
            where=recording.recording_id,
        ) from exc


def open_input(reader: Any, container_format: str | None = None) -> Any:
    """An FFmpeg demuxer over a file object, restricted to :data:`SAFE_DEMUXERS`.

    Raises ``av.error.FFmpegError`` (``ArgumentError`` for a format outside
    the list) like ``av.open``.
    """
    import av  # noqa: PLC0415 - see the module's docstring

    return av.open(reader, mode="r", format=container_format, container_options=_SAFE_INPUT)


def ffmpeg_message(error: Exception) -> str:
    """FFmpeg's words for an error, without PyAV's errno and file-name decoration."""
    text = getattr(error, "strerror", None)
    return str(text) if text else str(error)


def frame_to_s16(frame: Any) -> Int16Array:
    """One decoded PyAV audio frame as int16 of shape (samples, channels)."""
    array = frame.to_ndarray()
    channels = len(frame.layout.channels)
    name = frame.format.name
    if array.dtype.kind == "f":
        converted = float_to_s16(array)
    elif name in _SIGNED_BITS:
        converted = int_to_s16(array, _SIGNED_BITS[name])
    elif name in ("u8", "u8p"):
        converted = ((array.astype(np.int16) - 128) << 8).astype(np.int16)
    else:
        raise CorruptDataError(f"unexpected decoded sample format {name}")
    if frame.format.is_planar:
        return np.ascontiguousarray(converted.T)
    return converted.reshape(-1, channels)


def _pcm_frames(
    blob: Blob, recording: Recording, first: int, end: int, trace: DecodeTrace
) -> Int16Array:
    frame_bytes = sample_bytes(recording.pcm_format) * recording.channels
    start = recording.header_bytes + first * frame_bytes
    stop = recording.header_bytes + end * frame_bytes
    if stop > len(blob):
        raise CorruptDataError(
            f"PCM data ends at byte {len(blob)}, frame {end} needs {stop}",
            where=recording.recording_id,
        )
    started = time.perf_counter() if trace.profile else 0.0
    flat = packed_to_s16(blob.read(start, stop), recording.pcm_format)
    if trace.profile:
        trace.add_phase("convert", time.perf_counter() - started)
    trace.bytes_read += stop - start
    trace.frames_decoded += end - first
    return flat.reshape(-1, recording.channels)


def _sndfile_frames(
    blob: Blob, recording: Recording, first: int, end: int, trace: DecodeTrace, arriving: bool
) -> Int16Array:
    """FLAC from the seek point at or before ``first``: by libFLAC itself where the
    system has it (:mod:`cutfs.codec.audio.flac_decoder`), else through libsndfile.

    The decoder is given the stream's header and then the bytes from that point to the
    one after ``end`` (:func:`sndfile_span`), as if the file had been cut there, and
    decodes them straight through: it never seeks (libFLAC's seek probes frames around
    the file, and python-soundfile seeks again after every read).
    """
    mark = time.perf_counter() if trace.profile else 0.0
    point, stop = sndfile_span(recording, len(blob), first, end)
    if point.sample > first:
        raise CorruptDataError(
            f"the seek index starts at frame {point.sample}, after frame {first}",
            where=recording.recording_id,
        )
    if not 0 <= point.byte_offset < stop <= len(blob):
        raise CorruptDataError(
            f"the seek index puts frames [{first}, {end}) at bytes "
            f"[{point.byte_offset}, {stop}), outside the {len(blob)} bytes stored",
            where=recording.recording_id,
        )
    _check_flac_frame(blob, recording, point)
    header_bytes = min(recording.header_bytes, point.byte_offset)
    flac = thread_decoder()
    if flac is not None:
        # libFLAC pulls the splice from the blob as it goes: bytes at hand and bytes
        # still arriving alike, and no further than the frames it needs.
        frames = np.empty((end - first, recording.channels), dtype=np.int16)
        reader = SpliceReader(blob, header_bytes, point.byte_offset, stop=stop)
        bounds = _frame_bounds(recording, point, stop, header_bytes)
        with _store_errors_of(reader):
            decoded = flac.decode_into(
                reader,
                point.sample + recording.timeline_origin,
                first - point.sample,
                frames,
                bounds,
            )
        spliced_bytes = reader.bytes_read
    else:
        frames, decoded, spliced_bytes = _libsndfile_frames(
            blob, header_bytes, point, stop, first, end, arriving
        )
    if trace.profile:
        _phase(trace, "decode", mark)
    trace.frames_decoded += decoded
    trace.bytes_read += spliced_bytes
    if decoded < end - point.sample:
        raise CorruptDataError(
            f"audio ends at frame {point.sample + decoded}, expected {end}",
            where=recording.recording_id,
        )
    return frames


def _frame_bounds(
    recording: Recording, point: SeekPoint, stop: int, header_bytes: int
) -> FrameBounds:
    """The seek points after ``point`` and up to ``stop``, as stream samples and bytes
    of the splice (see :class:`FrameBounds`): a few dozen for a cut, as many as the
    decode is long otherwise."""
    index = recording.seek_index
    after = index.points_through(point.sample)
    until = index.points_through_byte(stop)
    shift = header_bytes - point.byte_offset
    return FrameBounds(
        [int(sample) + recording.timeline_origin for sample in index.samples[after:until]],
        [int(offset) + shift for offset in index.byte_offsets[after:until]],
    )


def _libsndfile_frames(
    blob: Blob,
    header_bytes: int,
    point: SeekPoint,
    stop: int,
    first: int,
    end: int,
    arriving: bool,
) -> tuple[Int16Array, int, int]:
    """Frames ``[first, end)`` through libsndfile, the frames it decoded (those before
    ``first`` included) and the bytes it was given.

    Bytes at hand go to a memory file that libsndfile reads by plain system calls;
    bytes still ``arriving`` from remote storage, and spans too long for a memory file
    (reads of whole long recordings), are read through :class:`SpliceReader` as they
    come.
    """
    spliced_bytes = header_bytes + stop - point.byte_offset
    with contextlib.ExitStack() as stack:
        if spliced_bytes <= MEMORY_SPLICE_BYTES and not arriving:
            source: Any = stack.enter_context(_memory_splice(blob, header_bytes, point, stop))
        else:
            reader = SpliceReader(blob, header_bytes, point.byte_offset, stop=stop)
            stack.enter_context(_store_errors_of(reader))
            source = reader
        sound = stack.enter_context(_ForwardSoundFile(source, mode="r", closefd=False))
        # The frames before ``first`` are read apart and dropped, so that the result is
        # an array of its own: a view into a longer one would be copied by the block
        # cache (which counts what it holds), a second 320 KB for a 10 s cut.
        skipped = _skip_frames(sound, first - point.sample)
        frames: Int16Array = sound.read(end - first, dtype="int16", always_2d=True)
    return frames, skipped + len(frames), spliced_bytes


def _skip_frames(sound: soundfile.SoundFile, count: int) -> int:
    """Decode and drop the next ``count`` frames, at most :data:`SKIP_CHUNK_FRAMES` at a
    time; how many there were (fewer where the audio ends).

    Seek points are about 0.5 s apart in the indexes cutfs writes, but an index comes
    from a shard, which comes from anyone: one with a single point would have a read at
    hour 35 skip 35 hours, and memory must not grow with that (the time it takes is the
    read deadline's business)."""
    skipped = 0
    while skipped < count:
        chunk = min(count - skipped, SKIP_CHUNK_FRAMES)
        read = len(sound.read(chunk, dtype="int16", always_2d=True))
        skipped += read
        if read < chunk:
            break
    return skipped


#: The most frames dropped by one read before a FLAC decode's first frame (4 s at
#: 16 kHz; a normal skip, at most one seek point's distance, takes one read).
SKIP_CHUNK_FRAMES: Final = 1 << 16


#: The longest splice handed to libsndfile as a memory file (8 minutes of 16 kHz FLAC;
#: a decode through the mount is at most 98 s): longer ones are streamed, so that memory
#: stays bounded whatever range a caller of the library asks for.
MEMORY_SPLICE_BYTES: Final = 16 << 20


#: How far around the bytes it needs a decoder reads, by method: (past the header,
#: before the seek point, past the seek point after the wanted frames).  Measured over the
#: test corpus's codecs, with room: Opus and AAC decoders read up to 19 KiB past the span
#: (their reader's buffer, the packets that fill the decoder's delay); MP4 demuxers up to
#: 52 KiB either side.  FLAC through libsndfile reads exactly its splice.  Fetched with the
#: span, so that none of it is a second request; too little costs a request, never a wrong
#: sample.
DECODER_MARGINS_BYTES: Final = {
    DecodeMethod.SNDFILE: (0, 0, 0),
    DecodeMethod.SPLICE: (0, 0, 32 << 10),
    DecodeMethod.SEEK: (0, 64 << 10, 64 << 10),
}


def decode_spans(
    recording: Recording, blob_bytes: int, first: int, end: int, *, header: bool = True
) -> list[tuple[int, int]]:
    """The byte ranges of a blob that decoding frames ``[first, end)`` reads: the header and
    the span from the seek point before ``first`` (minus pre-roll) to the one after ``end``,
    widened by :data:`DECODER_MARGINS_BYTES`.

    Libraries ask their store for them in one request before decoding (a blob's
    ``prefetch``): the maps are advised MADV_RANDOM (no read-ahead on a fault) and a
    remote store pays a round trip per request.
    """
    if recording.method is DecodeMethod.PCM:
        frame_bytes = sample_bytes(recording.pcm_format) * recording.channels
        data_start = recording.header_bytes
        return [(data_start + first * frame_bytes, data_start + end * frame_bytes)]
    if recording.method is DecodeMethod.SNDFILE:
        point, span_end = sndfile_span(recording, blob_bytes, first, end)
        span_start = point.byte_offset
    else:
        index = recording.seek_index
        span_start = index.point_at_or_before(first - recording.preroll_frames).byte_offset
        after = index.first_point_after(end)
        span_end = after.byte_offset if after is not None else blob_bytes
    past_header, before, past_span = DECODER_MARGINS_BYTES[recording.method]
    span = (max(span_start - before, 0), min(span_end + past_span, blob_bytes))
    if not header:
        return [span]
    return [(0, min(recording.header_bytes + past_header, blob_bytes)), span]


def sndfile_span(
    recording: Recording, blob_bytes: int, first: int, end: int
) -> tuple[SeekPoint, int]:
    """Where a FLAC decode of frames ``[first, end)`` starts (the seek point at or before
    ``first``) and the byte where its span ends (the first seek point after frame
    ``end - 1``, or the end of the blob): the bytes it reads besides the header.  A range
    that ends at a seek point ends its span there."""
    index = recording.seek_index
    after = index.first_point_after(end - 1)
    return index.point_at_or_before(first), blob_bytes if after is None else after.byte_offset


def _check_flac_frame(blob: Blob, recording: Recording, point: SeekPoint) -> None:
    """Refuse a seek point where no FLAC frame of its sample starts: decoding from it
    would serve other samples than the ones asked for."""
    if point.byte_offset < recording.header_bytes:
        return  # the start of the stream: libsndfile reads on from the header
    found = frame_first_sample(blob.read(point.byte_offset, point.byte_offset + MAX_HEADER_BYTES))
    if found != point.sample + recording.timeline_origin:
        raise CorruptDataError(
            f"the seek index says sample {point.sample} starts at byte {point.byte_offset}, "
            + ("where no FLAC frame starts" if found is None else f"where frame {found} starts"),
            where=recording.recording_id,
        )


@contextmanager
def _memory_splice(blob: Blob, header_bytes: int, point: SeekPoint, stop: int) -> Iterator[int]:
    """A memory file (descriptor) of the header and the span, read by libsndfile without
    calling back into Python.

    Each thread keeps its memory file: allocating its pages again for every decode cost
    about 0.15 ms of a 2.5 ms FLAC cut.  What it keeps is at most
    :data:`KEPT_SPLICE_BYTES`; longer splices are let go once decoded.
    """
    kept: _SpliceFile | None = getattr(_splice_files, "file", None)
    if kept is None:
        kept = _splice_files.file = _SpliceFile()
    descriptor = kept.descriptor
    size = header_bytes + stop - point.byte_offset
    try:
        os.ftruncate(descriptor, size)
        at = _write_all(descriptor, blob.read(0, header_bytes), 0)
        _write_all(descriptor, blob.read(point.byte_offset, stop), at)
        os.lseek(descriptor, 0, os.SEEK_SET)
        yield descriptor
    finally:
        if size > KEPT_SPLICE_BYTES:
            os.ftruncate(descriptor, 0)


#: The most of its splice file a thread keeps between decodes (a 10 s cut of 16 kHz mono
#: FLAC is about 270 KB; 48 kHz stereo 24-bit about 2.5 MB).
KEPT_SPLICE_BYTES: Final = 4 << 20


class _SpliceFile:
    """A thread's memory file, closed when the thread ends (decoding threads come and go:
    trio lets idle ones exit)."""

    def __init__(self) -> None:
        self.descriptor = os.memfd_create("cutfs-splice", os.MFD_CLOEXEC)

    def __del__(self) -> None:
        os.close(self.descriptor)


_splice_files = threading.local()


def _write_all(descriptor: int, data: memoryview, at: int) -> int:
    view = data.cast("B")
    while view:
        written = os.pwrite(descriptor, view, at)
        view = view[written:]
        at += written
    return at


class _ForwardSoundFile(soundfile.SoundFile):  # type: ignore[misc]
    """A sound file read forward only: python-soundfile seeks to where each read ended
    when the file says it can seek, which libsndfile answers for FLAC with a search
    over the frames, and which a spliced stream cannot answer at all."""

    def seekable(self) -> bool:
        return False


def _decoded_frames(
    blob: Blob, recording: Recording, first: int, end: int, trace: DecodeTrace
) -> Int16Array:
    profile = trace.profile
    mark = time.perf_counter() if profile else 0.0
    point = recording.seek_index.point_at_or_before(first - recording.preroll_frames)
    output = np.empty((end - first, recording.channels), dtype=np.int16)
    # Float samples are gathered as they come and converted once at the end:
    # per-frame conversion costs more than decoding for small frames (MP3, Opus).
    staging: FloatStaging | None = None
    filled = first  # every frame before this position is in ``output``
    reader = _reader_at(blob, recording, point)
    with (
        _store_errors_of(reader),
        reader,
        open_input(reader, recording.container_format) as container,
        contextlib.closing(_positioned(container, recording, point, trace, reader)) as frames,
    ):
        if recording.method is DecodeMethod.SEEK and point.sample > recording.seek_index.samples[0]:
            timeline_frames = max(point.sample + recording.timeline_origin, 0)
            pts = timeline_frames / (recording.time_base * recording.sample_rate)
            container.seek(int(pts), stream=container.streams.audio[0], backward=True)
        if profile:
            mark = _phase(trace, "open", mark)
        for frame, position, samples in frames:
            if profile:
                mark = _phase(trace, "decode", mark)
            if position + samples <= filled:
                continue
            if position > filled:
                raise CorruptDataError(
                    f"gap in decoded audio: frames [{filled}, {position}) missing",
                    where=recording.recording_id,
                )
            take_from = filled - position
            take = min(samples - take_from, end - filled)
            if filled == first and frame.format.name in FLOAT_FORMATS:
                staging = FloatStaging(end - first, recording.channels, frame.format.name)
            if staging is not None:
                staging.put(frame, take_from, take, filled - first)
            else:
                output[filled - first : filled - first + take] = frame_to_s16(frame)[
                    take_from : take_from + take
                ]
            filled += take
            if profile:
                mark = _phase(trace, "convert", mark)
            if filled >= end:
                if staging is not None:  # float decoders: one conversion for the whole range
                    staging.convert_into(output)
                    if profile:
                        _phase(trace, "convert", mark)
                return output
    raise CorruptDataError(
        f"audio ends at frame {filled}, expected {recording.num_frames}",
        where=recording.recording_id,
    )


def _positioned(
    container: Any,
    recording: Recording,
    point: SeekPoint,
    trace: DecodeTrace,
    reader: SpliceReader,
) -> Generator[tuple[Any, int, int], None, None]:
    """Each frame the container's audio decodes (from where it was left: a seek in
    it may come first), with its position and sample count; the trace counts the frames
    and the bytes read once, when the decode ends (this runs once per frame, 500 times
    for 10 s of Opus: what it does per frame is kept to the least)."""
    absolute = recording.timing is FrameTiming.ABSOLUTE
    scale = recording.pts_scale()
    numerator, denominator = scale
    origin = recording.timeline_origin
    counted = point.sample  # the position of the next frame, for COUNTED timing
    decoded = 0
    try:
        for frame in container.decode(container.streams.audio[0]):
            samples, pts = frame.samples, frame.pts
            if absolute and pts is not None:  # pts_to_frames, inline
                position = (2 * pts * numerator + denominator) // (2 * denominator) - origin
            else:
                position = _frame_position(recording, point, pts, counted, scale)
            counted = position + samples
            decoded += samples
            yield frame, position, samples
    finally:
        trace.frames_decoded += decoded
        trace.bytes_read += reader.bytes_read - reader.bytes_read_reported
        reader.bytes_read_reported = reader.bytes_read


def _phase(trace: DecodeTrace, phase: str, since: float) -> float:
    now = time.perf_counter()
    trace.add_phase(phase, now - since)
    return now


def _frame_position(
    recording: Recording, point: SeekPoint, pts: int | None, counted: int, scale: tuple[int, int]
) -> int:
    if recording.timing is FrameTiming.COUNTED:
        return counted
    if pts is None:
        raise CorruptDataError("decoded frame without timestamp", where=recording.recording_id)
    if recording.timing is FrameTiming.RELATIVE:
        return point.sample + pts_to_frames(pts, *scale)
    return pts_to_frames(pts, *scale) - recording.timeline_origin


@contextmanager
def _store_errors_of(reader: SpliceReader) -> Iterator[None]:
    """Raise what reading the blob raised (a store that timed out, an object that
    changed), rather than what the decoder made of it: libsndfile's read callbacks swallow
    exceptions, and a failed read looks like the end of the data to every decoder."""
    try:
        yield
    except Exception:
        if reader.error is not None:
            raise reader.error from None
        raise
    if reader.error is not None:
        raise reader.error


def _reader_at(blob: Blob, recording: Recording, point: SeekPoint) -> SpliceReader:
    if recording.method is DecodeMethod.SPLICE:
        return SpliceReader(blob, recording.header_bytes, point.byte_offset, seekable=False)
    return SpliceReader(blob, 0, 0)


class SpliceReader(io.RawIOBase):
    """A read-only file of ``blob[:header_bytes] + blob[resume_at:stop]``, without copying
    it (``stop`` defaults to the end of the blob).

    Demuxers get the container header they need to set up the stream, then
    the bytes from a seek point, as if the file had been cut there.  Every read
    is a bounded range of the blob.
    """

    def __init__(
        self,
        blob: Blob,
        header_bytes: int,
        resume_at: int,
        *,
        stop: int | None = None,
        seekable: bool = True,
    ) -> None:
        """A reader that is not ``seekable`` keeps demuxers from probing the end of the file
        (duration, trailing tags): a round trip to remote storage, for nothing."""
        super().__init__()
        self._blob = blob
        self._seekable = seekable
        self._header_bytes = min(header_bytes, resume_at)
        self._resume_at = resume_at
        stop = len(blob) if stop is None else min(max(stop, resume_at), len(blob))
        self._size = self._header_bytes + stop - resume_at
        self._position = 0
        self.bytes_read = 0
        self.bytes_read_reported = 0
        #: The first error reading the blob raised; later reads return nothing at once.
        self.error: CutfsError | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._seekable

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            position = offset
        elif whence == io.SEEK_CUR:
            position = self._position + offset
        elif whence == io.SEEK_END:
            position = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if position < 0:
            raise ValueError("negative seek position")
        self._position = position
        return position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: Any) -> int:
        """Bytes at the position; 0 at the end, and after a read of the blob failed (the
        error is kept in :attr:`error`: decoders do not pass exceptions through)."""
        target = memoryview(buffer).cast("B")
        count = 0
        while count < len(target) and self._position < self._size and self.error is None:
            try:
                source = self._source_at(
                    self._position, min(len(target) - count, self._size - self._position)
                )
            except CutfsError as exc:
                self.error = exc
                break
            if not source:
                break
            chunk = len(source)
            target[count : count + chunk] = source
            count += chunk
            self._position += chunk
        self.bytes_read += count
        return count

    def _source_at(self, position: int, most: int) -> memoryview:
        """At most ``most`` bytes from ``position`` of the spliced file, from one side of
        the splice."""
        if position < self._header_bytes:
            return self._blob.read(position, min(self._header_bytes, position + most))
        at = self._resume_at + position - self._header_bytes
        return self._blob.read(at, at + most)
