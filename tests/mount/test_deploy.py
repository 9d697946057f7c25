"""Deployment: fstab lines through mount(8), an unprivileged user, the systemd unit."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.corpus import ffmpeg_decode, wav_header
from support.mounts import CUTFS, is_mounted, needs_fuse, unmount
from support.servers import S3Server

pytestmark = [pytest.mark.mount, needs_fuse]
REPOSITORY = Path(__file__).resolve().parents[2]
HELPER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOBODY = 65534
AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--")
needs_helper = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("cutfs", path=HELPER_PATH) is None
    or shutil.which("mount.fuse3", path=HELPER_PATH) is None,
    reason="needs root, mount.fuse3 and cutfs on mount(8)'s PATH (scripts/setup.sh links it)",
)


@pytest.fixture()
def public_shards(shard_dir: str) -> Iterator[str]:
    """The packed shards in a directory every user can read."""
    directory = Path(os.path.realpath("/tmp")) / f"cutfs-public-{os.getpid()}"
    shutil.copytree(shard_dir, directory / "shards")
    for path in [directory, *directory.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield str(directory / "shards")
    shutil.rmtree(directory)


def _read_cut(mountpoint: str) -> bytes:
    with open(os.path.join(mountpoint, "cuts", "flac_mono_16k", "start.wav"), "rb") as cut:
        return cut.read()


def _mount_fstab_line(tmp_path: Path, line: str) -> None:
    """``mount MOUNTPOINT`` with ``line`` as the only fstab entry; it must succeed."""
    mountpoint = line.split()[1]
    os.makedirs(mountpoint, exist_ok=True)
    fstab = tmp_path / "fstab"
    fstab.write_text(line)
    result = subprocess.run(
        ["mount", "-T", str(fstab), mountpoint],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@needs_helper
def test_an_fstab_line_mounts_through_the_helper(shard_dir: str, tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    try:
        _mount_fstab_line(
            tmp_path,
            f"{shard_dir} {mountpoint} fuse.cutfs "
            "ro,nosuid,nodev,cache_size=64M,serving_processes=1,read_timeout=20,_netdev,nofail,"
            "x-systemd.automount 0 0\n",
        )
        assert is_mounted(str(mountpoint))
        with open("/proc/mounts") as mounts:
            line = next(m for m in mounts if m.split()[1] == str(mountpoint))
        assert line.split()[2] == "fuse.cutfs"
        assert {"ro", "nosuid", "nodev"} <= set(line.split()[3].split(","))
        assert len(_read_cut(str(mountpoint))) == 44 + 2 * 40000
        assert subprocess.run(["umount", str(mountpoint)], check=False).returncode == 0
        assert not is_mounted(str(mountpoint))
    finally:
        unmount(str(mountpoint))


@needs_helper
def test_an_fstab_line_mounts_shards_from_object_storage(
    shard_dir: str, s3_server: S3Server, tmp_path: Path
) -> None:
    s3_server.upload(shard_dir, "fstab", "shards")
    uri = s3_server.uri("fstab", "shards")
    mountpoint = tmp_path / "mnt"
    try:
        _mount_fstab_line(
            tmp_path,
            f"{uri} {mountpoint} fuse.cutfs ro,cache_dir={tmp_path / 'cache'},"
            "disk_cache_size=1G,serving_processes=1,_netdev 0 0\n",
        )
        assert len(_read_cut(str(mountpoint))) == 44 + 2 * 40000
        with open(mountpoint / ".cutfs" / "stats", encoding="utf-8") as stats:
            assert json.load(stats)["store"]["gets"] >= 1  # read from the server
    finally:
        unmount(str(mountpoint))


@needs_helper
def test_mount_t_fuse_cutfs(shard_dir: str, tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    try:
        result = subprocess.run(
            [
                "mount",
                "-t",
                "fuse.cutfs",
                shard_dir,
                str(mountpoint),
                "-o",
                "ro,serving_processes=1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert len(_read_cut(str(mountpoint))) == 44 + 2 * 40000
    finally:
        unmount(str(mountpoint))


@pytest.fixture()
def fuse_for_everyone() -> Iterator[None]:
    """Give /dev/fuse the distributions' usual mode 0666 for the test (containers use 0600)."""
    mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    if mode & 0o006 != 0o006:
        if os.geteuid() != 0:
            pytest.skip("/dev/fuse is not usable by other users")
        os.chmod("/dev/fuse", 0o666)
    yield
    os.chmod("/dev/fuse", mode)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root to switch to an unprivileged user",
)
def test_an_unprivileged_user_mounts_through_fusermount3(
    public_shards: str, fuse_for_everyone: None
) -> None:
    python, environment = _python_for_nobody(Path(public_shards).parent)
    mountpoint = Path(public_shards).parent / "mnt"
    mountpoint.mkdir()
    os.chown(mountpoint, 65534, 65534)
    as_nobody = list(AS_NOBODY)
    try:
        result = _mount_as_nobody(python, environment, public_shards, mountpoint)
        assert result.returncode == 0, result.stderr
        with open("/proc/mounts") as mounts:
            line = next(m for m in mounts if m.split()[1] == str(mountpoint))
        assert "user_id=65534" in line
        read = subprocess.run(
            [
                *as_nobody,
                python,
                "-c",
                f"import sys; sys.stdout.write(str(len(open({str(mountpoint)!r} + "
                "'/cuts/flac_mono_16k/start.wav', 'rb').read())))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert read.stdout == str(44 + 2 * 40000), read.stderr
        unmounted = subprocess.run([*as_nobody, "fusermount3", "-u", str(mountpoint)], check=False)
        assert unmounted.returncode == 0
    finally:
        unmount(str(mountpoint))


@pytest.fixture()
def nobodys_manifests(corpus: dict[str, str]) -> Iterator[Path]:
    """A Lhotse recordings manifest of nobody's, in ``manifests/``, naming by absolute
    path nobody's FLAC file in ``audio/`` beside it (as Lhotse keeps them: apart)."""
    directory = Path(os.path.realpath("/tmp")) / f"cutfs-manifests-{os.getpid()}"
    (directory / "manifests").mkdir(parents=True)
    (directory / "audio").mkdir()
    audio = directory / "audio" / "a.flac"
    shutil.copy(corpus["flac_mono_16k.flac"], audio)
    samples, rate, _ = ffmpeg_decode(str(audio))
    recording = {
        "id": "rec1",
        "sources": [{"type": "file", "channels": [0], "source": str(audio)}],
        "sampling_rate": rate,
        "num_samples": len(samples),
        "duration": len(samples) / rate,
        "channel_ids": [0],
    }
    (directory / "manifests" / "recordings.jsonl").write_text(json.dumps(recording) + "\n")
    (directory / "mnt").mkdir()
    (directory / "home").mkdir()  # nobody's is /nonexistent; a user has one, with ~/.cache
    for path in [directory, *directory.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    yield directory
    shutil.rmtree(directory)


def test_a_users_private_mount_follows_its_manifests_to_its_audio_elsewhere(
    nobodys_manifests: Path, fuse_for_everyone: None, corpus: dict[str, str]
) -> None:
    """The most common use in place: a user mounts, for themselves, manifests kept apart
    from the audio they name.  No flag is needed; what is served is ffmpeg's decode."""
    python, environment = _python_for_nobody(nobodys_manifests)
    environment["HOME"] = str(nobodys_manifests / "home")
    mountpoint = nobodys_manifests / "mnt"
    try:
        manifests = str(nobodys_manifests / "manifests")
        result = _mount_as_nobody(python, environment, manifests, mountpoint)
        assert result.returncode == 0, result.stderr
        read = subprocess.run(
            [*AS_NOBODY, "cat", str(mountpoint / "cuts" / "rec1.wav")],
            capture_output=True,
            timeout=60,
            check=False,
        )
        samples, rate, channels = ffmpeg_decode(str(nobodys_manifests / "audio" / "a.flac"))
        assert read.stdout == wav_header(rate, channels, len(samples)) + samples.tobytes()
    finally:
        unmount(str(mountpoint))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_a_root_daemons_shared_mount_of_the_same_manifests_still_refuses(
    nobodys_manifests: Path,
) -> None:
    """Confinement where it protects someone: a mount others can read (here a root
    daemon's, with --allow-other) serves only files beneath the source and --allow-root."""
    source_and_mnt = (nobodys_manifests / "manifests", nobodys_manifests / "mnt")
    result = subprocess.run(
        [*CUTFS, "mount", "--allow-other", "--serving-processes", "1", *map(str, source_and_mnt)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    unmount(str(nobodys_manifests / "mnt"))
    assert result.returncode == 3, result.stderr
    assert "lies outside the source and the allowed roots" in result.stderr, result.stderr


def _mount_as_nobody(
    python: str, environment: dict[str, str], source: str, mountpoint: Path
) -> subprocess.CompletedProcess[str]:
    """``cutfs mount SOURCE MOUNTPOINT`` (one serving process) run by nobody, from /."""
    command = ["-m", "cutfs.vfs.cli", "mount", "--serving-processes", "1", source]
    return subprocess.run(
        [*AS_NOBODY, python, *command, str(mountpoint)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
        env=environment,
    )


def _python_for_nobody(directory: Path) -> tuple[str, dict[str, str]]:
    """An interpreter 'nobody' may run, with this environment's packages on its path.

    The test environment's own interpreter often lives under /root (pyenv); the system's
    Python of the same minor version can load the same packages.  They are put on its path
    by a ``.pth`` file of a virtual environment made in ``directory`` (cutfs runs isolated
    interpreters, which ignore ``PYTHONPATH``).
    """
    packages = [p for p in sys.path if p.endswith("site-packages")]
    candidates = [
        os.path.realpath(sys.executable),
        f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}",
    ]
    for candidate in candidates:
        paths = [Path(candidate).parent, REPOSITORY, *map(Path, packages)]
        if os.path.exists(candidate) and all(_readable_by_nobody(p) for p in paths):
            environment = directory / "venv"
            subprocess.run([candidate, "-m", "venv", "--without-pip", environment], check=True)
            version = f"python{sys.version_info.major}.{sys.version_info.minor}"
            site = environment / "lib" / version / "site-packages"
            (site / "cutfs-test.pth").write_text("\n".join([*packages, str(REPOSITORY)]) + "\n")
            return str(environment / "bin" / "python"), {"PATH": HELPER_PATH}
    pytest.skip("no Python interpreter with cutfs installed is accessible to 'nobody'")


def _readable_by_nobody(path: Path) -> bool:
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            return False
    return True


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    if shutil.which("cutfs", path="/usr/local/bin") is None:
        pytest.skip("the unit runs /usr/local/bin/cutfs (scripts/setup.sh links it as root)")
    unit = tmp_path / "cutfs@.service"
    shutil.copy(REPOSITORY / "systemd" / "cutfs@.service", unit)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "cutfs@test.service")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "cutfs@test.service" not in result.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_object_storage_drop_in_verifies_and_opens_the_network(tmp_path: Path) -> None:
    if shutil.which("cutfs", path="/usr/local/bin") is None:
        pytest.skip("the unit runs /usr/local/bin/cutfs (scripts/setup.sh links it as root)")
    shutil.copy(REPOSITORY / "systemd" / "cutfs@.service", tmp_path / "cutfs@.service")
    drop_ins = tmp_path / "cutfs@test.service.d"
    drop_ins.mkdir()
    shutil.copy(REPOSITORY / "systemd" / "object-storage.conf", drop_ins)
    unit = str(tmp_path / "cutfs@test.service")
    verified = subprocess.run(
        ["systemd-analyze", "verify", unit], capture_output=True, text=True, check=False
    )
    assert verified.returncode == 0, verified.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", unit],
        capture_output=True,
        text=True,
        check=False,
    )
    exposed = {line.split()[1] for line in security.stdout.splitlines() if line.startswith("✗")}
    assert "PrivateNetwork=" in exposed  # the drop-in was applied
    assert "NoNewPrivileges=" not in exposed


def test_mount_options_are_checked(shard_dir: str, tmp_path: Path) -> None:
    for options, message in [
        ("rw", "read-only"),
        ("cache_size=lots", "bad value"),
        ("colour=blue", "unknown mount option"),
    ]:
        result = subprocess.run(
            [*CUTFS, shard_dir, str(tmp_path), "-o", options],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 2
        assert message in result.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_systemd_unit_is_hardened(tmp_path: Path) -> None:
    """``systemd-analyze security`` rates the unit OK (below 4.0; 9.6 before hardening)."""
    unit = tmp_path / "cutfs@test.service"
    shutil.copy(REPOSITORY / "systemd" / "cutfs@.service", unit)
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    overall = next(line for line in result.stdout.splitlines() if "Overall exposure" in line)
    score = float(overall.split(":")[1].split()[0])
    assert score < 4.0, overall
    exposed = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("✗")}
    # What a FUSE mount that others must see cannot give up (see docs/operations.md).
    assert "NoNewPrivileges=" not in exposed
    assert "RestrictAddressFamilies=~AF_(INET|INET6)" not in exposed
