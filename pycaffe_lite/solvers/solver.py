"""Solver base: the training loop of Caffe's ``Solver`` and the shared parts of ``SGDSolver``.

A solver is built from a ``SolverParameter`` (prototxt path or message). It creates the train net
and the test nets, then ``step(n)`` runs ``n`` iterations of: clear param diffs, (test every
``test_interval``), ``iter_size`` forward/backward passes, log every ``display``, apply the update
(lr policy, gradient clipping, 1/iter_size normalization, L1/L2 weight decay, the update rule,
``data -= diff``), snapshot every ``snapshot``. The update rules live in :mod:`sgd_solvers`.

Net paths in a solver file (``net``, ``train_net``, ``test_net``) are resolved as Caffe does,
relative to the current directory; when no such file exists there, the path relative to the solver
file's folder is tried as well (a pycaffe-lite convenience).

The compute mode is the process-wide one (``set_mode_cpu``/``set_mode_gpu``), as in pycaffe;
``solver_mode``/``device_id`` are applied by the command line (``pycaffe-lite train``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, cast

import numpy as np

from .. import common, threads
from ..bbox import mean_average_precision
from ..blob import Blob
from ..errors import CaffeError, PrototxtError, ShapeError, WeightsError
from ..glog import ensure_console_log
from ..net import Net
from ..net_builder import build_net, in_file
from ..net_graph import NetGraph
from ..optional import require
from ..proto import caffemodel, hdf5_weights, protoio
from ..runtime.executor import Executor
from ..schema import caffe_pb2
from . import checks as solver_checks
from . import snapshot
from .data_rate import DataRate
from .iteration import PlainIteration, ReplayedIteration
from .lr_policy import SolverConfigError
from .rules import SGD, Rule
from .update import Update

log = logging.getLogger("pycaffe_lite")

__all__ = ["Solver", "SolverConfigError", "load_solver_param", "SNAPSHOT", "STOP", "NONE"]

# Requests an action function may return (Caffe's SolverAction).
NONE, STOP, SNAPSHOT = "none", "stop", "snapshot"

_LEGACY_TYPES = {
    caffe_pb2.SolverParameter.SGD: "SGD",
    caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
    caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad",
    caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
    caffe_pb2.SolverParameter.ADADELTA: "AdaDelta",
    caffe_pb2.SolverParameter.ADAM: "Adam",
}


def upgrade_solver_param(param: caffe_pb2.SolverParameter, source: str = "<SolverParameter>") -> None:
    """Legacy ``solver_type`` enum -> ``type`` string (in place), as Caffe's UpgradeSolverType."""
    if not param.HasField("solver_type"):
        return
    legacy = _LEGACY_TYPES[param.solver_type]
    if param.HasField("type") and param.type != legacy:
        raise SolverConfigError(
            f"{source}: solver_type {caffe_pb2.SolverParameter.SolverType.Name(param.solver_type)} "
            f"conflicts with type '{param.type}' (give only `type`)"
        )
    param.type = legacy
    param.ClearField("solver_type")


def load_solver_param(
    source: str | os.PathLike | caffe_pb2.SolverParameter,
) -> tuple[caffe_pb2.SolverParameter, Path | None]:
    """(SolverParameter, folder of the solver file or None) from a path or a message (copied).

    As Caffe's ReadSolverParamsFromTextFileOrDie: ``solver_type`` is upgraded; a missing
    ``snapshot_prefix`` becomes the solver file's path without extension, and a prefix naming an
    existing directory gets the solver file's stem appended.
    """
    if isinstance(source, caffe_pb2.SolverParameter):
        param = caffe_pb2.SolverParameter()
        param.CopyFrom(source)
        upgrade_solver_param(param)
        return param, None
    path = Path(source)
    if not path.is_file():
        raise PrototxtError(f"{path}: solver file not found" if not path.exists() else f"{path}: not a file")
    param = protoio.read_text(path, caffe_pb2.SolverParameter())
    upgrade_solver_param(param, str(path))
    if not param.HasField("snapshot_prefix"):
        param.snapshot_prefix = str(path.with_suffix(""))
    elif os.path.isdir(param.snapshot_prefix):
        param.snapshot_prefix = os.path.join(param.snapshot_prefix, path.stem)
    return param, path.parent


def resolve_path(name: str, base_dir: Path | None) -> str:
    """``name`` if it exists (relative to the current directory), else relative to ``base_dir``."""
    if os.path.exists(name) or base_dir is None or os.path.isabs(name):
        return name
    alt = base_dir / name
    return str(alt) if alt.exists() else name


def check_state_file(path: str | os.PathLike, error: type[Exception]) -> None:
    """``error`` unless ``path`` is a readable regular file. A missing ``X.solverstate`` beside an
    existing ``X.solverstate.h5`` says so: BVLC's cifar10 ``train_full.sh`` names ``.solverstate``
    while its solvers snapshot with ``snapshot_format: HDF5`` (BVLC fails there too)."""
    path = str(path)
    if not os.path.exists(path) and os.path.isfile(path + ".h5"):
        raise error(f"{path}: solver state file not found; {path}.h5 exists (snapshot_format: HDF5 writes "
                    f".solverstate.h5): resume with --snapshot={path}.h5")
    protoio.check_regular_file(path, "solver state file", error)


def _read_binary_state(path: str) -> caffe_pb2.SolverState:
    """A binary .solverstate; WeightsError for a corrupt file or one holding no solver state."""
    try:
        state = protoio.read_binary(path, caffe_pb2.SolverState(), "solverstate")
    except PrototxtError as exc:
        raise WeightsError(str(exc)) from None
    if not state.learned_net and not state.history and not state.iter:
        raise WeightsError(_not_a_state(path))
    return state


def _not_a_state(path: str) -> str:
    """Why ``path`` (parsed as a SolverState without learned_net, history or iter) is refused."""
    net = caffe_pb2.NetParameter()
    try:
        net.ParseFromString(Path(path).read_bytes())
        weights = any(lp.blobs for lp in net.layer) or any(lp.blobs for lp in net.layers)
    except Exception:  # not a NetParameter either
        weights = False
    if weights:
        return (f"{path}: is a .caffemodel (weights of net '{net.name}'), not a solver state: pass it with "
                "--weights to finetune from it, or resume from the .solverstate written beside it")
    return f"{path}: holds no solver state (no learned_net, history or iteration): not a .solverstate file"


class Solver:
    """Base solver. Subclasses (``sgd_solvers``) name the update rule (:mod:`.rules`).

    ``Solver(solver_file_or_param, dtype=np.float32, progress=None, solver_dir=None)``;
    ``progress``: True/False forces the tqdm progress bar on/off, None shows it only when stderr
    is a terminal; without the bar the solver logs Caffe's glog lines to stderr (installing
    :func:`~pycaffe_lite.glog.init_log`'s handler unless logging is already configured); ``solver_dir``: where relative net paths are also looked up (default: the
    solver file's folder). ``weights`` in the SolverParameter are loaded into every net.
    Attributes: ``param``, ``net``, ``test_nets``, ``iter``, ``current_step``, ``history``; the
    training step runs on ``graph`` (the train net's :class:`~pycaffe_lite.net_graph.NetGraph`) and
    ``executor`` with ``update`` (:class:`~.update.Update`), not through pycaffe's ``net``.
    """

    type_name: ClassVar[str] = ""
    rule: ClassVar[type[Rule]] = SGD

    def __init__(
        self,
        solver: str | os.PathLike | caffe_pb2.SolverParameter,
        *,
        dtype: np.dtype | type = np.float32,
        progress: bool | None = None,
        solver_dir: str | os.PathLike | None = None,
    ) -> None:
        self.param, self._solver_dir = load_solver_param(solver)
        if solver_dir is not None:
            self._solver_dir = Path(solver_dir)
        self.source = None if isinstance(solver, caffe_pb2.SolverParameter) else str(solver)
        self.where = self.source or "solver"  # what errors name
        self.dtype = np.dtype(dtype)
        self.progress = progress
        self.iter = 0
        self.smoothed_loss = 0.0
        self._losses: list[float] = []
        self._action_fn: Callable[[], str] | None = None
        self.callbacks: list[tuple[Callable[[], None] | None, Callable[[], None] | None]] = []
        self.requested_early_exit = False
        self._last_snapshot_iter: int | None = None
        self._bar = None  # step()'s progress bar
        self._start_iter = 0  # the iteration step() started at (the smoothed loss's window)
        # Called as hook(iter, loss) for each iteration, in order, once its loss is read back: right
        # after the iteration, or (whole-iteration GPU replays, whose losses stay on the device) at
        # the next display, test, or end of step(). Unlike pycaffe callbacks they run outside the
        # iteration, so whole iterations can still be replayed as CUDA graphs.
        self.iteration_hooks: list[Callable[[int, float], None]] = []
        if not self._use_progress():  # no progress bar: Caffe's log on stderr, unless logging is set up

            ensure_console_log()
        self.check_param()
        if self.param.random_seed >= 0:
            common.set_random_seed(self.param.random_seed)
        log.info("Initializing solver from parameters%s", f" ({self.source})" if self.source else "")
        if common.mode() is common.Mode.CPU and (hint := threads.take_hint()):
            log.warning(hint)
        self.net: Net = self._init_train_net()
        self.graph, self.executor = self.net.graph, self.net.executor  # what the training step runs
        self.test_nets = self._init_test_nets()
        for spec in self.param.weights:
            self.load_weights(spec)
        rule = self.rule(self.param, self.dtype)
        rule.check(self.where)
        self.update = Update(self.param, self.graph, rule, self.where)
        # how an iteration runs (solvers/iteration.py): plainly, or replayed as one CUDA graph
        self._plain = PlainIteration(self.executor, self.update, self.callbacks)
        self._replayed = ReplayedIteration(self.executor, self.update, self.callbacks, type(self).__name__)
        log.info("Solver scaffolding done.")

    # ------------------------------------------------------------------------------------------
    # construction
    def check_param(self) -> None:
        p = self.param
        if p.iter_size < 1:
            raise SolverConfigError(f"{self.where}: iter_size must be >= 1, got {p.iter_size}")
        if p.average_loss < 1:
            raise SolverConfigError(f"{self.where}: average_loss must be >= 1, got {p.average_loss}")
        if p.regularization_type not in ("L1", "L2"):
            raise SolverConfigError(
                f"{self.where}: unknown regularization_type '{p.regularization_type}' (expected L1 or L2)"
            )
        if p.snapshot_format == caffe_pb2.SolverParameter.HDF5:
            require("h5py", feature="snapshot_format: HDF5")
        if p.snapshot and not p.snapshot_prefix:
            raise SolverConfigError(f"{self.where}: snapshot is set but snapshot_prefix is empty")
        if p.snapshot_prefix:
            parent = Path(self.snapshot_filename("")).parent
            for up in (parent, *parent.parents):
                if up.exists() and not up.is_dir():
                    raise SolverConfigError(f"{self.where}: snapshot_prefix '{p.snapshot_prefix}': {up} is "
                                            f"{protoio.path_kind(str(up))}, not a folder")
                if up.exists():
                    break
        if p.snapshot:
            parent = Path(self.snapshot_filename("")).parent
            if parent.exists() and not os.access(parent, os.W_OK):
                raise SolverConfigError(
                    f"cannot write to snapshot prefix '{p.snapshot_prefix}': folder {parent} is not writable"
                )
        solver_checks.check_solver_param(p, self.where)
        self.stop_on_nonfinite_loss = getattr(self, "stop_on_nonfinite_loss", True)
        if not any(getattr(h, "__qualname__", "").startswith("nonfinite_loss_hook") for h in self.iteration_hooks):
            self.iteration_hooks.append(solver_checks.nonfinite_loss_hook(self))
        if p.snapshot_prefix:
            snapshot.clean_leftovers(p.snapshot_prefix)  # temporary files and half pairs of killed runs

    def _read_net(self, path: str) -> caffe_pb2.NetParameter:
        resolved = resolve_path(path, self._solver_dir)
        if not os.path.exists(resolved):
            where = f" (solver {self.source})" if self.source else ""
            raise PrototxtError(f"{path}: net file not found{where}")
        param = caffe_pb2.NetParameter()
        return protoio.read_text(resolved, param)

    def _make_net(self, net_param: caffe_pb2.NetParameter, phase: int, *states: caffe_pb2.NetState,
                  source: str) -> Net:
        """The net of ``net_param`` in ``phase`` and ``states``; its errors name ``source`` (the net file)."""
        state = caffe_pb2.NetState()
        state.phase = cast("caffe_pb2.Phase", phase)
        state.MergeFrom(net_param.state)
        for s in states:
            state.MergeFrom(s)
        param = caffe_pb2.NetParameter()
        param.CopyFrom(net_param)
        param.state.CopyFrom(state)
        try:
            graph = build_net(param, self.dtype)
        except CaffeError as exc:
            raise in_file(exc, source) from None
        return Net.over(graph, Executor(graph))

    def _init_train_net(self) -> Net:
        p = self.param
        given = [f for f in ("train_net_param", "train_net", "net_param", "net") if p.HasField(f)]
        if len(given) != 1:
            what = "none" if not given else ", ".join(given)
            raise SolverConfigError(
                f"{self.where}: give exactly one of train_net_param, train_net, net_param, net (got {what})"
            )
        field = given[0]
        if field == "train_net_param":
            log.info("Creating training net specified in train_net_param.")
            net_param = p.train_net_param
        elif field == "train_net":
            log.info("Creating training net from train_net file: %s", p.train_net)
            net_param = self._read_net(p.train_net)
        elif field == "net_param":
            log.info("Creating training net specified in net_param.")
            net_param = p.net_param
        else:
            log.info("Creating training net from net file: %s", p.net)
            net_param = self._read_net(p.net)
        source = getattr(p, field) if field in ("train_net", "net") else f"{self.where} ({field})"
        return self._make_net(net_param, common.TRAIN, p.train_state, source=source)

    def _init_test_nets(self) -> list[Net]:
        p = self.param
        generic = p.HasField("net_param") or p.HasField("net")
        specific = len(p.test_net_param) + len(p.test_net)
        if generic:
            if len(p.test_iter) < specific:
                raise SolverConfigError(
                    f"{self.where}: test_iter must be given for each of the {specific} test nets, got {len(p.test_iter)}"
                )
        elif len(p.test_iter) != specific:
            raise SolverConfigError(
                f"{self.where}: {specific} test nets (test_net/test_net_param) but {len(p.test_iter)} test_iter values"
            )
        instances = specific + (len(p.test_iter) - specific)
        if p.test_state and len(p.test_state) != instances:
            raise SolverConfigError(
                f"{self.where}: test_state must be unspecified or given once per test net ({instances}), "
                f"got {len(p.test_state)}"
            )
        sources: list[tuple[str, caffe_pb2.NetParameter]] = []
        for tp in p.test_net_param:
            sources.append(("test_net_param", tp))
        for path in p.test_net:
            sources.append((f"test_net file {path}", self._read_net(path)))
        if len(p.test_iter) > specific:
            generic_param = p.net_param if p.HasField("net_param") else self._read_net(p.net)
            what = "net_param" if p.HasField("net_param") else f"net file {p.net}"
            sources.extend((what, generic_param) for _ in range(len(p.test_iter) - specific))
        nets = []
        for i, (what, net_param) in enumerate(sources):
            log.info("Creating test net (#%d) specified by %s", i, what)
            states = (p.test_state[i],) if p.test_state else ()
            nets.append(self._make_net(net_param, common.TEST, *states, source=f"{self.where} (test net #{i}: {what})"))
        return nets

    def load_weights(self, spec: str) -> None:
        """Copy weights from a comma-separated list of .caffemodel files into the train and test
        nets (layers matched by name; Caffe's CopyLayers / LoadNetWeights)."""
        for name in (s.strip() for s in str(spec).split(",")):
            if not name:
                continue
            protoio.check_regular_file(name, "weights file", WeightsError)
            log.info("Finetuning from %s", name)
            for net in (self.net, *self.test_nets):
                caffemodel.copy_from(net.graph, name)

    # ------------------------------------------------------------------------------------------
    # pycaffe extras
    def add_callback(self, on_start, on_gradients_ready: Callable[[], None] | None = None) -> None:
        """Call ``on_start()`` at the start of every iteration and ``on_gradients_ready()`` before
        each update (pycaffe's ``Solver.add_callback``); or pass one object with both methods
        (``caffe.NCCL``). Callables marked ``graph_safe`` keep whole-iteration CUDA graphs."""
        if on_gradients_ready is None and hasattr(on_start, "on_gradients_ready"):
            on_start, on_gradients_ready = on_start.on_start, on_start.on_gradients_ready
        self.callbacks.append((on_start, on_gradients_ready))

    def set_action_function(self, fn: Callable[[], str] | None) -> None:
        """``fn()`` is polled after every iteration and test batch; it returns "none", "stop" or
        "snapshot" (Caffe's SolverAction; the CLI wires it to SIGINT/SIGHUP)."""
        self._action_fn = fn

    def _requested_action(self) -> str:
        return self._action_fn() if self._action_fn is not None else NONE

    def share_weights(self, net: Net) -> None:
        """Make ``net`` use this solver's train-net weights."""
        caffemodel.share_trained_layers(net.graph, self.graph)

    @property
    def learning_rate(self) -> float:
        """The rate the next update would use (does not advance multistep's counter)."""
        return self.update.rate(self.iter)

    @property
    def loss_scale(self) -> float:
        """The factor loss layers seed gradients with (the net's ``global_grad_scale``; adaptive:
        halved on a non-finite gradient, doubled after a finite stretch; docs/precision.md)."""
        return self.update.read_loss_scale()

    @property
    def history(self) -> list[Blob]:
        """The update rule's history blobs (Caffe's layout: ``rule.history_factor`` sets of one per
        learnable param)."""
        return self.update.history

    @property
    def current_step(self) -> int:
        """The step / multistep policies' counter (saved in the solverstate)."""
        return self.update.current_step

    @current_step.setter
    def current_step(self, value: int) -> None:
        self.update.current_step = value

    # ------------------------------------------------------------------------------------------
    # the loop
    def _use_progress(self) -> bool:
        if self.progress is not None:
            return bool(self.progress)
        return bool(getattr(sys.stderr, "isatty", lambda: False)())

    def _update_smoothed_loss(self, loss: float, start_iter: int, it: int | None = None) -> None:
        average = self.param.average_loss
        if len(self._losses) < average:
            self._losses.append(loss)
            n = len(self._losses)
            self.smoothed_loss = (self.smoothed_loss * (n - 1) + loss) / n
        else:
            idx = ((self.iter if it is None else it) - start_iter) % average
            self.smoothed_loss += (loss - self._losses[idx]) / average
            self._losses[idx] = loss

    def step(self, iters: int) -> None:
        """Run ``iters`` training iterations (pycaffe's ``solver.step``). While it runs, the
        ``<snapshot_prefix>.lock`` file keeps other processes from training with the same prefix."""
        lock = None
        if self.param.snapshot_prefix and common.root_solver() and iters > 0:
            snapshot.claim_prefix(self.param.snapshot_prefix, self, self.where)  # solvers of this process
            lock = snapshot.PrefixLock(self.param.snapshot_prefix).acquire()
        try:
            self._step_with_progress(iters)
        finally:
            if lock is not None:
                lock.release()

    def _step_with_progress(self, iters: int) -> None:
        if self._use_progress() and iters > 0:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            with logging_redirect_tqdm(loggers=[log, logging.getLogger()]):
                bar = tqdm(total=iters, desc=f"{self.graph.name or 'train'}", unit="it", dynamic_ncols=True)
                try:
                    self._step(iters, bar)
                finally:
                    bar.close()
        else:
            self._step(iters, None)

    def _step(self, iters: int, bar) -> None:
        """Caffe's ``Solver::Step``. Each iteration runs plainly or as one replayed CUDA graph
        (:mod:`.iteration`; both drive :attr:`executor` and :attr:`update`), in Caffe's order:
        test, start callbacks, forward/backward, display, gradients-ready callbacks and update,
        snapshot. A replayed iteration's loss reaches the smoothed loss when it is settled."""
        p = self.param
        self._bar, self._start_iter = bar, self.iter
        stop_iter = self.iter + int(iters)
        self.update.reset()  # parameters may have changed since the last step()
        self._losses = []
        self.smoothed_loss = 0.0
        timer, iterations_last = time.perf_counter(), self.iter
        data_rate = DataRate(self.graph.layers, self.graph.layer_names)  # the data layers' line at each display
        try:
            while self.iter < stop_iter:
                iteration = self._replayed if self._replayed.possible() else self._plain
                if iteration is self._plain:
                    self._account(self._replayed.settle())
                if p.test_interval and self.iter % p.test_interval == 0 and (self.iter > 0 or p.test_initialization):
                    self._account(self._replayed.settle())
                    self.test_all()
                    if self.requested_early_exit:
                        break
                for on_start, _ in self.callbacks:
                    if on_start is not None:
                        on_start()
                display = bool(p.display and self.iter % p.display == 0)
                self._account(iteration.forward_backward(self.iter, display))
                if display:
                    lapse = time.perf_counter() - timer
                    log.info("Iteration %d (%g iter/s, %.3gs/%d iters), loss = %g", self.iter,
                             (self.iter - iterations_last) / (lapse or 1.0), lapse, p.display, self.smoothed_loss)
                    for line in data_rate.lines(lapse):
                        log.info("    %s", line)
                    timer, iterations_last = time.perf_counter(), self.iter
                    self._log_outputs(self.graph, "Train", None)
                iteration.apply_update(self.iter)
                self.iter += 1
                request = self._requested_action()
                if (p.snapshot and self.iter % p.snapshot == 0) or request == SNAPSHOT:
                    self.snapshot()
                if request == STOP:
                    self.requested_early_exit = True
                    break
        finally:
            self._account(self._replayed.settle())

    def _account(self, losses: list[tuple[int, float]]) -> None:
        """Smoothed loss, ``last_loss``, iteration hooks and the progress bar, per (iteration, loss)."""
        for it, loss in losses:
            self._update_smoothed_loss(loss, self._start_iter, it)
            self.last_loss = loss
            for hook in self.iteration_hooks:
                hook(it, loss)
            if self._bar is not None:
                self._bar.update(1)
                self._bar.set_postfix(loss=f"{self.smoothed_loss:.4g}", refresh=False)

    def solve(self, resume_file: str | os.PathLike | None = None) -> None:
        """Train to ``max_iter`` (optionally resuming from a .solverstate), as Caffe's Solve."""
        p = self.param
        log.info("Solving %s", self.graph.name)
        log.info("Learning Rate Policy: %s", p.lr_policy)
        self.requested_early_exit = False
        if resume_file:
            log.info("Restoring previous solver status from %s", resume_file)
            self.restore(resume_file)
        start_iter = self.iter
        self.step(p.max_iter - self.iter)
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self.requested_early_exit:
            log.info("Optimization stopped early.")
            return
        if p.display and self.iter % p.display == 0:
            loss = self.executor.forward(0, len(self.graph.layers) - 1)
            self._update_smoothed_loss(loss, start_iter)
            log.info("Iteration %d, loss = %g", self.iter, self.smoothed_loss)
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        log.info("Optimization Done.")

    # ------------------------------------------------------------------------------------------
    # testing
    def _log_outputs(self, graph: NetGraph, kind: str, scores: list[float] | None) -> None:
        """Log ``<kind> net output #i: name = value`` for every element of every output blob."""
        index = 0
        for b, name in zip(graph.output_blob_indices, graph.outputs):
            values = graph.blobs[b].cpu_data().ravel()
            weight = graph.blob_loss_weights[b]
            for v in values:
                value = float(v) if scores is None else scores[index]
                extra = f" (* {weight:g} = {weight * value:g} loss)" if weight else ""
                log.info("    %s net output #%d: %s = %g%s", kind, index, name, value, extra)
                index += 1

    def test_all(self) -> list[dict[str, list[float]]]:
        """Run every test net; returns, per net, output name -> mean values (rank 0 only, as Caffe)."""
        if not common.root_solver():
            return []
        results = []
        for i in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            results.append(self.test(i))
        return results

    def test(self, test_net_id: int = 0) -> dict[str, list[float]]:
        """Average the test net's outputs over ``test_iter`` batches and log them (Caffe's Test)."""
        p = self.param
        log.info("Iteration %d, Testing net (#%d)", self.iter, test_net_id)
        net = self.test_nets[test_net_id]
        graph, executor = net.graph, net.executor
        caffemodel.share_trained_layers(graph, self.graph)
        outputs = list(zip(graph.outputs, (graph.blobs[b] for b in graph.output_blob_indices)))
        iters = p.test_iter[test_net_id]
        scores: list[float] = []
        loss = 0.0
        if p.eval_type not in ("classification", "detection"):
            raise SolverConfigError(f"{self.where}: eval_type must be 'classification' or 'detection', "
                                    f"got '{p.eval_type}'")
        detection = p.eval_type == "detection"  # the SSD fork: outputs are DetectionEvaluate rows -> mAP
        rows: dict[str, list] = {name: [] for name, _ in outputs}
        for i in range(iters):
            request = self._requested_action()
            if request == STOP:
                self.requested_early_exit = True
                break
            if request == SNAPSHOT:
                self.snapshot()
            iter_loss = executor.forward(0, len(graph.layers) - 1)
            if p.test_compute_loss:
                loss += iter_loss
            if detection:
                for name, blob in outputs:
                    rows[name].append(blob.cpu_data().copy())
                continue
            values = [float(v) for _, blob in outputs for v in blob.cpu_data().ravel()]
            if i == 0:
                scores = values
            else:
                scores = [a + b for a, b in zip(scores, values)]
        if self.requested_early_exit:
            log.info("Test interrupted.")
            return {}
        if p.test_compute_loss and iters:
            log.info("Test loss: %g", loss / iters)
        if detection:
            return self._test_detection(rows)
        means = [s / iters for s in scores] if iters else []
        self._log_outputs(graph, "Test", means)
        out: dict[str, list[float]] = {}
        index = 0
        for name, blob in outputs:
            n = blob.count
            out[name] = means[index:index + n]
            index += n
        return out

    def _test_detection(self, rows: dict[str, list]) -> dict[str, list[float]]:
        """The SSD fork's detection evaluation: mAP (``ap_version``) of each output's rows."""

        out: dict[str, list[float]] = {}
        for j, (name, batches) in enumerate(rows.items()):
            if batches and np.asarray(batches[0]).shape[-1] != 5:
                raise SolverConfigError(f"{self.where}: eval_type 'detection' needs DetectionEvaluate outputs "
                                  f"(rows of 5), output '{name}' has shape {np.asarray(batches[0]).shape}")
            try:
                m, aps = mean_average_precision(batches, ap_version=self.param.ap_version)
            except ValueError as exc:
                raise SolverConfigError(f"{self.where}: {exc}") from None
            if self.param.show_per_class_result:
                for label, ap in aps.items():
                    log.info("class%d: %g", label, ap)
            log.info("    Test net output #%d: %s = %g", j, name, m)
            out[name] = [m]
        return out

    # ------------------------------------------------------------------------------------------
    # the update
    def apply_update(self) -> None:
        """This iteration's update from the host (Caffe's ApplyUpdate; :meth:`.update.Update.apply`)."""
        self.update.apply(self.iter)

    # ------------------------------------------------------------------------------------------
    # snapshots
    def snapshot_filename(self, extension: str) -> str:
        return f"{self.param.snapshot_prefix}_iter_{self.iter}{extension}"

    def snapshot(self) -> tuple[str, str]:
        """Write ``<prefix>_iter_<n>.caffemodel`` and ``.solverstate``; returns both paths.
        With several ranks only rank 0 writes (the others return empty paths)."""
        if not common.root_solver():
            return "", ""
        if not self.param.snapshot_prefix:
            raise SolverConfigError(f"{self.where}: cannot snapshot without a snapshot_prefix")
        state = caffe_pb2.SolverState()
        state.iter = self.iter
        state.current_step = self.current_step
        snapshot.save_extras(self._data_nets(), state)  # data layers' read positions, random state
        if self.param.snapshot_format == caffe_pb2.SolverParameter.HDF5:
            model, path = self.snapshot_filename(".caffemodel.h5"), self.snapshot_filename(".solverstate.h5")
            state.learned_net = model
            log.info("Snapshotting to HDF5 file %s", model)
            net_bytes = hdf5_weights.to_bytes(self.graph, self.param.snapshot_diff, model)
            log.info("Snapshotting solver state to HDF5 file %s", path)
            state_bytes = hdf5_weights.state_to_bytes(state, [h.cpu_data() for h in self.history])
        else:
            model, path = self.snapshot_filename(".caffemodel"), self.snapshot_filename(".solverstate")
            state.learned_net = model
            log.info("Snapshotting to binary proto file %s", model)
            net_param = caffemodel.to_proto(self.graph, self.param.snapshot_diff)
            self.update.write_masters(net_param)  # half params: their float32 master weights
            net_bytes = net_param.SerializeToString()
            for h in self.history:
                h.to_proto(False, state.history.add())
            log.info("Snapshotting solver state to binary proto file %s", path)
            state_bytes = state.SerializeToString()
        snapshot.write_pair(model, net_bytes, path, state_bytes)  # both, or neither
        self._last_snapshot_iter = self.iter
        return model, path

    def _data_nets(self) -> dict[str, NetGraph]:
        """The nets whose data layers a snapshot records, by the names a solverstate gives them."""
        return {"train": self.graph, **{f"test{i}": net.graph for i, net in enumerate(self.test_nets)}}

    def restore(self, path: str | os.PathLike, allow_missing: bool = False) -> None:
        """Load a .solverstate or .solverstate.h5 (iteration, step counter, history) and its
        learned_net weights.

        ``learned_net`` is looked up as written (relative: from the current directory), then in
        the solverstate's folder (so snapshots can be moved or resumed from another folder). A net
        layer with params that the snapshot's weights lack (a renamed layer would restart from its
        initial values while its momentum history is applied) is a WeightsError unless
        ``allow_missing``; a negative ``iter`` or ``current_step`` is refused.
        """
        path = str(path)
        history: list[np.ndarray] | None = None
        check_state_file(path, WeightsError)
        if os.path.getsize(path) == 0:
            raise WeightsError(f"{path}: the solver state file is empty (a copy or snapshot cut short?); resume "
                               "from another .solverstate")
        if path.endswith(".h5"):  # BVLC's rule: the name tells the format
            state, history = hdf5_weights.read_state(path)
        else:
            state = _read_binary_state(path)
        stored = len(state.history) if history is None else len(history)
        if stored != len(self.history):
            raise WeightsError(
                f"{path}: holds {stored} history blobs but this {self.type_name} solver "
                f"keeps {len(self.history)} (different solver type or net?)"
            )
        if state.iter < 0 or state.current_step < 0:
            raise WeightsError(f"{path}: impossible counters iter={state.iter}, current_step={state.current_step} "
                               "(expected >= 0; corrupt solver state?)")
        if state.learned_net:
            model = resolve_path(state.learned_net, Path(path).parent)
            if not os.path.isfile(model):  # moved together with its solverstate
                model = str(Path(path).parent / Path(state.learned_net).name)
            if not os.path.isfile(model):
                raise WeightsError(f"{path}: learned_net '{state.learned_net}' not found")
            try:
                caffemodel.copy_from(self.graph, model, allow_missing=allow_missing)
                self.update.read_masters(model)
            except WeightsError as exc:
                if "allow-missing" not in str(exc):
                    raise
                raise WeightsError(f"cannot resume from {path}: {exc}; the solver state's history belongs to "
                                   "the snapshot's layers (was a layer renamed?)") from None
        for i, h in enumerate(self.history):
            where = f"{path}: history blob {i}"
            try:
                if history is None:
                    h.from_proto(state.history[i], reshape=False, where=where)
                elif history[i].shape != h.shape:
                    raise ShapeError(f"{where}: shape mismatch: net has {h.shape}, file has {history[i].shape}")
                else:
                    h.mutable_cpu_data()[...] = history[i]
            except ShapeError as exc:
                raise WeightsError(str(exc)) from None
        self.iter = state.iter
        self.current_step = state.current_step
        snapshot.restore_extras(self._data_nets(), state, path)  # data layers' read positions, random state
