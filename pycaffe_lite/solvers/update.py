"""The update a training iteration applies: Caffe's ``SGDSolver::ApplyUpdate`` as an object.

:class:`Update` holds what the update keeps across iterations: the lr policy's step counter
(``current_step``), the rule's history blobs, the device slot the GPU kernels read the base rate
from, and the device table of the next :attr:`Update.RATE_TABLE` rates that a replayed iteration
advances on the device (one upload per table; a kernel in the replay moves the next entry into the
slot). Per iteration, in Caffe's order: the policy's rate, gradient clipping, ``1/iter_size``,
L1/L2 weight decay, the rule (:mod:`.rules`), ``data -= diff``.

Half precision (docs/precision.md): a learnable param stored in float16/bfloat16 gets a master copy
in the rule's dtype (``solver_data_type``, float32); the gradient is converted into it, the update
runs on it and the param gets the result rounded to nearest even. Loss scaling (the net's
``global_grad_scale``, ``global_grad_scale_adaptive``): loss layers seed their gradient times
:attr:`Update.loss_scale` (``Layer.loss_seed_scale``) and the update divides it out first; adaptive, a
non-finite gradient skips the step and halves the scale, and :attr:`Update.GROWTH_INTERVAL` finite
iterations double it. On the GPU all of it runs in kernels (masters, the unscaling, the adaptive
rule and the skip flag the update kernels read), so a replayed iteration keeps it.

Two ways to apply it, one per kind of iteration (:mod:`.iteration`): :meth:`Update.apply` runs it
from the host (numpy on the CPU; kernels queued on the GPU); :meth:`Update.schedule` before a
replayed iteration and :meth:`Update.queue_replayed` inside its capture put everything on the device.
"""

from __future__ import annotations

import logging
import math
from typing import SupportsInt

import numpy as np

from .. import common, precision
from ..blob import Blob
from ..gpu import backend, blas, cast
from ..net_graph import NetGraph
from ..proto import hdf5_weights, protoio
from ..schema import blob_values, caffe_pb2
from . import lr_policy
from .lr_policy import SolverConfigError
from .rules import Rule

log = logging.getLogger("pycaffe_lite")


class Update:
    """The update of ``graph``'s learnable params by ``rule`` under the solver parameters ``param``."""

    RATE_TABLE = 256
    #: Finite iterations after which an adaptive loss scale doubles (PyTorch AMP's GradScaler
    #: growth_interval; NVCaffe's adaptive scale has no such counter, see docs/precision.md).
    GROWTH_INTERVAL = 2000

    def __init__(self, param: caffe_pb2.SolverParameter, graph: NetGraph, rule: Rule, where: str) -> None:
        self.param, self.graph, self.rule, self.where = param, graph, rule, where
        self.dtype = rule.dtype
        self.current_step = 0  # the step / multistep policies' counter (saved in the solverstate)
        self.history: list[Blob] = [Blob(p.shape, self.dtype)
                                    for _ in range(rule.history_factor) for p in graph.learnable_params]
        for h in self.history:
            h.mutable_cpu_data()[...] = 0
        # fp32 master weights of params stored in half (None where the param is the rule's dtype)
        self.masters: list[Blob | None] = [None] * len(graph.learnable_params)
        self._versions: list[int] = [-1] * len(graph.learnable_params)  # param data versions masters saw
        self._stored: list[np.ndarray | None] = [None] * len(graph.learnable_params)  # bits last stored
        if any(p.dtype != self.dtype for p in graph.learnable_params):
            data_type = (param.solver_data_type if param.HasField("solver_data_type")
                         else precision.type_of_dtype(self.dtype))
            if precision.storage_dtype(data_type) != self.dtype:
                raise SolverConfigError(f"{where}: solver_data_type {precision.type_name(data_type)}: master weights and "
                                        f"history of half params are kept in the net's {self.dtype.name} "
                                        "(expected FLOAT for a float32 net, DOUBLE for a float64 one)")
            for i, p in enumerate(graph.learnable_params):
                if p.dtype != self.dtype:
                    self.masters[i] = Blob(p.shape, self.dtype)
        net = graph.param
        self.scale_adaptive = bool(net is not None and net.global_grad_scale_adaptive)
        self.loss_scale = float(net.global_grad_scale) if net is not None else 1.0
        if self.scale_adaptive or self.loss_scale != 1.0:  # NVCaffe's global_grad_scale_enabled
            if not math.isfinite(self.loss_scale) or self.loss_scale <= 0:
                raise SolverConfigError(f"{where}: net '{graph.name}': global_grad_scale {self.loss_scale} "
                                        "(expected a positive finite number)")
        self._finite_run = 0  # finite iterations since the scale last changed
        # GPU loss scaling: float32 [scale, 1/scale] and int32 [non-finite seen, finite run, skipped
        # steps] on the device, where the adaptive rule runs (docs/precision.md, "GPU")
        self._scale_dev: tuple[SupportsInt, SupportsInt] | None = None
        self._skipped_seen = 0  # skipped steps already logged
        self._slot: SupportsInt | None = None  # device scalars: the base rate the update kernels read, skip flag
        self._seed_scale()
        self._table: tuple[int, list[tuple[float, int]]] | None = None  # (first iter, (rate, step)s)
        self._device_table: tuple[SupportsInt, SupportsInt] | None = None  # (rates, cursor) on the device

    # -- the rate ----------------------------------------------------------------------------------
    def rate(self, it: int) -> float:
        """The policy's rate at iteration ``it``, without advancing the step counter."""
        return self._policy(it, self.current_step)[0]

    def _policy(self, it: int, step: int) -> tuple[float, int]:
        try:
            return lr_policy.learning_rate(self.param, it, step)
        except SolverConfigError as exc:
            raise SolverConfigError(f"{self.where}: {exc}") from None

    def _log_rate(self, it: int, rate: float) -> None:
        if self.param.display and it % self.param.display == 0:
            log.info("Iteration %d, lr = %g", it, rate)

    def reset(self) -> None:
        """Forget the rate table (the solver's parameters or counters may have changed)."""
        self._table = None

    def rate_slot(self) -> int:
        """The device scalars the GPU update kernels read: the base rate, then a skip flag (nonzero:
        leave weights and history as they are; set by the adaptive loss scale). Allocated once."""
        if self._slot is None:
            self._slot = backend.alloc(2 * self.dtype.itemsize)
            backend.memset_zero(int(self._slot), 2 * self.dtype.itemsize)
        return int(self._slot)

    # -- half precision: master weights and loss scaling -------------------------------------------
    @property
    def scaling(self) -> bool:
        """Whether loss scaling is on (a scale other than 1, or adaptive)."""
        return self.scale_adaptive or self.loss_scale != 1.0

    def _seed_scale(self) -> None:
        """Tell the net's loss layers the factor to seed their gradients with (GPU: the device
        address of the scale, which the adaptive rule changes on the device)."""
        slot = None
        if self.scaling and common.mode() is common.Mode.GPU:
            slot = int(self._scaling_state()[0])
        for layer in self.graph.layers:
            if layer.has_loss:
                layer.loss_seed_scale = self.loss_scale
                layer.loss_seed_slot = slot

    def _scaling_state(self) -> tuple[SupportsInt, SupportsInt]:
        """The device's loss-scale state, allocated and set from :attr:`loss_scale` on first use."""
        if self._scale_dev is None:
            self._scale_dev = (backend.alloc(8), backend.alloc(12))
            backend.memcpy_htod(int(self._scale_dev[0]), np.array([self.loss_scale, 1 / self.loss_scale], np.float32))
            backend.memcpy_htod(int(self._scale_dev[1]), np.array([0, self._finite_run, 0], np.int32))
        return self._scale_dev

    def read_loss_scale(self) -> float:
        """The current loss scale (GPU: read from the device, where the adaptive rule keeps it;
        steps skipped since the last read are logged)."""
        if self._scale_dev is not None and backend.started():
            scale = np.zeros(2, np.float32)
            state = np.zeros(3, np.int32)
            backend.memcpy_dtoh(scale, int(self._scale_dev[0]))
            backend.memcpy_dtoh(state, int(self._scale_dev[1]))
            self.loss_scale, self._finite_run = float(scale[0]), int(state[1])
            if state[2] > self._skipped_seen:
                log.info("%s: %d step(s) skipped for non-finite gradients since the last display; loss scale "
                         "now %g", self.where, state[2] - self._skipped_seen, self.loss_scale)
                self._skipped_seen = int(state[2])
        return self.loss_scale

    def _gpu_gradients(self) -> None:
        """GPU: the gradients into the masters' diffs (float32), divided by the loss scale; adaptive,
        a non-finite one sets the rate slot's skip flag and halves the scale, and
        :attr:`GROWTH_INTERVAL` finite iterations double it, all on the device (graph-safe)."""
        params = self.graph.learnable_params
        self._sync_masters_gpu()
        if not self.scaling:
            for p, m in zip(params, self.masters):
                if m is not None and p.count:
                    cast.convert(p.count, p.gpu_diff(), p.diff_dtype, m.mutable_gpu_diff(), m.diff_dtype)
            return
        scale, state = (int(a) for a in self._scaling_state())
        backend.memset_zero(state, 4)
        for p, m in zip(params, self.masters):
            if p.count:
                out = p if m is None else m
                cast.unscale(p.count, p.gpu_diff(), p.diff_dtype, out.mutable_gpu_diff(), out.diff_dtype,
                             scale + 4, state)
        backend.elementwise(
            "loss_scale_step", "float* sc, int* st, Dtype* rate, const int adaptive, const int growth",
            "if (!adaptive) { rate[1] = Dtype(0); } "
            "else if (st[0]) { sc[0] *= 0.5f; st[1] = 0; st[2] += 1; rate[1] = Dtype(1); } "
            "else { st[1] += 1; if (st[1] >= growth) { sc[0] *= 2.0f; st[1] = 0; } rate[1] = Dtype(0); } "
            "sc[1] = 1.0f / sc[0]", self.dtype)(1, scale, state, self.rate_slot(), int(self.scale_adaptive),
                                                self.GROWTH_INTERVAL)

    def _sync_masters_gpu(self) -> None:
        """GPU: a master whose param was written since the update last stored it (weights loaded or
        set) takes the param's values."""
        for i, master in enumerate(self.masters):
            p = self.graph.learnable_params[i]
            if master is not None and p.data_memory.version != self._versions[i]:
                cast.convert(p.count, p.gpu_data(), p.dtype, master.mutable_gpu_data(), master.dtype)
                self._versions[i] = p.data_memory.version
                self._stored[i] = None

    def _store_masters_gpu(self) -> None:
        """GPU: params take their masters' values (and update values, as Caffe leaves in the diff)
        rounded to nearest even."""
        for i, master in enumerate(self.masters):
            if master is not None and master.count:
                p = self.graph.learnable_params[i]
                cast.convert(p.count, master.gpu_data(), master.dtype, p.mutable_gpu_data(), p.dtype)
                cast.convert(p.count, master.gpu_diff(), master.diff_dtype, p.mutable_gpu_diff(), p.diff_dtype)
                self._versions[i] = p.data_memory.version

    def target(self, i: int) -> Blob:
        """The blob the rule updates for learnable param ``i``: its master copy, or the param."""
        master = self.masters[i]
        return self.graph.learnable_params[i] if master is None else master

    def sync_masters(self) -> None:
        """Masters take the values of params written since the update last stored them (weights
        loaded or set by the user); a new master starts from its param. A param only asked for
        for writing (pycaffe's ``blob.data``, to read it) whose bits are what the update stored
        keeps its master."""
        for i, master in enumerate(self.masters):
            p = self.graph.learnable_params[i]
            if master is None or p.data_memory.version == self._versions[i]:
                continue
            bits = p.cpu_data().reshape(-1).view(np.uint16)
            stored = self._stored[i]
            if stored is None or not np.array_equal(bits, stored):
                master.mutable_cpu_data()[...] = p.math_data()
                self._stored[i] = bits.copy()
            self._versions[i] = p.data_memory.version

    def _master_entries(self) -> list[tuple[int, str, int]]:
        """(learnable index, layer name, blob index) of every param with a master."""
        out = []
        g = self.graph
        for nid, (li, j) in enumerate(g.param_layer_indices):
            k = g.learnable_param_ids[nid]
            if g.param_owners[nid] == -1 and self.masters[k] is not None:
                out.append((k, g.layer_names[li], j))
        return out

    def write_masters(self, net: caffe_pb2.NetParameter) -> None:
        """A snapshot's weights (``net``, a .caffemodel's NetParameter): half params' values
        replaced by their master weights in BVLC's float32 ``data`` (training resumes from them
        exactly, and BVLC reads the file)."""
        self.sync_masters()
        layers: dict[str, caffe_pb2.LayerParameter] = {}
        for lp in net.layer:
            layers.setdefault(lp.name, lp)
        for k, name, j in self._master_entries():
            master = self.masters[k]
            if name in layers and j < len(layers[name].blobs) and master is not None:
                blob_values.write_values(layers[name].blobs[j], master.cpu_data())

    def read_masters(self, path: str) -> None:
        """After a snapshot's weights were loaded into the net: masters take the file's values
        unrounded (a .caffemodel; an HDF5 file or a blob stored in half gives the params' values)."""
        self.sync_masters()
        entries = self._master_entries()
        if not entries or hdf5_weights.is_hdf5_file(path):
            return
        net = protoio.read_binary(path, caffe_pb2.NetParameter(), "caffemodel")
        layers: dict[str, caffe_pb2.LayerParameter] = {}
        for lp in net.layer:
            layers.setdefault(lp.name, lp)
        for k, name, j in entries:
            master = self.masters[k]
            if name not in layers or j >= len(layers[name].blobs) or master is None:
                continue
            values = blob_values.read_values(layers[name].blobs[j], False, f"{path}: layer '{name}' param {j}")
            if values is not None and values.size == master.count:
                master.mutable_cpu_data()[...] = values.reshape(master.shape)

    def _store_masters(self) -> None:
        for i, master in enumerate(self.masters):
            if master is not None:
                p = self.graph.learnable_params[i]
                p.set_math_data(master.cpu_data())
                p.set_math_diff(master.cpu_diff())  # (the update value, as Caffe leaves in the diff)
                self._versions[i] = p.data_memory.version
                self._stored[i] = p.cpu_data().reshape(-1).view(np.uint16).copy()

    def _unscale(self, it: int) -> bool:
        """Divide the gradients (masters' diffs or params') by the loss scale; adaptive: False (and
        the scale halved) when one is not finite, and the scale doubled after a finite stretch."""
        targets = [self.target(i) for i in range(len(self.masters))]
        if self.scale_adaptive and not all(np.isfinite(t.cpu_diff()).all() for t in targets):
            old, self.loss_scale = self.loss_scale, self.loss_scale / 2
            self._finite_run = 0
            log.info("Iteration %d: non-finite gradient, step skipped; loss scale %g -> %g", it, old, self.loss_scale)
            self._seed_scale()
            return False
        inv = self.dtype.type(1.0 / self.loss_scale)
        for t in targets:
            t.mutable_cpu_diff()[...] *= inv
        if self.scale_adaptive:
            self._finite_run += 1
            if self._finite_run >= self.GROWTH_INTERVAL:
                old, self.loss_scale = self.loss_scale, self.loss_scale * 2
                self._finite_run = 0
                log.info("Iteration %d: %d finite iterations; loss scale %g -> %g", it, self.GROWTH_INTERVAL, old,
                         self.loss_scale)
                self._seed_scale()
        return True

    # -- applied from the host ---------------------------------------------------------------------
    def apply(self, it: int) -> None:
        """Iteration ``it``'s update: the rate (advancing the step counter), clipping, normalization,
        regularization, the rule and ``data -= diff``; on the GPU the kernels are queued."""
        rate, self.current_step = self._policy(it, self.current_step)
        self._log_rate(it, rate)
        if common.mode() is common.Mode.GPU:
            self._gpu_gradients()
            self.clip_gradients(on_gpu=True)
            backend.memcpy_htod(self.rate_slot(), np.array([self.rule.device_rate(rate, it)], self.dtype))
            self.queue()
            self._store_masters_gpu()
            if self.scale_adaptive and self.param.display and it % self.param.display == 0:
                self.read_loss_scale()
            return
        self.sync_masters()
        for i, master in enumerate(self.masters):
            if master is not None:
                master.mutable_cpu_diff()[...] = self.graph.learnable_params[i].math_diff()
        if self.scaling and not self._unscale(it):
            return
        self.clip_gradients(on_gpu=False)
        p, t = self.param, self.dtype.type
        for i in range(len(self.masters)):
            blob = self.target(i)
            lr_mult, local_decay = self.mults(i)
            diff = blob.mutable_cpu_diff()
            if p.iter_size != 1:
                diff *= t(1.0 / p.iter_size)
            if local_decay:
                data = blob.cpu_data()
                diff += t(local_decay) * (data if p.regularization_type == "L2" else np.sign(data))
            self.rule.cpu(diff, [h.mutable_cpu_data() for h in self.history_views(i)], t(rate * lr_mult), it)
            blob.mutable_cpu_data()[...] -= blob.cpu_diff()
        self._store_masters()

    def queue(self) -> None:
        """One fused kernel per learnable param (its master where it has one); the rate comes from
        :meth:`rate_slot` (graph-safe)."""
        p = self.param
        scale, rate_ptr = 1.0 / p.iter_size, self.rate_slot()
        for i in range(len(self.masters)):
            blob = self.target(i)
            lr_mult, local_decay = self.mults(i)
            reg = 0 if not local_decay else (1 if p.regularization_type == "L2" else 2)
            self.rule.gpu(blob, self.history_views(i), rate_ptr, lr_mult, scale, local_decay, reg)

    def clip_gradients(self, on_gpu: bool) -> None:
        """Scale all param diffs by ``clip / ||g||`` when the global L2 norm exceeds ``clip_gradients``
        (the norm is read back to the host, so a replayed iteration never clips)."""
        clip = self.param.clip_gradients
        if clip < 0:
            return
        params = [self.target(i) for i in range(len(self.masters))]
        if on_gpu:
            sumsq = sum(blas.dot(b.count, b.gpu_diff(), b.gpu_diff(), self.dtype) for b in params)
        else:
            sumsq = sum(float(np.dot(d, d)) for d in (b.cpu_diff().ravel() for b in params))
        norm = math.sqrt(sumsq)
        if norm > clip:
            factor = clip / norm
            log.info("Gradient clipping: scaling down gradients (L2 norm %g > %g) by scale factor %g",
                     norm, clip, factor)
            for b in params:
                if on_gpu:
                    blas.scal(b.count, factor, b.mutable_gpu_diff(), self.dtype)
                else:
                    b.mutable_cpu_diff()[...] *= self.dtype.type(factor)

    # -- applied inside a replayed iteration -------------------------------------------------------
    def schedule(self, it: int) -> None:
        """Before replaying iteration ``it``: the device rate table covers it (computed and uploaded
        when it does not), the step counter advances as :meth:`apply` would, and the rate is logged.
        Also uploads history the host changed (a restored or user-edited solver state)."""
        table = self._table
        if table is None or not table[0] <= it < table[0] + len(table[1]):
            steps, values, step = [], [], self.current_step
            for j in range(self.RATE_TABLE):
                rate, step = self._policy(it + j, step)
                steps.append((rate, step))
                values.append(self.rule.device_rate(rate, it + j))
            self.rate_slot()  # allocated before any capture
            if self._device_table is None:
                self._device_table = (backend.alloc(self.RATE_TABLE * self.dtype.itemsize), backend.alloc(4))
            backend.memcpy_htod(int(self._device_table[0]), np.array(values, self.dtype))
            backend.memset_zero(int(self._device_table[1]), 4)
            self._table = table = (it, steps)
        rate, self.current_step = table[1][it - table[0]]
        self._log_rate(it, rate)
        for h in (*self.history, *(m for m in self.masters if m is not None)):
            h.gpu_data()
        if self.scaling:
            self._scaling_state()
        if self.scale_adaptive and self.param.display and it % self.param.display == 0:
            self.read_loss_scale()

    def queue_replayed(self) -> None:
        """Inside the capture: the next table rate into the slot, the gradients into the masters
        (loss scale divided out, the adaptive rule), then the fused updates and the params."""
        assert self._device_table is not None, "schedule() before queue_replayed()"
        values, cursor = (int(a) for a in self._device_table)
        backend.elementwise("next_rate", "const Dtype* table, int* cursor, Dtype* rate",
                            "rate[0] = table[cursor[0]]; cursor[0] += 1", self.dtype)(1, values, cursor,
                                                                                      self.rate_slot())
        self._gpu_gradients()
        self.queue()
        self._store_masters_gpu()

    # -- per param ---------------------------------------------------------------------------------
    def mults(self, i: int) -> tuple[float, float]:
        """(lr_mult, weight_decay · decay_mult) of learnable param ``i``."""
        lr_mult, decay_mult = self.graph.params_lr[i], self.graph.params_weight_decay[i]
        return ((1.0 if lr_mult is None else lr_mult),
                self.param.weight_decay * (1.0 if decay_mult is None else decay_mult))

    def history_views(self, i: int) -> list[Blob]:
        """The history blobs of learnable param ``i`` (``rule.history_factor`` of them)."""
        n = len(self.graph.learnable_params)
        return [self.history[i + k * n] for k in range(self.rule.history_factor)]
