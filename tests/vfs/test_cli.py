"""The command line's conventions: --version, help for every argument, completion, man page,
and the Prometheus form of a mount's statistics."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import av
import pyarrow
import pyfuse3
import pytest
from support.mounts import CUTFS

from cutfs.vfs.cli.command import _parser

REPOSITORY = Path(__file__).resolve().parents[2]


def _run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CUTFS, *arguments], capture_output=True, text=True, check=False)


def test_version_names_the_libraries_that_decide_what_is_served() -> None:
    result = _run("--version")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("cutfs ")
    assert f"pyarrow {pyarrow.__version__}" in lines
    assert any(line.startswith(f"PyAV {av.__version__} (FFmpeg ") for line in lines)
    assert any(line.startswith(f"pyfuse3 {pyfuse3.__version__} (libfuse 3.") for line in lines)


def _all_actions(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                found += [(f"{name} {n}", a) for n, a in _all_actions(subparser)]
        else:
            found.append((action.dest, action))
    return found


def test_every_argument_has_help() -> None:
    missing = [name for name, action in _all_actions(_parser()) if not action.help]
    assert missing == []


def test_pack_help_names_every_source_format() -> None:
    text = _run("pack", "--help").stdout.replace("\n", " ")
    for source_format in ("Lhotse", "Shar", "Kaldi", "HuggingFace", "Parquet", "WebDataset"):
        assert source_format in text
    assert "directory of audio files" in " ".join(text.split())


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_parse_and_know_the_options(shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    result = _run("completion", shell)
    assert result.returncode == 0
    assert "--allow-commands" in result.stdout and "--index-cache-size" in result.stdout
    syntax = subprocess.run(
        [shell, "-n"], input=result.stdout, capture_output=True, text=True, check=False
    )
    assert syntax.returncode == 0, syntax.stderr


def test_the_committed_man_page_is_generated_from_the_parser() -> None:
    generated = _run("manpage").stdout
    assert generated == (REPOSITORY / "docs" / "cutfs.1").read_text(), "run: cutfs manpage"
    for option in ("--allow-root", "--read-timeout", "--prometheus", "--version"):
        assert option.replace("-", "\\-") in generated
    if shutil.which("man") is not None:
        rendered = subprocess.run(
            ["man", "-l", "-"], input=generated, capture_output=True, text=True, check=False
        )
        assert rendered.returncode == 0 and rendered.stderr == ""
        assert "--allow-commands" in rendered.stdout


def test_the_readme_lists_every_mount_option_as_declared() -> None:
    """README's table of mount options is the one made from their declarations."""
    readme = (REPOSITORY / "README.md").read_text()
    begin = readme.index("<!-- mount options:")
    table = readme[readme.index("\n", begin) + 1 : readme.index("<!-- end of mount options -->")]
    assert table == _run("manpage", "--markdown").stdout, "run: cutfs manpage --markdown"
    assert "| `--cache-size BYTES` | `cache_size=BYTES` | 512M |" in table


def test_every_mount_option_has_one_flag_one_key_and_parses_its_own_default() -> None:
    from cutfs.vfs.cli.mount_arguments import declared  # noqa: PLC0415

    flags, keys = [], []
    for declared_field, spelling in declared():
        flags.append(spelling.flag)
        keys.append(spelling.key)
        default = declared_field.default
        if spelling.parse is not None and default not in (None, ()) and spelling.show is not str:
            assert spelling.parse(spelling.show(default)) == default, spelling.flag
    assert len(set(flags)) == len(flags) and len(set(keys)) == len(keys)


@pytest.mark.parametrize(
    ("o_options", "expected"),
    [
        ("cache_size=2G,serving_processes=3", {"cache_bytes": 2 << 30, "serving_processes": 3}),
        ("no_decode_in_turn,workers=2", {"decode_in_turn": False, "workers": 2}),
        ("allow_root=/a,allow_root=/b", {"allowed_roots": ("/a", "/b")}),
        ("ro,nosuid,x-systemd.automount,file_mode=0440", {"file_mode": 0o440}),
    ],
)
def test_o_options_fold_into_the_same_mount_options_as_flags(
    o_options: str, expected: dict[str, object]
) -> None:
    from cutfs.vfs.cli.mount_arguments import fold_o_options, mount_options  # noqa: PLC0415

    args = _parser().parse_args(["mount", "src", "mnt", "-o", o_options])
    fold_o_options(args, args.options)
    options = mount_options(args)
    for name, value in expected.items():
        assert getattr(options, name) == value


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--window", "5", "--overlap", "5"], "windows need 0 <= overlap < length"),
        (["--sample-rate", "0"], "the sample rate must lie in [1, 768000] Hz"),
        (["--max-entries", "0"], "the entries limit must be positive"),
    ],
)
def test_options_no_mount_can_serve_with_are_usage_errors_before_a_daemon_starts(
    tmp_path: Path, options: list[str], message: str
) -> None:
    result = _run("mount", str(tmp_path), str(tmp_path), *options)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "daemon" not in result.stderr  # said by the command itself


def test_the_commands_start_without_importing_what_they_do_not_run() -> None:
    """`cutfs mount` starts a daemon from a command that imports neither pyarrow, av, numpy,
    trio nor pyfuse3 (0.8 s on this machine before): only the command it runs does."""
    probe = (
        "import sys\n"
        "from cutfs.vfs.cli.command import _parser\n"
        "from cutfs.vfs.cli.mount_arguments import mount_options\n"
        "args = _parser().parse_args(['mount', 'a', 'b', '--window', '5', '--mono'])\n"
        "mount_options(args).check()\n"
        "heavy = {'pyarrow', 'av', 'numpy', 'trio', 'pyfuse3', 'tqdm', 'botocore'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
