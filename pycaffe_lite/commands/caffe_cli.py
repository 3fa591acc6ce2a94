"""The ``caffe`` command and BVLC's tools, with BVLC's exact command lines (gflags syntax).

``caffe train -solver S [-weights W | -snapshot S.solverstate] [-gpu 0]``, ``caffe test -model M
-weights W [-iterations N]``, ``caffe time -model M [-iterations N] [-phase TRAIN|TEST]`` (the three
also take pycaffe-lite's ``-precision fp32|tf32|fp16|bf16``),
``caffe device_query -gpu N``, and every tool of BVLC's ``tools/`` both as ``caffe <tool> ...`` and
as its own console script (``convert_imageset ...``). Flags are parsed by :mod:`pycaffe_lite.commands.gflags`;
the work is done by the ``pycaffe-lite`` command modules of :mod:`pycaffe_lite.commands` (one
implementation, two front ends). glog's flags set up logging: ``-log_dir DIR`` writes glog's files
(``caffe.<host>.<user>.log.INFO.<yyyymmdd-hhmmss>.<pid>`` and the ``caffe.INFO`` link).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import glog
from ..precision import check_precision_name
from ..version import __version__
from ._errors import run_guarded
from .gflags import GLOG_FLAGS, Flag, FlagError, Parsed, parse, usage

log = logging.getLogger("pycaffe_lite")

# BVLC's caffe.cpp flags (global to the binary: every action accepts them all)
CAFFE_FLAGS = {
    f.name: f for f in (
        Flag("gpu", str, "", "Optional; run in GPU mode on given device IDs separated by ','. "
             "Use '-gpu all' to run on all available GPUs."),
        Flag("cpu", bool, False, "Optional; train on the CPU even when the solver says solver_mode: GPU "
             "(pycaffe-lite's own; without -gpu, a solver's GPU mode falls back to the CPU with a warning "
             "when no GPU can be used)"),
        Flag("solver", str, "", "The solver definition protocol buffer text file."),
        Flag("model", str, "", "The model definition protocol buffer text file."),
        Flag("phase", str, "", "Optional; network phase (TRAIN or TEST). Only used for 'time'."),
        Flag("level", int, 0, "Optional; network level."),
        Flag("stage", str, "", "Optional; network stages (not to be confused with phase), separated by ','."),
        Flag("snapshot", str, "", "Optional; the snapshot solver state to resume training."),
        Flag("weights", str, "", "Optional; the pretrained weights to initialize finetuning, separated by ','. "
             "Cannot be set simultaneously with snapshot."),
        Flag("iterations", int, 50, "The number of iterations to run."),
        Flag("sigint_effect", str, "stop", "Optional; action to take when a SIGINT signal is received: "
             "snapshot, stop or none."),
        Flag("sighup_effect", str, "snapshot", "Optional; action to take when a SIGHUP signal is received: "
             "snapshot, stop or none."),
        Flag("precision", str, "", "Optional; fp32, tf32, fp16 or bf16: the precision the nets are built in "
             "(pycaffe-lite's own; default: each net file's type fields decide, see docs/precision.md)."),
    )
}

ACTION_FLAGS = {
    "train": ("solver", "gpu", "cpu", "snapshot", "weights", "level", "stage", "sigint_effect", "sighup_effect",
              "precision"),
    "test": ("model", "weights", "iterations", "gpu", "level", "stage", "precision"),
    "time": ("model", "iterations", "gpu", "phase", "level", "stage", "precision"),
    "device_query": ("gpu",),
}
ACTION_HELP = {
    "train": "train or finetune a model",
    "test": "score a model",
    "device_query": "show GPU diagnostic information",
    "time": "benchmark model execution time",
}

# BVLC's tools: module of pycaffe_lite.commands with GFLAGS, POSITIONAL, USAGE and run(args)
TOOLS = (
    "compute_image_mean", "convert_cifar_data", "convert_imageset", "convert_mnist_data",
    "convert_mnist_siamese_data", "extract_features", "upgrade_net_proto_binary", "upgrade_net_proto_text",
    "upgrade_solver_proto_text",
)


@dataclass
class Command:
    name: str
    flags: tuple[Flag, ...]
    run: Callable[[Parsed], int]
    usage: str


def _tool_module(name: str):
    return importlib.import_module(f"{__package__}.{name}")


def _all_flags() -> list[Flag]:
    """Every flag this front end defines (BVLC's flags are global: a command accepts the others')."""
    flags = list(CAFFE_FLAGS.values())
    for name in TOOLS:
        flags.extend(_tool_module(name).GFLAGS)
    return flags


# -- caffe's actions run the pycaffe-lite command modules ------------------------------------
def _run_module(module_name: str, argv: list[str]) -> int:
    module = importlib.import_module(f"{__package__}.{module_name}")
    parser = argparse.ArgumentParser(prog=f"caffe {module_name}")
    module.add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        raise FlagError(f"bad arguments for {module_name}: {' '.join(argv)}") from exc
    return int(module.run(args) or 0)


def _state_argv(p: Parsed) -> list[str]:
    argv = ["--level", str(p.level)]
    if p.stage:
        argv += ["--stage", p.stage]
    if p.gpu:
        argv += ["--gpu", p.gpu]
    if p.precision:
        try:
            argv += ["--precision", str(check_precision_name(p.precision))]
        except ValueError as exc:
            raise FlagError(f"-precision: {exc}") from None
    return argv


def _train(p: Parsed) -> int:
    if not p.solver:
        raise FlagError("Need a solver definition to train.")
    if p.snapshot and p.weights:
        raise FlagError("Give a snapshot to resume training or weights to finetune but not both.")
    for name in ("sigint_effect", "sighup_effect"):
        if p.values[name] not in ("stop", "snapshot", "none"):
            raise FlagError(f'Invalid signal effect "{p.values[name]}" was specified')
    argv = ["--solver", p.solver, "--sigint_effect", p.sigint_effect, "--sighup_effect", p.sighup_effect]
    if p.snapshot:
        argv += ["--snapshot", p.snapshot]
    if p.weights:
        argv += ["--weights", p.weights]
    if p.cpu:
        argv.append("--cpu")
    return _run_module("train", argv + _state_argv(p))


def _test(p: Parsed) -> int:
    if not p.model:
        raise FlagError("Need a model definition to score.")
    if not p.weights:
        raise FlagError("Need model weights to score.")
    return _run_module("test", ["--model", p.model, "--weights", p.weights, "--iterations", str(p.iterations),
                                *_state_argv(p)])


def _time(p: Parsed) -> int:
    if not p.model:
        raise FlagError("Need a model definition to time.")
    phase = p.phase or "TRAIN"
    if phase not in ("TRAIN", "TEST"):
        raise FlagError('phase must be "TRAIN" or "TEST"')
    return _run_module("time", ["--model", p.model, "--iterations", str(p.iterations), "--phase", phase,
                                *_state_argv(p)])


def _device_query(p: Parsed) -> int:
    if not p.gpu:
        raise FlagError("Need a device ID to query (-gpu N or -gpu all).")
    return _run_module("device_query", ["--gpu", p.gpu])


_ACTIONS: dict[str, Callable[[Parsed], int]] = {
    "train": _train, "test": _test, "time": _time, "device_query": _device_query,
}


def _command(name: str) -> Command | None:
    if name in _ACTIONS:
        flags = tuple(CAFFE_FLAGS[f] for f in ACTION_FLAGS[name])
        return Command(name, flags, _ACTIONS[name], f"caffe {name} [FLAGS]: {ACTION_HELP[name]}")
    if name in TOOLS:
        module = _tool_module(name)

        def run_tool(p: Parsed, module=module) -> int:
            return int(module.run(module.namespace(p)) or 0)

        return Command(name, tuple(module.GFLAGS), run_tool, module.USAGE)
    return None


def _caffe_usage() -> str:
    lines = ["caffe: command line brew", "usage: caffe <command> <args>", "", "commands:"]
    lines += [f"  {name:<14}{ACTION_HELP[name]}" for name in ("train", "test", "device_query", "time")]
    lines += ["", "tools (also their own commands):"] + [f"  {name}" for name in TOOLS]
    lines += ["", "  bvlc-layout DIR [-force]: make DIR/build/tools/* and DIR/build/examples/*/*.bin run these"]
    lines += ["", "  Flags from tools/caffe.cpp:", usage(CAFFE_FLAGS.values())]
    return "\n".join(lines)


def setup_logging(p: Parsed, program: str) -> None:
    """glog's flags: ``-minloglevel`` filters everything; stderr gets every message with
    ``-logtostderr``/``-alsologtostderr`` (caffe's default), else those at ``-stderrthreshold`` and up;
    ``-log_dir`` (or ``$GLOG_log_dir``) adds glog's files unless ``-logtostderr``."""
    level = min(max(int(p.minloglevel), 0), 3)
    glog.init_log(level)
    if p.logtostderr or p.alsologtostderr:
        glog.set_stderr_level(level)
    else:
        glog.set_stderr_level(max(level, int(p.stderrthreshold)))
    glog.close_log_files()
    if p.log_dir and not p.logtostderr:
        glog.log_to_files(p.log_dir, program)


def run(argv: Sequence[str], program: str = "caffe") -> int:
    """Run ``program`` (``caffe`` or a tool's name) with ``argv`` (without the program name)."""
    argv = list(argv)
    name = program
    if program == "caffe" and argv and argv[0] in ("bvlc-layout", "bvlc_layout"):
        from . import cli  # pycaffe-lite's own command (argparse flags: DIR [--force])

        return cli.main(["bvlc-layout", *argv[1:]])
    if program == "caffe":
        # gflags takes the flags out first: the action is the first positional argument, so flags may
        # also come before it (caffe -gpu 0 train -solver s.prototxt)
        try:
            first = parse(argv, _all_flags(), command="caffe").positional
        except FlagError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 1
        if not first:
            if any(a.lstrip("-") == "version" for a in argv):
                print(f"caffe version {__version__} (pycaffe-lite)")
                return 0
            print(_caffe_usage(), file=sys.stderr)
            return 1
        name = first[0]
    command = _command(name)
    if command is None:
        print(f"caffe: unknown action: {name}\nAvailable caffe actions: {', '.join(_ACTIONS)}, {', '.join(TOOLS)}",
              file=sys.stderr)
        return 1
    where = f"caffe {name}" if program == "caffe" else name
    own = {f.name for f in command.flags}
    try:
        p = parse(argv, command.flags, [f for f in _all_flags() if f.name not in own], command=where)
    except FlagError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    if program == "caffe":
        p.positional.pop(0)  # the action
    if p.help or p.helpshort:
        print(f"{command.usage}\n\n  Flags:\n{usage(command.flags)}\n\n  glog flags:\n{usage(GLOG_FLAGS)}")
        return 0
    if p.version:
        print(f"{name} version {__version__} (pycaffe-lite)")
        return 0
    log_name = "caffe" if program == "caffe" else name
    try:
        setup_logging(p, log_name)
    except OSError as exc:
        print(f"ERROR: {where}: -log_dir {p.log_dir}: {exc}", file=sys.stderr)
        return 1
    for warning in p.warnings:
        log.warning(warning)
    try:  # an error: one F line, on stderr and in the files (the traceback too with -debug)
        return run_guarded(where, lambda: command.run(p), lambda message: log.critical("%s: %s", where, message),
                           p.debug)
    finally:
        glog.close_log_files()  # (flushed at every line; closed so that a caller's later logging stays out)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``caffe`` console script."""
    return run(sys.argv[1:] if argv is None else argv, "caffe")


def _tool_entry(name: str) -> Callable[[], int]:
    def entry() -> int:
        return run(sys.argv[1:], name)

    entry.__name__ = name
    entry.__doc__ = f"The ``{name}`` console script (BVLC's tools/{name})."
    return entry


convert_imageset = _tool_entry("convert_imageset")
compute_image_mean = _tool_entry("compute_image_mean")
convert_cifar_data = _tool_entry("convert_cifar_data")
convert_mnist_data = _tool_entry("convert_mnist_data")
convert_mnist_siamese_data = _tool_entry("convert_mnist_siamese_data")
extract_features = _tool_entry("extract_features")
upgrade_net_proto_text = _tool_entry("upgrade_net_proto_text")
upgrade_net_proto_binary = _tool_entry("upgrade_net_proto_binary")
upgrade_solver_proto_text = _tool_entry("upgrade_solver_proto_text")


if __name__ == "__main__":
    sys.exit(main())
