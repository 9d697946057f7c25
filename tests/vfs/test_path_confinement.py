"""Landlock confinement of the processes that parse other people's data, installed for
real in a child process that then tries what a taken-over decoder would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cutfs.vfs.sandbox.path_confinement import landlock_version

pytestmark = pytest.mark.skipif(landlock_version() == 0, reason="the kernel has no Landlock")

_ATTEMPTS = """
import json, os, sys
from cutfs.vfs.sandbox.path_confinement import PathConfinement
from cutfs.vfs.sandbox.serving_user import drop_privileges
data, cache, home = sys.argv[1:4]
drop_privileges(None)
assert PathConfinement.for_data({roots}, (cache,)).install()
outcomes = {{}}
def attempt(name, action):
    try:
        action()
        outcomes[name] = "done"
    except OSError as exc:
        outcomes[name] = exc.strerror
attempt("read the source", lambda: open(os.path.join(data, "a.flac"), "rb").read())
attempt("list the source", lambda: os.listdir(data))
attempt("write the cache", lambda: open(os.path.join(cache, "block"), "wb").write(b"x"))
attempt("rename in the cache", lambda: os.rename(
    os.path.join(cache, "block"), os.path.join(cache, "moved")))
attempt("remove from the cache", lambda: os.unlink(os.path.join(cache, "moved")))
attempt("write /dev/null", lambda: open("/dev/null", "wb").write(b"x"))
attempt("import a module", lambda: __import__("wave"))
attempt("read the user's keys", lambda: open(os.path.join(home, "key"), "rb").read())
attempt("plant a file in the home", lambda: open(os.path.join(home, ".bashrc"), "a"))
attempt("overwrite the source", lambda: open(os.path.join(data, "a.flac"), "r+b"))
attempt("add to the source", lambda: open(os.path.join(data, "new"), "wb"))
attempt("remove the source", lambda: os.unlink(os.path.join(data, "a.flac")))
attempt("link out of the cache", lambda: os.link(
    os.path.join(data, "a.flac"), os.path.join(cache, "a.flac")))
attempt("make a fifo in the cache", lambda: os.mkfifo(os.path.join(cache, "fifo")))
attempt("make a device", lambda: os.mknod(os.path.join(cache, "dev"), 0o20600, os.makedev(1, 3)))
print(json.dumps(outcomes), flush=True)
"""


def _attempts(tmp_path: Path, roots: str) -> dict[str, str]:
    data, cache, home = (tmp_path / name for name in ("data", "cache", "home"))
    for directory in (data, cache, home):
        directory.mkdir()
    (data / "a.flac").write_bytes(b"fLaC")
    (home / "key").write_text("secret")
    result = subprocess.run(
        [sys.executable, "-I", "-c", _ATTEMPTS.format(roots=roots), *map(str, (data, cache, home))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (home / "key").read_text() == "secret" and (data / "a.flac").exists()
    outcomes: dict[str, str] = json.loads(result.stdout)
    return outcomes


def test_a_decoder_reads_its_source_and_writes_only_its_cache(tmp_path: Path) -> None:
    outcomes = _attempts(tmp_path, "(data,)")
    allowed = {
        "read the source",
        "list the source",
        "write the cache",
        "rename in the cache",
        "remove from the cache",
        "write /dev/null",
        "import a module",
        "make a fifo in the cache",
    }
    assert {name for name, outcome in outcomes.items() if outcome == "done"} == allowed
    refused = set(outcomes) - allowed
    denied = {name: outcomes[name] for name in refused - {"make a device", "link out of the cache"}}
    assert set(denied.values()) == {"Permission denied"}, denied
    assert outcomes["make a device"] in {"Permission denied", "Operation not permitted"}
    assert outcomes["link out of the cache"] == "Invalid cross-device link"  # Landlock's EXDEV


def test_one_that_reads_object_storage_reads_everywhere_and_writes_only_its_cache(
    tmp_path: Path,
) -> None:
    outcomes = _attempts(tmp_path, "None")
    assert outcomes["read the user's keys"] == "done"  # credentials live in homes
    for write in ("plant a file in the home", "overwrite the source", "add to the source"):
        assert outcomes[write] == "Permission denied", write
    assert outcomes["write the cache"] == "done"
