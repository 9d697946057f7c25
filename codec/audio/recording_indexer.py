"""Pack-time analysis of one recording: exact length, seek index, and a checked plan.

:func:`index_recording` decodes the recording once from its start, which
gives the exact number of frames of the full decode and, packet by packet,
the byte offsets where decoding can resume.  It then decodes a few windows
through :func:`cutfs.codec.audio.decoder.decode_frames`, from the seek index, and
compares them with the same windows of the sequential decode.  A recording
that fails the comparison (AAC with perceptual noise substitution, an
irregular stream) or whose container cutfs cannot seek in is transcoded to
FLAC from the sequential decode, so the served samples are the full decode's
for every recording that is packed.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Final

import numpy as np

from cutfs.codec.audio.decoder import (
    SpliceReader,
    decode_frames,
    ffmpeg_message,
    frame_to_s16,
    open_input,
)
from cutfs.codec.audio.pcm import Int16Array
from cutfs.codec.audio.recording import DecodeMethod, FrameTiming, Recording
from cutfs.codec.audio.riff import parse_riff_wave
from cutfs.codec.audio.seek_index import SeekIndex
from cutfs.codec.errors import CorruptDataError, UnsupportedAudioError
from cutfs.codec.storage.blob import Blob
from cutfs.codec.trust.limits import check_shape

#: Container formats cutfs decodes by splicing, and how it knows where a
#: decoded frame belongs (codecs in _COUNTED_CODECS excepted).
_SPLICE_FORMATS: Final[dict[str, FrameTiming]] = {
    "flac": FrameTiming.ABSOLUTE,
    "ogg": FrameTiming.ABSOLUTE,
    "mp3": FrameTiming.RELATIVE,
    "aac": FrameTiming.RELATIVE,
}
#: Codecs whose frames are placed by counting, with the number of packets a
#: decoder consumes after a splice before it produces output.
_COUNTED_CODECS: Final[dict[str, int]] = {"vorbis": 1}
_SEEK_FORMATS: Final[dict[str, str]] = {"mov,mp4,m4a,3gp,3g2,mj2": "mp4"}
#: Formats whose header must be kept in front of a splice; raw MP3 and ADTS
#: are resumed without it, so that no start-of-file trimming is applied twice.
_KEEPS_HEADER: Final[frozenset[str]] = frozenset({"flac", "ogg"})
_LOSSLESS_CODECS: Final[frozenset[str]] = frozenset({"flac", "alac", "wavpack", "tta", "ape"})
#: Decoding starts this many seconds (at least ``frames``) before the wanted
#: range, so that the decoder's state (MP3 bit reservoir, overlap-add,
#: Opus's predictors) has converged when the wanted frames come out.  Opus's
#: converges onto the sequential decode's exactly, CELT's band energies within
#: 0.36-0.74 s (their error halves every 20 ms frame; measured from 60 starts in
#: a 20-minute file): a second makes every window the full decode, bit for bit,
#: where half a second left 1 window in 22 a sample off.
_PREROLL: Final[dict[str, tuple[float, int]]] = {
    "mp3float": (0.25, 4608),
    "mp3": (0.25, 4608),
    "vorbis": (0.25, 8192),
    "opus": (1.0, 0),
    "aac": (0.1, 4096),
}
#: What FLAC may add to 16-bit PCM (headers, seek table, frame headers), generously.
_FLAC_FRAMING_BYTES: Final = 1 << 20
#: The seek index keeps a point about this often.
SEEK_INTERVAL_SECONDS: Final = 0.5
#: No seek point among the last packets of a stream.
_TAIL_PACKETS: Final = 16
#: How many windows of the sequential decode are compared with decodes from
#: the seek index, and how long they are.  AAC gets more, shorter windows:
#: noise substitution, which makes decoding after a seek differ, may appear
#: in some frames only.
_CHECK_WINDOWS: Final[dict[str, tuple[int, float]]] = {"aac": (64, 0.25)}
_DEFAULT_CHECK_WINDOWS: Final = (16, 0.5)


@dataclass
class IndexedRecording:
    """The result for one recording: its plan, and what to store for it.

    ``stored_path`` is ``None`` when the original bytes are stored unchanged,
    or the path of a FLAC file written into the work directory when the
    recording had to be transcoded.
    """

    recording: Recording
    stored_path: str | None = None
    notes: list[str] = field(default_factory=list)


def index_recording(
    blob: memoryview, recording_id: str, workdir: str, max_transcode_bytes: int | None = None
) -> IndexedRecording:
    """Analyse the encoded bytes of one recording (see the module docstring).

    Raises :class:`UnsupportedAudioError` when the bytes hold no decodable
    audio stream, or when transcoding would need more than
    ``max_transcode_bytes`` (reckoned as 16-bit PCM, which FLAC never exceeds
    by more than its framing), and :class:`CorruptDataError` when decoding
    fails part way.
    """
    indexed = _index(blob, recording_id, workdir, max_transcode_bytes)
    recording = indexed.recording
    check_shape(
        recording.sample_rate,
        recording.channels,
        recording.num_frames,
        where=recording_id,
        error=UnsupportedAudioError,
    )
    return indexed


def _index(
    blob: memoryview, recording_id: str, workdir: str, max_transcode_bytes: int | None
) -> IndexedRecording:
    wave = parse_riff_wave(blob)
    if wave is not None:
        recording = Recording(
            recording_id=recording_id,
            sample_rate=wave.sample_rate,
            channels=wave.channels,
            num_frames=wave.num_frames,
            method=DecodeMethod.PCM,
            container_format="wav",
            codec_name=f"pcm_{wave.sample_format}",
            seek_index=SeekIndex.from_points([0], [wave.data_offset_bytes]),
            header_bytes=wave.data_offset_bytes,
            pcm_format=wave.sample_format,
        )
        return IndexedRecording(recording)
    scan = _scan(blob, recording_id)
    plan = scan.recording()
    if plan is not None and plan.codec_name == "flac" and plan.container_format == "flac":
        with_sndfile = replace(plan, method=DecodeMethod.SNDFILE)
        if _seeks_match(blob, with_sndfile, scan):
            return IndexedRecording(with_sndfile)
    if plan is not None and _seeks_match(blob, plan, scan):
        return IndexedRecording(plan)
    reason = scan.unsupported_reason or "decoding after a seek does not match a full decode"
    needed = scan.num_frames * scan.channels * 2 + _FLAC_FRAMING_BYTES
    if max_transcode_bytes is not None and needed > max_transcode_bytes:
        raise UnsupportedAudioError(
            f"must be transcoded to FLAC ({reason}), which needs up to {needed} bytes of "
            f"cache; the index cache quota leaves {max(max_transcode_bytes, 0)} "
            "(--index-cache-size)",
            where=recording_id,
        )
    flac_path = _transcode_to_flac(blob, recording_id, workdir)
    with open(flac_path, "rb") as flac_file:
        flac_bytes = memoryview(flac_file.read())
    flac_scan = _scan(flac_bytes, recording_id)
    flac_plan = flac_scan.recording()
    if flac_plan is None or flac_plan.num_frames != scan.num_frames:
        raise CorruptDataError("transcoding to FLAC changed the length", where=recording_id)
    flac_plan = replace(flac_plan, transcoded_from=scan.codec_name)
    return IndexedRecording(flac_plan, flac_path, [f"transcoded to FLAC: {reason}"])


@dataclass
class _Scan:
    """What one sequential decode learned about a stream."""

    recording_id: str
    container_format: str = ""
    codec_name: str = ""
    sample_rate: int = 0
    channels: int = 0
    time_base: Fraction = Fraction(0)
    num_frames: int = 0
    timeline_origin: int | None = None
    header_bytes: int = 0
    packet_points: list[tuple[int, int]] = field(default_factory=list)  # (timeline frames, byte)
    counted_points: list[tuple[int, int]] = field(default_factory=list)  # (position, byte)
    recent_offsets: deque[int] = field(default_factory=lambda: deque(maxlen=_TAIL_PACKETS))
    pending_packets: int = 0  # packets to go before the pending counted point starts
    pending_offset: int = -1
    check_windows: dict[int, Int16Array] = field(default_factory=dict)
    unsupported_reason: str = ""

    def recording(self) -> Recording | None:
        """The decoding plan, or ``None`` when the stream cannot be served in place."""
        if self.unsupported_reason or self.timeline_origin is None:
            return None
        method, short_format = self._method()
        if method is None:
            return None
        origin = self.timeline_origin
        timing = _SPLICE_FORMATS.get(short_format, FrameTiming.ABSOLUTE)
        if self.codec_name in _COUNTED_CODECS:
            timing = FrameTiming.COUNTED
            points = self.counted_points
        else:
            points = [(timeline - origin, byte) for timeline, byte in self.packet_points]
        # A demuxer started on the last few packets may never gain sync (FLAC's
        # parser wants several frame headers), so the end is reached from before.
        tail = self.recent_offsets[0] if self.recent_offsets else 0
        points = points[:1] + [point for point in points[1:] if point[1] < tail]
        samples, offsets = _thin_points(points, round(SEEK_INTERVAL_SECONDS * self.sample_rate))
        seconds, minimum = _PREROLL.get(self.codec_name, (0.0, 0))
        return Recording(
            recording_id=self.recording_id,
            sample_rate=self.sample_rate,
            channels=self.channels,
            num_frames=self.num_frames,
            method=method,
            container_format=short_format,
            codec_name=self.codec_name,
            seek_index=SeekIndex.from_points(samples, offsets),
            header_bytes=self.header_bytes if short_format in _KEEPS_HEADER else 0,
            timing=timing,
            timeline_origin=origin,
            time_base=self.time_base,
            preroll_frames=max(round(seconds * self.sample_rate), minimum),
        )

    def _method(self) -> tuple[DecodeMethod | None, str]:
        if self.container_format in _SPLICE_FORMATS:
            return DecodeMethod.SPLICE, self.container_format
        if self.container_format in _SEEK_FORMATS:
            return DecodeMethod.SEEK, _SEEK_FORMATS[self.container_format]
        self.unsupported_reason = f"no seek support for the {self.container_format} container"
        return None, self.container_format


def _scan(blob: memoryview, recording_id: str) -> _Scan:
    import av  # noqa: PLC0415 - as in cutfs.codec.audio.decoder

    scan = _Scan(recording_id)
    try:
        container = open_input(_reader(blob))
    except av.error.FFmpegError as exc:
        raise UnsupportedAudioError(
            f"not a readable audio file ({ffmpeg_message(exc)})", where=recording_id
        ) from exc
    with container:
        if not container.streams.audio:
            raise UnsupportedAudioError("no audio stream", where=recording_id)
        stream = container.streams.audio[0]
        scan.container_format = container.format.name
        scan.codec_name = stream.codec_context.name
        scan.time_base = Fraction(stream.time_base) if stream.time_base else Fraction(0)
        count, seconds = _CHECK_WINDOWS.get(scan.codec_name, _DEFAULT_CHECK_WINDOWS)
        rate = stream.codec_context.sample_rate or 8000
        windows = _WindowCollector(_check_starts(container, rate, count), round(seconds * rate))
        try:
            for packet in container.demux(stream):
                _note_packet(scan, packet)
                for frame in packet.decode():
                    _note_frame(scan, frame, windows)
        except av.error.FFmpegError as exc:
            raise CorruptDataError(
                f"decoding failed at frame {scan.num_frames}: {ffmpeg_message(exc)}",
                where=recording_id,
            ) from exc
    if scan.num_frames == 0:
        raise UnsupportedAudioError("the audio stream decodes to no samples", where=recording_id)
    scan.check_windows = windows.finished(scan.num_frames)
    return scan


def _note_packet(scan: _Scan, packet: Any) -> None:
    if packet.size == 0:
        return
    if scan.pending_offset >= 0:
        scan.pending_packets -= 1
        if scan.pending_packets == 0:
            scan.counted_points.append((scan.num_frames, scan.pending_offset))
            scan.pending_offset = -1
    if packet.pts is None or packet.pos is None or packet.pos < 0 or scan.time_base == 0:
        return
    scan.recent_offsets.append(packet.pos)
    if not scan.packet_points:
        scan.header_bytes = packet.pos
    elif packet.pos <= scan.packet_points[-1][1]:
        return  # an Ogg page holding several packets: resume at its first
    timeline = round(packet.pts * scan.time_base * _rate_of(packet, scan))
    scan.packet_points.append((timeline, packet.pos))
    delay_packets = _COUNTED_CODECS.get(scan.codec_name, 0)
    if delay_packets == 0:
        scan.counted_points.append((scan.num_frames, packet.pos))
    elif scan.pending_offset < 0:
        scan.pending_offset = packet.pos
        scan.pending_packets = delay_packets


def _rate_of(packet: Any, scan: _Scan) -> int:
    return scan.sample_rate or int(packet.stream.codec_context.sample_rate)


def _note_frame(scan: _Scan, frame: Any, windows: _WindowCollector) -> None:
    if scan.timeline_origin is None:
        scan.sample_rate = frame.sample_rate
        scan.channels = len(frame.layout.channels)
        if frame.pts is None or scan.time_base == 0:
            scan.unsupported_reason = "the stream has no timestamps"
            scan.timeline_origin = 0
        else:
            scan.timeline_origin = round(frame.pts * scan.time_base * scan.sample_rate)
    elif frame.sample_rate != scan.sample_rate or len(frame.layout.channels) != scan.channels:
        scan.unsupported_reason = "the sample rate or channel count changes within the stream"
    timed = scan.codec_name not in _COUNTED_CODECS
    if timed and not scan.unsupported_reason and frame.pts is not None:
        position = round(frame.pts * scan.time_base * scan.sample_rate) - scan.timeline_origin
        if position != scan.num_frames:
            scan.unsupported_reason = f"timestamps jump from frame {scan.num_frames} to {position}"
    windows.offer(scan.num_frames, frame)
    scan.num_frames += frame.samples


def _check_starts(container: Any, rate: int, count: int) -> list[int]:
    """Frame positions at which a window of the full decode is kept for checking.

    The start, the very end and ``count`` positions spread over the
    recording, each shifted by a pseudo-random fraction of a second so that
    they fall at different places within packets.  Positions are estimated
    from the container's duration; beyond the real end they are dropped.
    """
    if not container.duration:
        return [0] + [rate * (7**power) for power in range(count)]
    estimated = int(container.duration * rate / 1_000_000)
    starts = {0, max(estimated - rate // 10, 0), max(estimated - 3 * rate, 0)}
    for number in range(count):
        jitter = (number * 7919) % rate
        starts.add(min(estimated * number // count + jitter, max(estimated - 1, 0)))
    return sorted(starts)


class _WindowCollector:
    """Keeps copies of the sequential decode at a few positions."""

    def __init__(self, starts: list[int], window_frames: int) -> None:
        self._starts = starts
        self._window = window_frames
        self._pieces: dict[int, list[Int16Array]] = {start: [] for start in starts}

    def offer(self, position: int, frame: Any) -> None:
        end = position + frame.samples
        window = self._window
        wanted = [start for start in self._starts if position < start + window and end > start]
        if not wanted:
            return
        samples = frame_to_s16(frame)
        for start in wanted:
            lo = max(start, position)
            hi = min(start + window, end)
            self._pieces[start].append(samples[lo - position : hi - position])

    def finished(self, num_frames: int) -> dict[int, Int16Array]:
        return {
            start: np.concatenate(pieces)
            for start, pieces in self._pieces.items()
            if pieces and start < num_frames
        }


def _seeks_match(blob: memoryview, recording: Recording, scan: _Scan) -> bool:
    tolerance = 0 if recording.codec_name in _LOSSLESS_CODECS else 1
    for start, expected in scan.check_windows.items():
        try:
            actual = decode_frames(Blob.of(blob), recording, start, start + len(expected))
        except CorruptDataError:
            return False
        difference = np.abs(actual.astype(np.int32) - expected.astype(np.int32))
        if difference.size and int(difference.max()) > tolerance:
            return False
    return True


def _transcode_to_flac(blob: memoryview, recording_id: str, workdir: str) -> str:
    import av  # noqa: PLC0415 - as in cutfs.codec.audio.decoder

    descriptor, path = tempfile.mkstemp(prefix="transcoded-", suffix=".flac", dir=workdir)
    os.close(descriptor)
    with open_input(_reader(blob)) as source, av.open(path, mode="w", format="flac") as sink:
        stream = source.streams.audio[0]
        encoder: Any = None
        pts = 0
        for frame in _decoded(source, stream, recording_id):
            samples = frame_to_s16(frame)
            if encoder is None:
                encoder = sink.add_stream("flac", rate=frame.sample_rate)
                encoder.layout = f"{samples.shape[1]}c"
                encoder.format = "s16"
            pcm = av.AudioFrame.from_ndarray(
                samples.reshape(1, -1), format="s16", layout=f"{samples.shape[1]}c"
            )
            pcm.sample_rate = frame.sample_rate
            pcm.pts = pts
            pts += len(samples)
            sink.mux(encoder.encode(pcm))
        if encoder is not None:
            sink.mux(encoder.encode(None))
    return path


def _decoded(container: Any, stream: Any, recording_id: str) -> Iterator[Any]:
    import av  # noqa: PLC0415 - as in cutfs.codec.audio.decoder

    try:
        yield from container.decode(stream)
    except av.error.FFmpegError as exc:
        raise CorruptDataError(
            f"decoding failed: {ffmpeg_message(exc)}", where=recording_id
        ) from exc


def _thin_points(points: list[tuple[int, int]], interval: int) -> tuple[list[int], list[int]]:
    samples: list[int] = []
    offsets: list[int] = []
    for sample, offset in points:
        if samples and (sample < samples[-1] + interval or offset <= offsets[-1]):
            continue
        samples.append(sample)
        offsets.append(offset)
    return samples, offsets


def _reader(blob: memoryview) -> io.BufferedReader:
    return io.BufferedReader(SpliceReader(Blob.of(blob), 0, 0), buffer_size=1 << 16)
