"""The exception hierarchy of the codec library.

Every error raised on purpose by ``codec`` derives from :class:`CutfsError` and
says what went wrong and where: the file, the recording or the cut.  The
filesystem layer turns these into errno values in exactly one place; the
command line turns them into a message and a non-zero exit status.

The classes keep their constructor arguments in ``args`` so that they survive
pickling.  Decoder workers send theirs by class name and words instead
(:mod:`cutfs.vfs.frames.worker_message`): the process reading a worker does not
unpickle what the worker sends.
"""

from __future__ import annotations


class CutfsError(Exception):
    """Root of all errors raised by cutfs on purpose."""

    def __init__(self, message: str, *, where: str | None = None) -> None:
        super().__init__(message, where)
        self.message = message
        self.where = where

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.message, self.where))

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


def _rebuild(cls: type[CutfsError], message: str, where: str | None) -> CutfsError:
    return cls(message, where=where)


class SourceError(CutfsError):
    """Bad input to ``pack``: a manifest, a data directory or an audio file."""


class UnsupportedAudioError(SourceError):
    """The file holds no audio stream that cutfs can decode."""


class ShardFormatError(CutfsError):
    """A shard directory is missing, of another version, or inconsistent."""


class CorruptDataError(CutfsError):
    """Stored audio could not be decoded into the samples promised for it."""


class ManifestMismatchError(CutfsError):
    """The audio disagrees with its manifest: rate, channels, or length beyond tolerance."""
