"""The distribution installs one top-level package, ``cutfs``."""

import subprocess
import sys
import zipfile
from pathlib import Path

import cutfs

REPOSITORY = Path(__file__).resolve().parents[2]


def test_wheel_installs_only_the_cutfs_package(tmp_path: Path) -> None:
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip_wheel, "-w", str(tmp_path), str(REPOSITORY)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("cutfs-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top_level = {name.split("/")[0] for name in names if not name.endswith("/")}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"cutfs"}
    # the links resolve into real files in the wheel: every module of the library and the
    # filesystem ships, whatever package it is in
    modules = {
        f"cutfs/{path.relative_to(REPOSITORY).as_posix()}"
        for layer in ("codec", "vfs")
        for path in (REPOSITORY / layer).rglob("*.py")
    }
    assert len(modules) > 100
    assert sorted(modules - set(names)) == []
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "cutfs = cutfs.__main__:main" in archive.read(entry_points).decode()
    assert f"cutfs-{cutfs.__version__}-" in wheel.name
