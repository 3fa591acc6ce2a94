"""The ``pycaffe-lite`` command line (``python -m pycaffe_lite``), in the style of ``caffe``.

Subcommands come from the modules of :mod:`pycaffe_lite.commands` (see its docstring for the
contract), so new commands need no change here. User errors (any CaffeError, OSError or ValueError)
print one line, ``pycaffe-lite <command>: error: <message>``, and exit with status 1 (``--debug``
or ``PYCAFFE_LITE_DEBUG=1`` adds the traceback: :mod:`._errors`); usage errors exit with 2.
Logging goes to stderr in glog's layout; ``GLOG_minloglevel`` (0 INFO .. 3 FATAL) or ``--quiet``
raise the threshold.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import commands
from ..glog import env_level, init_log
from ..version import __version__
from ._errors import run_guarded

PROG = "pycaffe-lite"


def configure_logging(quiet: bool = False) -> None:
    """glog lines on stderr (:func:`pycaffe_lite.glog.init_log`); ``--quiet`` shows warnings and up."""
    init_log(max(1, env_level()) if quiet else env_level())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="pycaffe-lite: Caffe-compatible training and testing from the command line.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--quiet", "-q", action="store_true", help="log warnings and errors only")
    debug_help = "on an error, also print the Python traceback (also: PYCAFFE_LITE_DEBUG=1)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in commands.discover():
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help / usage errors
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    configure_logging(args.quiet)
    return run_guarded(f"{PROG} {args.command}", lambda: args._run(args),
                       lambda message: print(f"{PROG} {args.command}: error: {message}", file=sys.stderr), args.debug)


if __name__ == "__main__":
    sys.exit(main())
