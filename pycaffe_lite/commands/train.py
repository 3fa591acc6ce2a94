"""``pycaffe-lite train --solver S [--weights W | --snapshot STATE] [--gpu N] [--precision P] [--no-progress]``.

As ``caffe train``: the solver file's ``solver_mode: GPU`` (with ``device_id``) applies when no
``--gpu`` is given; where no GPU can be used it falls back to the CPU with one warning line
(``--cpu`` trains on the CPU without it). SIGINT (Ctrl-C) stops training after the current iteration and writes a
snapshot first (a second Ctrl-C aborts at once); SIGHUP writes a snapshot and continues. SIGTERM
(what Slurm, Kubernetes and spot instances send before they preempt a job) writes a snapshot after
the current iteration and ends the run, so it can be resumed with ``--snapshot``. The effects can be
changed with ``--sigint_effect`` / ``--sighup_effect`` (stop, snapshot, none) and ``--sigterm_effect``
(snapshot or stop: snapshot, then end; none: ignore; exit: end at once without a snapshot). With
several GPUs the launcher forwards the signals and the ranks agree on the iteration to act at.
``--precision fp32|tf32|fp16|bf16`` builds the train and test nets in that precision
(:func:`pycaffe_lite.common.set_precision`; docs/precision.md); ``--weights`` from an fp32
``.caffemodel`` are rounded into half params once, the solver keeps float32 master weights.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from typing import TYPE_CHECKING

from ..errors import CaffeError, GPUUnavailableError, PrototxtError
from ..parallel import launch
from ..solvers.sgd_solvers import solver_class
from ..solvers.solver import check_state_file, load_solver_param
from . import (
    add_gpu_argument,
    add_net_state_arguments,
    add_precision_argument,
    flag,
    parse_gpu,
    stages,
    use_device,
    use_precision,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any, TypeAlias

    # what signal.signal() takes and returns
    _Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

NAME = "train"
HELP = "train or finetune a model from a solver prototxt"
EFFECTS = ("stop", "snapshot", "none")
TERM_EFFECTS = ("snapshot", "stop", "none", "exit")

log = logging.getLogger("pycaffe_lite")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flag(parser, "solver", required=True, metavar="SOLVER.prototxt", help="the solver definition")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--weights", "-weights", dest="weights", metavar="W.caffemodel[,W2...]",
                       help="initialize from these weights (finetuning)")
    group.add_argument("--snapshot", "-snapshot", dest="snapshot", metavar="STATE.solverstate",
                       help="resume training from this solver state")
    add_gpu_argument(parser, "GPU mode on device N; a list (0,1) or 'all' trains on several GPUs, one process "
                             "each, with the prototxt's batch size per GPU (needs NCCL)")
    launch.add_arguments(parser)  # multi-GPU: --nccl-init, --world-size, --rank
    parser.add_argument("--cpu", "-cpu", dest="cpu", action="store_true",
                        help="train on the CPU even when the solver says solver_mode: GPU")
    add_net_state_arguments(parser)
    add_precision_argument(parser)
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                        help="no progress bar (it is shown only when stderr is a terminal anyway)")
    parser.add_argument("--allow-nonfinite", dest="allow_nonfinite", action="store_true",
                        help="keep training when the loss becomes NaN or infinite (BVLC's behaviour)")
    flag(parser, "sigint_effect", choices=EFFECTS, default="stop",
         help="on SIGINT: stop (after writing a snapshot; default), snapshot, or none")
    flag(parser, "sighup_effect", choices=EFFECTS, default="snapshot",
         help="on SIGHUP: snapshot (default), stop, or none")
    flag(parser, "sigterm_effect", choices=TERM_EFFECTS, default="snapshot",
         help="on SIGTERM (preemption): snapshot (default) or stop: write a snapshot after this iteration, "
              "then end; none: ignore; exit: end at once without a snapshot")
    parser.add_argument("--allow-missing", dest="allow_missing", action="store_true",
                        help="with --snapshot: resume even when the net has layers with params that the "
                             "snapshot's weights lack (they restart from their initial values)")


class _Signals:
    """Turns SIGINT/SIGHUP into solver actions polled by the training loop."""

    def __init__(self, sigint_effect: str, sighup_effect: str, sigterm_effect: str = "snapshot") -> None:
        self.effects: dict[int, str] = {signal.SIGINT: sigint_effect}
        if hasattr(signal, "SIGHUP"):
            self.effects[signal.SIGHUP] = sighup_effect
        if sigterm_effect != "exit":  # exit: Python's default handler ends the process at once
            # a preempted run must end: "snapshot" means snapshot, then stop (stop writes one too)
            self.effects[signal.SIGTERM] = "stop" if sigterm_effect == "snapshot" else sigterm_effect
        self.pending: list[int] = []
        self.previous: dict[int, _Handler] = {}
        self.stopped_by_signal = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)
        if signum == signal.SIGINT and self.effects[signum] == "stop":
            # A second Ctrl-C aborts immediately.
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def install(self) -> None:
        for sig in self.effects:
            try:
                self.previous[sig] = signal.signal(sig, self._handle)
            except (ValueError, OSError):  # not the main thread: no signal handling
                pass

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, OSError):
                pass

    def action(self) -> str:
        while self.pending:
            sig = self.pending.pop(0)
            effect = self.effects[sig]
            name = signal.Signals(sig).name
            if effect == "stop":
                log.info("%s received: stopping after this iteration%s.", name,
                         " (a snapshot is written first)" if sig == signal.SIGTERM else "")
                self.stopped_by_signal = True
                return "stop"
            if effect == "snapshot":
                log.info("%s received: writing a snapshot.", name)
                return "snapshot"
        return "none"


def run(args: argparse.Namespace) -> int:
    if not os.path.exists(args.solver):
        raise PrototxtError(f"{args.solver}: solver file not found")
    param, solver_dir = load_solver_param(args.solver)
    param.train_state.level = args.level
    param.train_state.stage.extend(stages(args))
    job = launch.plan(args)  # -- multi-GPU: several GPUs start one process each; a rank joins its run
    if isinstance(job, launch.Launch):
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return launch.run_launch(job, args, parser)
    session = launch.RankSession(job) if job is not None else None
    device = parse_gpu(args.gpu) if job is None else job.device
    if getattr(args, "cpu", False) and device is not None:
        raise CaffeError("--cpu and --gpu: give one of them")
    from_solver = False
    if device is None and not getattr(args, "cpu", False) and param.HasField("solver_mode") \
            and param.solver_mode == param.GPU:
        device, from_solver = param.device_id, True
    try:
        use_device(device, args.autotune_cache)
    except GPUUnavailableError as exc:
        if not from_solver:  # --gpu N asked for it: an error
            raise
        # BVLC: without -gpu the solver's mode decides (and a CPU-only build fails); here a machine
        # without a usable GPU trains on the CPU instead, with one line saying so
        log.warning("%s says solver_mode: GPU, but %s: training on the CPU (--cpu says so without this "
                    "warning; --gpu N insists on the GPU)", args.solver, str(exc).rstrip("."))
        use_device(None, args.autotune_cache)
    use_precision(getattr(args, "precision", None))
    if args.snapshot:
        check_state_file(args.snapshot, CaffeError)
    solver = solver_class(param.type)(param, progress=args.progress, solver_dir=solver_dir)
    solver.source = args.solver
    solver.stop_on_nonfinite_loss = not getattr(args, "allow_nonfinite", False)
    if args.snapshot:
        log.info("Resuming from %s", args.snapshot)
        solver.restore(args.snapshot, allow_missing=getattr(args, "allow_missing", False))
    elif args.weights:
        solver.load_weights(args.weights)
    if session is not None:
        session.attach(solver)
    signals = _Signals(args.sigint_effect, args.sighup_effect, getattr(args, "sigterm_effect", "snapshot"))
    solver.set_action_function(signals.action if session is None else session.agreed(signals.action, solver))
    log.info("Starting Optimization")
    signals.install()
    try:
        solver.solve()
        stopped = signals.stopped_by_signal or (session is not None and solver.requested_early_exit)
        if stopped and solver._last_snapshot_iter != solver.iter:
            solver.snapshot()
        if session is not None:
            session.close()  # (not after an error: the other ranks must see this one fail)
    finally:
        signals.restore()
    return 0
