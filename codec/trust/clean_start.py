"""How cutfs starts a Python process, so that nothing a user can write takes part in it.

An administrator runs ``cutfs mount`` from wherever they are, often a directory a user can
write.  Python puts the directory of a ``-c`` program or of ``-m`` (the current directory)
first on ``sys.path``, reads ``PYTHON*`` variables and the user's site-packages, and
``multiprocessing``'s spawned children inherit the working directory and ``sys.path``:
any of these would let a user's ``multiprocessing/__init__.py`` (or ``numpy.py``) run as
root.  So every Python process cutfs starts, and every process those start:

- runs an *isolated* interpreter (``python -I``: no current or script directory on
  ``sys.path``, no ``PYTHON*`` variables, no user site-packages); ``multiprocessing``
  passes ``-I`` on to the processes it spawns when the parent has it;
- runs from ``/``: the directory the command was run from is recorded (see
  :func:`caller_directory`) and paths given relative to it are resolved against it by
  name, never by the process's own working directory;
- gets a minimal environment (:func:`clean_environment`): the variables cutfs and the
  libraries it uses read, by name, and a ``PATH`` of directories only root can write.

:func:`restart_clean` makes the running command such a process (the ``cutfs`` entry point
calls it before it imports anything else); :func:`python_command` is the command line of
a new one.  This module imports nothing outside the standard library: it runs before
anything else is imported.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence

#: The variable that carries the directory a command was run from to the processes it
#: starts from ``/``.
CALLER_DIRECTORY_VARIABLE = "CUTFS_CALLER_DIRECTORY"

#: Variables kept by name: the user and locale, systemd's protocol, what cutfs reads.
_KEPT_NAMES = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        # systemd: readiness, the journal, the unit's directories
        "NOTIFY_SOCKET",
        "JOURNAL_STREAM",
        "INVOCATION_ID",
        "CACHE_DIRECTORY",
        "RUNTIME_DIRECTORY",
        "STATE_DIRECTORY",
        "LOGS_DIRECTORY",
        "XDG_CACHE_HOME",
        "XDG_RUNTIME_DIR",
        # read by cutfs itself (Lhotse's variable, as Lhotse reads it)
        "LHOTSE_AUDIO_DURATION_MISMATCH_TOLERANCE",
        # object storage: emulators, certificates and proxies
        "STORAGE_EMULATOR_HOST",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
    }
)
#: Variables kept by prefix: locale, cutfs, object storage credentials, cluster engines.
_KEPT_PREFIXES = (
    "LC_",
    "CUTFS_",
    "AWS_",
    "GOOGLE_",
    "CLOUDSDK_",
    "AZURE_",
    "SLURM_",
    "SBATCH_",
    "RAY_",
)
#: Where commands are looked for when no directory of the caller's ``PATH`` qualifies.
_SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def is_clean() -> bool:
    """Whether this process already is a clean start: isolated, and running from ``/``."""
    try:
        return bool(sys.flags.isolated) and os.getcwd() == "/"
    except OSError:  # the working directory was removed
        return False


def caller_directory() -> str:
    """The directory the command was run from: what relative paths given to it (on its
    command line, in a manifest) are relative to.  In a process of a clean start, the one
    recorded when it started; otherwise this process's working directory."""
    recorded = os.environ.get(CALLER_DIRECTORY_VARIABLE)
    if recorded and os.path.isabs(recorded) and is_clean():
        return recorded
    return os.getcwd()


def absolute(path: str) -> str:
    """``path`` made absolute against :func:`caller_directory`, normalised."""
    return os.path.normpath(os.path.join(caller_directory(), path))


def python_command(module: str, arguments: Sequence[str] = ()) -> list[str]:
    """The command line that runs ``python -m module arguments`` in an isolated interpreter
    of this environment (start it with ``cwd="/"`` and :func:`clean_environment`)."""
    return [sys.executable, "-I", "-m", module, *arguments]


def clean_environment(
    environment: Mapping[str, str] | None = None, caller: str | None = None
) -> dict[str, str]:
    """A process's whole environment: the variables of ``environment`` (default: this
    process's) that cutfs or its libraries read, a ``PATH`` of its directories that only
    root or this user can write, and the caller's directory (default:
    :func:`caller_directory`)."""
    source = os.environ if environment is None else environment
    kept = {
        name: value
        for name, value in source.items()
        if name in _KEPT_NAMES or name.startswith(_KEPT_PREFIXES)
    }
    kept["PATH"] = safe_search_path(source.get("PATH", ""))
    kept[CALLER_DIRECTORY_VARIABLE] = caller or caller_directory()
    return kept


def safe_search_path(search_path: str) -> str:
    """The directories of ``search_path`` that are absolute, exist, belong to root or to
    this process's user, and that no group or other user can write, in order; the system's
    directories if none is left."""
    kept: list[str] = []
    for directory in search_path.split(os.pathsep):
        absolute_and_new = directory and os.path.isabs(directory) and directory not in kept
        if absolute_and_new and _only_owner_writes(directory):
            kept.append(directory)
    return os.pathsep.join(kept or _SYSTEM_PATH)


def _only_owner_writes(directory: str) -> bool:
    try:
        status = os.stat(directory)
    except OSError:
        return False
    return (
        stat.S_ISDIR(status.st_mode)
        and status.st_uid in (0, os.geteuid())
        and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def restart_clean(module: str, arguments: Sequence[str]) -> None:
    """Make this process a clean start of ``python -m module arguments``: if it is not one
    yet, replace it (``exec``) by one, from ``/``, with the current directory recorded for
    relative paths.  Returns only in a clean start.  Call it before importing anything
    that a clean start must not import from elsewhere."""
    if is_clean():
        return
    try:
        caller = os.getcwd()
    except OSError as exc:
        sys.exit(f"cutfs: the current directory is gone ({exc.strerror}): cd to another one")
    environment = clean_environment(caller=caller)
    os.chdir("/")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, python_command(module, arguments), environment)
