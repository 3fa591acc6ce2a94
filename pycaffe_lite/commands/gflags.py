"""Command lines in Google gflags' syntax, as BVLC's ``caffe`` binary and tools take them.

``-name value``, ``-name=value``, ``--name value``, ``--name=value``; booleans as ``-name``,
``-noname``, ``-name=true|false|1|0|yes|no|t|f|y|n``; ``-flagfile=FILE`` (or ``-flagfile FILE``)
reads more arguments from FILE, one per line (``#`` comments and lines not starting with ``-`` are
skipped, as gflags does); ``--`` ends the flags. Positional arguments may stand anywhere (gflags
moves them after the flags). glog's flags take their defaults from ``GLOG_<name>`` in the
environment, as glog does (``GLOG_logtostderr=1 convert_imageset ...`` in BVLC's scripts).

A flag the command does not use but another command or tool of this front end defines (BVLC's
flags are global to a binary, so ``caffe time -weights W`` is legal) is accepted with a warning; an
unknown flag is an error naming it, as gflags' "unknown command line flag".
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import CaffeError


class FlagError(CaffeError):
    """A command line that gflags would refuse (unknown flag, bad value, missing argument)."""


@dataclass(frozen=True)
class Flag:
    """One flag: its name, kind (bool, int, float or str), default and help line."""

    name: str
    kind: type
    default: Any
    help: str = ""

    def convert(self, text: str, where: str = "") -> Any:
        if self.kind is bool:
            value = text.strip().lower()
            if value in ("true", "t", "yes", "y", "1"):
                return True
            if value in ("false", "f", "no", "n", "0"):
                return False
            raise FlagError(f"{where}illegal value '{text}' specified for bool flag '{self.name}'")
        try:
            return self.kind(text)
        except ValueError:
            kind = {int: "int32", float: "double"}.get(self.kind, self.kind.__name__)
            raise FlagError(f"{where}illegal value '{text}' specified for {kind} flag '{self.name}'") from None


# glog's flags (accepted by every command); their defaults also come from $GLOG_<name>.
GLOG_FLAGS = (
    Flag("log_dir", str, "", "write log files into this folder (BVLC's file names, glog's line format)"),
    Flag("logtostderr", bool, False, "log to stderr only, no log files"),
    Flag("alsologtostderr", bool, True, "log to stderr as well as to the files (caffe's default: true)"),
    Flag("stderrthreshold", int, 2, "copy messages of this severity and above to stderr (0 INFO .. 3 FATAL)"),
    Flag("minloglevel", int, 0, "log messages of this severity and above (0 INFO .. 3 FATAL)"),
    Flag("v", int, 0, "verbose logging level (VLOG)"),
    Flag("vmodule", str, "", "per-module verbose levels (accepted, not used)"),
    Flag("colorlogtostderr", bool, False, "(accepted, not used)"),
    Flag("logbuflevel", int, 0, "(accepted; files are flushed after every line)"),
    Flag("logbufsecs", int, 30, "(accepted; files are flushed after every line)"),
    Flag("max_log_size", int, 1800, "(accepted, not used)"),
    Flag("stop_logging_if_full_disk", bool, False, "(accepted, not used)"),
    Flag("log_prefix", bool, True, "(accepted; lines always carry glog's prefix)"),
)

# gflags' own flags.
HELP_FLAGS = (
    Flag("help", bool, False, "show help on the flags and exit"),
    Flag("helpshort", bool, False, "show help on this command's flags and exit"),
    Flag("version", bool, False, "show the version and exit"),
    Flag("debug", bool, False, "on an error, also print the Python traceback (also: PYCAFFE_LITE_DEBUG=1; "
         "pycaffe-lite's own)"),
)


@dataclass
class Parsed:
    """The result of :func:`parse`: flag values by name, positional arguments, warnings to log,
    and the names given on the command line (or in a flagfile)."""

    values: dict[str, Any]
    positional: list[str]
    warnings: list[str] = field(default_factory=list)
    given: set[str] = field(default_factory=set)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


_GLOG_NAMES = {f.name for f in GLOG_FLAGS}


def _env_default(flag: Flag, env: Mapping[str, str]) -> Any:
    key = f"GLOG_{flag.name}"
    if flag.name in _GLOG_NAMES and key in env:  # glog's flags only, as glog reads them
        return flag.convert(env[key], where=f"${key}: ")
    return flag.default


def _read_flagfile(path: str, depth: int) -> list[str]:
    if depth > 16:
        raise FlagError(f"-flagfile={path}: flagfiles nested more than 16 deep")
    try:
        with open(os.path.expanduser(path)) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise FlagError(f"-flagfile={path}: cannot read it: {exc.strerror or exc}") from None
    return [line.strip() for line in lines if line.strip().startswith("-")]


def _lookup(name: str, eq: str, own: Mapping[str, Flag], others: Mapping[str, Flag], where: str
            ) -> tuple[Flag, bool]:
    """The flag ``name`` names, and whether it is a boolean's ``-noname`` form; FlagError if none."""
    flag = own.get(name) or others.get(name)
    if flag is None and name.startswith("no"):
        candidate = own.get(name[2:]) or others.get(name[2:])
        if candidate is not None and candidate.kind is bool and not eq:
            return candidate, True
    if flag is None:
        raise FlagError(f"{where}unknown command line flag '{name}'")
    return flag, False


def parse(
    argv: Sequence[str],
    flags: Iterable[Flag],
    foreign: Iterable[Flag] = (),
    command: str = "",
    env: Mapping[str, str] | None = None,
) -> Parsed:
    """Parse ``argv`` (without the program name) against ``flags`` (glog's and gflags' help flags are
    added). ``foreign``: flags of other commands, accepted with a warning and otherwise ignored.
    ``command`` names the command in messages."""
    env = os.environ if env is None else env
    own: dict[str, Flag] = {}
    for f in (*flags, *GLOG_FLAGS, *HELP_FLAGS):
        own.setdefault(f.name, f)
    others = {f.name: f for f in foreign if f.name not in own}
    values = {name: _env_default(f, env) for name, f in own.items()}
    parsed = Parsed(values, [])
    where = f"{command}: " if command else ""
    args = list(argv)
    i, depth = 0, 0
    only_positional = False
    while i < len(args):
        arg = args[i]
        i += 1
        if only_positional or not arg.startswith("-") or arg == "-":
            parsed.positional.append(arg)
            continue
        if arg == "--":
            only_positional = True
            continue
        body = arg[2:] if arg.startswith("--") else arg[1:]
        name, eq, text = body.partition("=")
        if name == "flagfile":
            if not eq:
                if i >= len(args):
                    raise FlagError(f"{where}flag 'flagfile' is missing its argument")
                text, i = args[i], i + 1
            args[i:i] = _read_flagfile(text, depth)
            depth += 1
            continue
        flag, negated = _lookup(name, eq, own, others, where)
        if flag.kind is bool:
            value = (not negated) if not eq else flag.convert(text, where)
        else:
            if negated:
                raise FlagError(f"{where}boolean value specified for {flag.kind.__name__} flag '{flag.name}'")
            if not eq:
                if i >= len(args):
                    raise FlagError(f"{where}flag '{flag.name}' is missing its argument")
                text, i = args[i], i + 1
            value = flag.convert(text, where)
        if flag.name in own:
            values[flag.name] = value
            parsed.given.add(flag.name)
        else:
            parsed.warnings.append(f"{where}flag -{flag.name} is not used by this command; ignored")
    return parsed


def usage(flags: Iterable[Flag]) -> str:
    """One line per flag: ``-name (help) type: kind default: value``, gflags' --help layout."""
    lines = []
    for f in flags:
        kind = {bool: "bool", int: "int32", float: "double", str: "string"}[f.kind]
        default = f'"{f.default}"' if f.kind is str else str(f.default).lower() if f.kind is bool else f.default
        lines.append(f"    -{f.name} ({f.help}) type: {kind} default: {default}")
    return "\n".join(lines)
