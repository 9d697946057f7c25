"""A pack as plan, partitions and commit: run by hand in separate processes and in any
order, killed midway and rerun, refused when incomplete, and run by the Slurm (submitit's
local executor) and Ray (a local instance) engines; every way gives the same bytes as the
one-process pack of the ``shard_dir`` fixture (the same sources, 8 MiB shards)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.corpus import make_speech
from support.mounts import CUTFS
from support.users import needs_root, other_gid, other_uid

from cutfs.codec.packing.engines import private_ray_directory

SHARD_SIZE = "8M"  # as the shard_dir fixture packs


def _cutfs(*arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*CUTFS, *arguments], capture_output=True, text=True, check=False, timeout=900
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _files(directory: str) -> dict[str, bytes]:
    """Every file under ``directory`` by relative path, with its bytes."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as file:
                found[os.path.relpath(path, directory)] = file.read()
    return found


def _assert_same_directory(packed: str, reference: str) -> None:
    expected, got = _files(reference), _files(packed)
    assert sorted(got) == sorted(expected)
    for name, content in expected.items():
        assert got[name] == content, f"{name} differs from the one-process pack"


def _plan(sources: list[str], output: str) -> int:
    result = _cutfs("pack", "plan", *sources, "-o", output, "--shard-size", SHARD_SIZE)
    return int(result.stdout.split()[-1])


def test_partitions_run_by_hand_in_shuffled_order_give_the_one_process_pack(
    lhotse_manifests: list[str], shard_dir: str, tmp_path: Path
) -> None:
    output = str(tmp_path / "out")
    partitions = _plan(lhotse_manifests, output)
    assert partitions > 1
    assert _plan(lhotse_manifests, output) == partitions  # a rerun keeps the plan
    order = list(range(partitions))
    random.Random(7).shuffle(order)
    # Two at a time, each in a process of its own, as array tasks would run them.
    for first in range(0, partitions, 2):
        runs = [
            subprocess.Popen(
                [*CUTFS, "pack", "run", output, "--partition", str(partition)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for partition in order[first : first + 2]
        ]
        for run in runs:
            _, errors = run.communicate(timeout=600)
            assert run.returncode == 0, errors
    again = _cutfs("pack", "run", output, "--partition", f"0-{partitions - 1}")
    assert again.stdout.count("already done") == partitions
    status = _cutfs("pack", "status", output).stdout
    assert f"{partitions} of {partitions} partitions done" in status
    committed = _cutfs("pack", "commit", output)
    assert "packed" in committed.stdout
    _assert_same_directory(output, shard_dir)
    assert "already committed" in _cutfs("pack", "commit", output).stdout
    assert "committed" in _cutfs("pack", "status", output).stdout


def test_a_partition_killed_midway_and_rerun_gives_the_same_shards(
    lhotse_manifests: list[str], shard_dir: str, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    partitions = _plan(lhotse_manifests, str(output))
    run = subprocess.Popen(
        [*CUTFS, "pack", "run", str(output), "--partition", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    running = output / "_parts" / "part-000000.running.json"
    deadline = time.monotonic() + 120
    while not running.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    assert running.exists(), "the run ended before it could be killed midway"
    assert not (output / "_parts" / "part-000000.done.json").exists()
    status = _cutfs("pack", "status", str(output)).stdout
    assert "partition 0" in status and "its process is gone" in status
    refused = _cutfs("pack", "commit", str(output), check=False)
    assert refused.returncode == 1
    assert f"cannot commit: {partitions} of {partitions} partitions are not done" in (
        refused.stderr
    )
    assert not (output / "manifest.json").exists()
    _cutfs("pack", "run", str(output), "--partition", f"0-{partitions - 1}")
    _cutfs("pack", "commit", str(output))
    _assert_same_directory(str(output), shard_dir)


def test_commit_refuses_an_incomplete_set_and_names_the_missing_partitions(
    lhotse_manifests: list[str], tmp_path: Path
) -> None:
    output = str(tmp_path / "out")
    partitions = _plan(lhotse_manifests, output)
    _cutfs("pack", "run", output, "--partition", "0")
    refused = _cutfs("pack", "commit", output, check=False)
    assert refused.returncode == 1
    missing = "1" if partitions == 2 else f"1-{partitions - 1}"
    assert f"{partitions - 1} of {partitions} partitions are not done: {missing}" in refused.stderr
    assert not os.path.exists(os.path.join(output, "manifest.json"))
    status = _cutfs("pack", "status", output).stdout
    assert f"1 of {partitions} partitions done" in status
    assert "estimated time left" in status
    # A mount refuses the incomplete directory.
    (tmp_path / "mnt").mkdir()
    mount = _cutfs("mount", output, str(tmp_path / "mnt"), "--foreground", check=False)
    assert mount.returncode == 3, mount.stderr
    assert "not mountable until 'cutfs pack commit'" in mount.stderr
    # A done marker naming another file as its shard would put that name in the manifest.
    marker = tmp_path / "out" / "_parts" / "part-000000.done.json"
    fields = json.loads(marker.read_text())
    fields["shard"]["file"] = "../elsewhere.arrow"
    marker.write_text(json.dumps(fields))
    tampered = _cutfs("pack", "commit", output, check=False)
    assert tampered.returncode == 1
    assert "names shard '../elsewhere.arrow', not its partition's" in tampered.stderr


def test_a_partition_with_bad_audio_fails_alone_with_its_error_in_the_status(
    tmp_path: Path,
) -> None:
    audio = tmp_path / "audio"
    audio.mkdir()
    for number in range(3):
        make_speech(str(audio / f"talk{number}.wav"), 2.0, 16000, 1, seed=number)
    (audio / "talk3.flac").write_bytes(b"fLaC" + os.urandom(4000))  # not FLAC inside
    output = str(tmp_path / "out")
    partitions = int(
        _cutfs("pack", "plan", str(audio), "-o", output, "--shard-size", "1").stdout.split()[-1]
    )
    assert partitions == 4  # one recording each
    failed = _cutfs("pack", "run", output, "--partition", "0-3", check=False)
    assert failed.returncode == 1
    assert "talk3" in failed.stderr
    status = _cutfs("pack", "status", output).stdout
    assert "3 of 4 partitions done" in status
    assert "failed (bad input): partition 3: " in status and "talk3" in status
    refused = _cutfs("pack", "commit", output, check=False)
    assert "1 of 4 partitions are not done: 3" in refused.stderr


def test_plan_refuses_other_sources_in_a_planned_output(
    lhotse_manifests: list[str], tmp_path: Path
) -> None:
    output = str(tmp_path / "out")
    _plan(lhotse_manifests, output)
    other = _cutfs(
        "pack", "plan", *lhotse_manifests, "-o", output, "--shard-size", "4M", check=False
    )
    assert other.returncode == 1
    assert "already holds the plan of other sources or options" in other.stderr
    assert (
        "no partition 999"
        in _cutfs("pack", "run", output, "--partition", "999", check=False).stderr
    )


def test_a_run_refuses_a_plan_others_could_have_changed(
    lhotse_manifests: list[str], tmp_path: Path
) -> None:
    output = tmp_path / "out"
    _plan(lhotse_manifests, str(output))
    plan = output / "_plan" / "recordings.arrow"
    assert plan.stat().st_mode & 0o777 == 0o644  # whatever the umask
    plan.chmod(0o664)  # a group member could now name other files, or commands, to run
    refused = _cutfs("pack", "run", str(output), "--partition", "0", check=False)
    assert refused.returncode == 1
    assert "could have been written by another user" in refused.stderr
    assert not (output / "shard-00000.arrow").exists()
    plan.chmod(0o644)
    _cutfs("pack", "run", str(output), "--partition", "0")
    assert (output / "shard-00000.arrow").exists()


@pytest.mark.slow
def test_the_slurm_engine_through_submitit_gives_the_one_process_pack(
    lhotse_manifests: list[str], shard_dir: str, tmp_path: Path
) -> None:
    pytest.importorskip("submitit")
    output = str(tmp_path / "out")
    logs = str(tmp_path / "slurm")
    result = _cutfs(
        "pack", *lhotse_manifests, "-o", output, "--shard-size", SHARD_SIZE,
        "--engine", "slurm", "--slurm-executor", "local", "--slurm-folder", logs,
        "--slurm-partition", "cpu", "--array-parallelism", "2", "--time-min", "30", "-q",
    )  # fmt: skip
    assert "packed" in result.stdout
    assert os.listdir(logs), "submitit wrote no job files"
    _assert_same_directory(output, shard_dir)


@pytest.mark.slow
def test_the_ray_engine_on_a_local_instance_gives_the_one_process_pack(
    lhotse_manifests: list[str], shard_dir: str, tmp_path: Path
) -> None:
    """Its session files (sockets, logs, spilled objects) go to a private directory of the
    user who packs, not to Ray's default ``/tmp/ray``, which every user of the node shares."""
    pytest.importorskip("ray")
    output = str(tmp_path / "out")
    shared = Path("/tmp/ray")
    sessions_before = set(shared.glob("session_2*")) if shared.is_dir() else set()
    result = _cutfs(
        "pack", *lhotse_manifests, "-o", output, "--shard-size", SHARD_SIZE, "--engine", "ray",
        "-q",
    )  # fmt: skip
    assert "packed" in result.stdout
    _assert_same_directory(output, shard_dir)
    if shared.is_dir():
        assert set(shared.glob("session_2*")) == sessions_before
    private = Path(private_ray_directory())
    assert private.stat().st_mode & 0o777 == 0o700 and private.stat().st_uid == os.geteuid()
    assert list((private / "ray").glob("session_2*"))  # Ray's own directory is mode 0777


@needs_root
@pytest.mark.parametrize("forgery", ["another user's table", "a group-writable table"])
def test_commit_merges_only_partitions_its_user_wrote(
    lhotse_manifests: list[str], tmp_path: Path, forgery: str
) -> None:
    """A group packs into a shared output: a member who can write ``_parts`` replaces a
    partition's cuts table with one of the same layout (other times, so other audio under
    the plan's cut ids), or finds it writable by the group.  The commit refuses, naming
    the file, and writes no manifest; before, it merged the member's table."""
    output = tmp_path / "out"
    partitions = _plan(lhotse_manifests, str(output))
    _cutfs("pack", "run", str(output), "--partition", f"0-{partitions - 1}")
    table = output / "_parts" / "part-000000.cuts.arrow"
    with pa.memory_map(str(table)) as source:
        cuts = pa.ipc.open_file(source).read_all()
    index = cuts.schema.get_field_index("start_frame")
    shifted = pc.add(cuts.column(index), pa.scalar(16000, pa.int64()))
    forged = tmp_path / "forged.arrow"
    with pa.OSFile(str(forged), "wb") as sink, pa.ipc.new_file(sink, cuts.schema) as writer:
        writer.write_table(cuts.set_column(index, cuts.schema.field(index), shifted))
    if forgery == "another user's table":
        os.chown(forged, other_uid(), other_gid())
        forged.chmod(0o644)
    else:
        forged.chmod(0o664)
    forged.replace(table)
    refused = _cutfs("pack", "commit", str(output), check=False)
    assert refused.returncode == 1
    assert "could have been written by another user" in refused.stderr
    assert "part-000000.cuts.arrow" in refused.stderr
    assert not (output / "manifest.json").exists()


@pytest.mark.slow
def test_submitits_pickles_never_lie_in_a_shared_output(
    lhotse_manifests: list[str], tmp_path: Path
) -> None:
    """A group packs into a shared project directory: submitit's pickles (which it
    unpickles) go to a private folder of the user who packs, never into the output, and a
    --slurm-folder that others can write is refused."""
    pytest.importorskip("submitit")
    shared = tmp_path / "project"
    shared.mkdir()
    shared.chmod(0o2777)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    arguments = [*CUTFS, "pack", *lhotse_manifests, "-o", str(shared / "out")]
    arguments += ["--shard-size", SHARD_SIZE, "--engine", "slurm", "--slurm-executor", "local"]
    environment = {**os.environ, "HOME": str(home)}
    open_folder = shared / "slurm"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    refused = subprocess.run(
        [*arguments, "--slurm-folder", str(open_folder)],
        env=environment, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert refused.returncode == 1
    assert "writable by its group or others" in refused.stderr
    assert not (shared / "out").exists()
    packing = subprocess.Popen(
        arguments, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    in_output, in_home = set(), set()
    while packing.poll() is None:
        in_output.update(str(p) for p in shared.rglob("*.pkl"))
        in_home.update(str(p) for p in (home / ".cache").rglob("*.pkl"))
        time.sleep(0.05)
    _, errors = packing.communicate()
    assert packing.returncode == 0, errors
    assert in_output == set()
    assert in_home, "submitit's pickles were never seen in the private folder"
    folders = home / ".cache" / "cutfs" / "slurm"
    assert list(folders.iterdir()) == []  # removed once the pack was committed
