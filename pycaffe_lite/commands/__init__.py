"""Subcommands of ``pycaffe-lite`` (one module per command, discovered by :mod:`pycaffe_lite.commands.cli`).

A command module defines ``NAME`` (the subcommand), ``HELP`` (one line), ``add_arguments(parser)``
and ``run(args) -> int`` (the exit code). Modules whose name starts with ``_`` are skipped.
Raise :class:`pycaffe_lite.errors.CaffeError` (or a subclass) for user errors: the CLI prints the
message without a traceback and exits with status 1. The helpers below keep flags uniform.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
from types import ModuleType

from .. import common
from ..conv import engines as conv_engines
from ..errors import CaffeError, GPUUnavailableError
from ..precision import PRECISIONS, check_precision_name

log = logging.getLogger("pycaffe_lite")

REQUIRED = ("NAME", "HELP", "add_arguments", "run")


SUPPORT = {"cli", "caffe_cli", "gflags", "digits", "imagenet"}  # the front ends and their helpers, not commands


def discover() -> list[ModuleType]:
    """Every command module of this package, sorted by command name.

    A module that fails to import, or lacks one of ``NAME``, ``HELP``, ``add_arguments``, ``run``,
    is skipped with a warning naming it, so one broken command does not disable the others.
    """
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in SUPPORT:
            continue
        try:
            module = importlib.import_module(f"{__name__}.{info.name}")
        except Exception as exc:  # a broken plug-in must not take the whole CLI down
            log.warning("pycaffe-lite: skipping command module '%s': import failed: %s", info.name, exc)
            continue
        missing = [attr for attr in REQUIRED if not hasattr(module, attr)]
        if missing:
            log.warning("pycaffe-lite: skipping command module '%s': it lacks %s", info.name, ", ".join(missing))
            continue
        found.append(module)
    return sorted(found, key=lambda m: m.NAME)


def flag(parser: argparse.ArgumentParser, name: str, **kwargs) -> argparse.Action:
    """Add ``--name`` with Caffe's single-dash spelling ``-name`` as an alias (``-solver x``,
    ``--solver=x`` and ``-solver=x`` all work, as with Caffe's gflags)."""
    return parser.add_argument(f"--{name}", f"-{name}", dest=name.replace("-", "_"), **kwargs)


def add_gpu_argument(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    flag(parser, "gpu", metavar="N", default=None,
         help=help_text or "run in GPU mode on device N (Caffe also accepts 'all' or a list; one device is used)")
    flag(parser, "autotune-cache", metavar="FILE.json", default=None,
         help="GPU: keep the convolution autotune in this file: loaded at the first convolution, saved after "
              "each new tuning (default: $PYCAFFE_LITE_AUTOTUNE_CACHE)")


def parse_gpu(value: str | None) -> int | None:
    """The device id from a ``--gpu`` value: ``"0"`` -> 0, ``"all"`` -> 0, None -> None (CPU).

    Several ids (``"0,1"``) are rejected: pycaffe-lite trains on one GPU.
    """
    if value is None or value == "":
        return None
    value = str(value).strip()
    if value == "all":
        return 0
    ids = [v for v in value.split(",") if v.strip()]
    if len(ids) != 1:
        raise CaffeError(f"--gpu {value}: multi-GPU runs are not supported; give one device id")
    try:
        device = int(ids[0])
    except ValueError:
        raise CaffeError(f"--gpu {value}: expected a device id (an integer) or 'all'") from None
    if device < 0:
        raise CaffeError(f"--gpu {value}: device ids are >= 0 (Caffe's -1 means CPU: omit --gpu)")
    return device


def use_device(device: int | None, autotune_cache: str | None = None) -> None:
    """GPU mode on ``device`` (raises GPUUnavailableError with the reason), or CPU mode for None;
    ``autotune_cache``: the convolution autotune file (:func:`~pycaffe_lite.conv.engines.use_cache_file`)."""

    if autotune_cache:
        conv_engines.use_cache_file(autotune_cache)
    if device is None:
        log.info("Use CPU.")
        common.set_mode_cpu()
        return
    log.info("Use GPU with device ID %d", device)
    common.set_device(device)
    try:
        common.set_mode_gpu()
    except GPUUnavailableError:
        raise
    except CaffeError as exc:
        raise GPUUnavailableError(f"cannot use GPU {device}: {exc}") from None


def add_net_state_arguments(parser: argparse.ArgumentParser) -> None:
    """``--level`` and ``--stage`` (comma-separated) select layers by NetStateRule, as in Caffe."""
    flag(parser, "level", type=int, default=0, help="net state level (default 0)")
    flag(parser, "stage", default="", help="comma-separated net state stages")


def stages(args: argparse.Namespace) -> list[str]:
    return [s for s in (getattr(args, "stage", "") or "").split(",") if s]


PRECISION_HELP = ("fp32 (exact float32, TF32 off), tf32 (float32 with TF32 tensor cores; GPU), fp16 or bf16 "
                  "(a net file without type fields stores its blobs and weights in half, computes in float32, "
                  "keeps float32 master weights; fp16 adds adaptive loss scaling); default: the file decides "
                  "(docs/precision.md)")


def add_precision_argument(parser: argparse.ArgumentParser) -> None:
    """``--precision fp32|tf32|fp16|bf16`` (default None: each net file's own fields decide)."""
    flag(parser, "precision", default=None, type=_precision_name, metavar="|".join(PRECISIONS), help=PRECISION_HELP)


def _precision_name(text: str) -> str | None:
    try:
        return check_precision_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def use_precision(name: str | None) -> None:
    """``--precision``: :func:`pycaffe_lite.common.set_precision` after :func:`use_device` (the
    nets built afterwards take it); ``tf32`` without a GPU is a CaffeError saying so."""
    if name is None:
        return
    try:
        common.set_precision(name)
    except GPUUnavailableError:
        raise CaffeError(f"--precision {name}: TF32 is a mode of the GPU's tensor cores: give --gpu N "
                         "(on the CPU float32 is exact: --precision fp32)") from None
    log.info("Precision: %s", name)
