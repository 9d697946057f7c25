"""The mount command's options, made from their declarations (see
:mod:`cutfs.vfs.daemon.mount_options`): the parser's arguments, the ``-o`` form that
mount(8) and fstab use, its help, the README's table and the keywords of
``cutfs.mounted``.

Nothing here holds a default: an option the user did not give is absent from the parsed
arguments (``None``) and the field's own default applies.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from dataclasses import Field
from typing import Any, Final, TypeVar

from cutfs.vfs.daemon.mount_options import DaemonOptions, MountOptions, Option, options_of

#: Standard mount(8) options that say nothing to cutfs (its mounts are always read-only,
#: nosuid and nodev); ``x-*`` options (systemd's) are ignored too.
IGNORED_OPTIONS: Final = frozenset(
    {
        "ro",
        "defaults",
        "auto",
        "noauto",
        "user",
        "nouser",
        "users",
        "nofail",
        "_netdev",
        "exec",
        "noexec",
        "suid",
        "nosuid",
        "dev",
        "nodev",
        "noatime",
        "relatime",
        "strictatime",
        "atime",
        "nodiratime",
        "async",
        "sync",
        "default_permissions",
    }
)
_Options = TypeVar("_Options", MountOptions, DaemonOptions)


def declared() -> Iterator[tuple[Field[Any], Option]]:
    """Every option of the mount command, daemon options first."""
    yield from options_of(DaemonOptions)
    yield from options_of(MountOptions)


def add_mount_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every declared option to ``parser`` (dest: the field's name; default: None)."""
    for declared_field, spelling in declared():
        names = [spelling.short, spelling.flag] if spelling.short else [spelling.flag]
        shown = spelling.describe_default(declared_field.default)
        help_text = f"{spelling.help} (default: {shown})" if shown else spelling.help
        arguments: dict[str, Any] = {"dest": declared_field.name, "default": None}
        if spelling.parse is None:
            action = argparse.BooleanOptionalAction if spelling.negatable else "store_true"
            parser.add_argument(*names, action=action, help=help_text, **arguments)
            continue
        parser.add_argument(
            *names,
            type=_argument_type(spelling),
            action="append" if spelling.repeated else "store",
            metavar=spelling.metavar,
            help=help_text,
            **arguments,
        )


def o_options_help() -> str:
    """The ``-o`` keys, as the help of ``-o`` lists them."""
    keys = ["ro"]
    for _, spelling in declared():
        if spelling.parse is None:
            keys.append(spelling.key)
            if spelling.negatable:
                keys.append(f"no_{spelling.key}")
        else:
            keys.append(f"{spelling.key}={spelling.metavar}")
    return (
        "mount(8)-style options, comma-separated, each the long option without dashes: "
        + ", ".join(keys)
    )


def fold_o_options(args: argparse.Namespace, groups: list[str]) -> None:
    """Fold ``-o key=value,...`` groups into the parsed arguments (``-o`` wins).

    Raises ValueError naming the option for an unknown key, a value where none is taken
    or none where one is, a bad value, and ``rw`` (mounts are read-only)."""
    by_key = {spelling.key: (declared_field, spelling) for declared_field, spelling in declared()}
    for group in groups:
        for text in filter(None, (part.strip() for part in group.split(","))):
            key, has_value, value = text.partition("=")
            if key == "rw":
                raise ValueError("cutfs mounts are read-only: drop the 'rw' option")
            if key in IGNORED_OPTIONS or key.startswith("x-"):
                continue
            negated = key.startswith("no_") and key[3:] in by_key and by_key[key[3:]][1].negatable
            found = by_key.get(key[3:] if negated else key)
            if found is None:
                raise ValueError(f"unknown mount option {text!r}")
            declared_field, spelling = found
            if spelling.parse is None:
                if has_value:
                    raise ValueError(f"mount option {key!r} takes no value: {text!r}")
                setattr(args, declared_field.name, not negated)
                continue
            if not has_value:
                raise ValueError(f"mount option {key!r} needs a value: {text!r}")
            try:
                parsed = spelling.parse(value)
            except ValueError as exc:
                raise ValueError(f"bad value in mount option {text!r}: {exc}") from None
            if spelling.repeated:
                parsed = [*(getattr(args, declared_field.name) or []), parsed]
            setattr(args, declared_field.name, parsed)


def mount_options(args: argparse.Namespace) -> MountOptions:
    """The :class:`MountOptions` the parsed arguments give."""
    return _build(MountOptions, args)


def daemon_options(args: argparse.Namespace) -> DaemonOptions:
    """The :class:`DaemonOptions` the parsed arguments give."""
    return _build(DaemonOptions, args)


def flags_for(keywords: Mapping[str, Any]) -> list[str]:
    """Command-line flags for ``cutfs.mounted``'s keywords, which are the ``-o`` keys:
    ``True`` gives a switch, ``False`` its ``--no-`` form (or nothing), ``None`` nothing, a
    list or tuple repeats the option.  Raises TypeError for a keyword that is no option."""
    by_key = {spelling.key: spelling for _, spelling in declared()}
    flags: list[str] = []
    for key, value in keywords.items():
        spelling = by_key.get(key)
        if spelling is None:
            raise TypeError(f"cutfs.mounted() got an unknown option {key!r}")
        for item in value if isinstance(value, list | tuple) else [value]:
            if item is True:
                flags.append(spelling.flag)
            elif item is False:
                if spelling.negatable:
                    flags.append("--no-" + spelling.flag.removeprefix("--"))
            elif item is not None:
                flags += [spelling.flag, str(item)]
    return flags


def markdown_table() -> str:
    """The table of mount options in README.md: option, ``-o`` form, default, meaning."""
    rows = ["| option | `-o` form | default | meaning |", "|---|---|---|---|"]
    for declared_field, spelling in declared():
        if spelling.parse is None:
            flag, o_form = f"`{spelling.flag}`", f"`{spelling.key}`"
            if spelling.negatable:
                flag += f", `--no-{spelling.flag.removeprefix('--')}`"
                o_form += f", `no_{spelling.key}`"
        else:
            flag = f"`{spelling.flag} {spelling.metavar}`"
            o_form = f"`{spelling.key}={spelling.metavar}`"
        shown = spelling.describe_default(declared_field.default) or "-"
        rows.append(f"| {flag} | {o_form} | {shown} | {spelling.help} |")
    return "\n".join(rows) + "\n"


def _build(cls: type[_Options], args: argparse.Namespace) -> _Options:
    given: dict[str, Any] = {}
    for declared_field, spelling in options_of(cls):
        value = getattr(args, declared_field.name, None)
        if value is not None:
            given[declared_field.name] = tuple(value) if spelling.repeated else value
    return cls(**given)


def _argument_type(spelling: Option) -> Any:
    """``spelling.parse`` as argparse wants it: its ValueError becomes a usage error."""
    parse = spelling.parse
    assert parse is not None

    def argument(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    argument.__name__ = spelling.metavar or "value"
    return argument
