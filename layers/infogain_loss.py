"""InfogainLoss: softmax followed by an infogain-weighted log loss (BVLC master semantics).

bottom[0]: scores (outer, C, inner) around the softmax axis (``infogain_loss_param.axis``,
default 1); bottom[1]: ``outer*inner`` labels in ``{0..C-1}`` (floats truncated to int); optional
bottom[2]: the infogain matrix H (C*C values), otherwise H is read from the ``.binaryproto``
``infogain_loss_param.source`` at set-up. With p = softmax(x):
``loss = -Σ_{o,s} Σ_c H[l, c]·log(max(p[o, c, s], 1e-20)) / normalizer``, l = the label at (o, s).
``loss_param``: ``ignore_label`` and ``normalization`` (FULL, VALID (default), BATCH_SIZE, NONE;
at least 1); the deprecated ``normalize`` is rejected as in Caffe. Optional top[1]: p.
Gradient, for the scores only: ``(p[c]·Σ_k H[l, k] - H[l, c])·w / normalizer`` (0 where ignored).
With H the identity this is SoftmaxWithLoss (up to the clamp).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer
from pycaffe_lite.proto import caffe_pb2
from pycaffe_lite.protoio import read_binary

from . import softmax_loss
from .multinomial_logistic_loss import LOG_THRESHOLD, check_same_num
from .softmax import SoftmaxLayer

KERNELS = Path(__file__).with_suffix(".cu")


def infogain_axis(param: caffe_pb2.InfogainLossParameter) -> int:
    """``param.axis`` (BVLC master; default 1), or 1 when the schema has no such field."""
    return param.axis if "axis" in param.DESCRIPTOR.fields_by_name else 1


@register_layer("InfogainLoss")
class InfogainLossLayer(Layer):
    min_bottom_blobs = 2
    max_bottom_blobs = 3
    min_top_blobs = 1
    max_top_blobs = 2
    is_loss = True
    auto_top_blobs = True

    # Caffe's get_normalizer (reads self.normalization, self.outer, self.inner), shared with SoftmaxWithLoss
    normalizer = softmax_loss.SoftmaxWithLossLayer.normalizer

    def layer_setup(self, bottom, top):
        ip = self.layer_param.infogain_loss_param
        self.axis_param = infogain_axis(ip)
        sm = caffe_pb2.LayerParameter(name=f"{self.name}_softmax", type="Softmax")
        sm.softmax_param.axis = self.axis_param
        self.softmax = SoftmaxLayer(sm, dtype=self.dtype)
        self.prob = Blob((), self.dtype)
        self.softmax.setup([bottom[0]], [self.prob])
        lp = self.layer_param.loss_param
        self.has_ignore_label = lp.HasField("ignore_label")
        self.ignore_label = lp.ignore_label
        if lp.HasField("normalize"):
            raise self.error('loss_param.normalize is deprecated for InfogainLoss: use "normalization"')
        self.normalization = lp.normalization
        self.infogain: Blob | None = None
        if len(bottom) < 3:
            if not ip.source:
                raise self.error("infogain_loss_param.source is required when H is not given as bottom 2")
            proto = read_binary(ip.source, caffe_pb2.BlobProto(), "infogain matrix (BlobProto)")
            self.infogain = Blob((), self.dtype)
            self.infogain.from_proto(proto, where=f"layer '{self.name}': infogain matrix {ip.source}")
        self.row_sums = Blob((), self.dtype)
        self._buf = Blob((), self.dtype)  # GPU: data = per-position loss, diff = counted flags
        self._norm = Blob((), self.dtype)  # GPU: the normalizer of the last forward

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index == 0  # labels and H take no gradient

    def _h(self, bottom) -> Blob:
        return bottom[2] if len(bottom) >= 3 else self.infogain

    def reshape(self, bottom, top):
        check_same_num(self, bottom)
        self.softmax.reshape([bottom[0]], [self.prob])
        self.axis = bottom[0].canonical_axis(self.axis_param)
        self.outer = bottom[0].count_range(0, self.axis)
        self.channels = bottom[0].shape[self.axis]
        self.inner = bottom[0].count_range(self.axis + 1)
        if self.outer * self.inner != bottom[1].count:
            raise ShapeError(
                f"layer '{self.name}' (InfogainLoss): number of labels must match number of predictions: "
                f"scores {bottom[0].shape} with axis {self.axis} need {self.outer * self.inner} labels, "
                f"the label blob {bottom[1].shape} holds {bottom[1].count}"
            )
        h = self._h(bottom)
        if h.count != self.channels * self.channels:
            raise ShapeError(
                f"layer '{self.name}' (InfogainLoss): the infogain matrix H must be {self.channels}x"
                f"{self.channels} for {self.channels} labels, got shape {h.shape}"
            )
        top[0].reshape(())
        if len(top) >= 2:
            top[1].reshape(bottom[0].shape)
            top[1].share_data(self.prob)
        self.row_sums.reshape((self.channels,))
        self._buf.reshape((self.outer, self.inner))

    def _check_backward(self, propagate_down) -> bool:
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom 1)")
        if len(propagate_down) > 2 and propagate_down[2]:
            raise self.error("cannot backpropagate to the infogain matrix (bottom 2)")
        return bool(propagate_down[0])

    # -- CPU --------------------------------------------------------------------------------
    def _labels(self, bottom) -> tuple[np.ndarray, np.ndarray]:
        """Integer labels (outer, inner) (0 where ignored) and the mask of positions that count."""
        labels = bottom[1].cpu_data().reshape(self.outer, self.inner).astype(np.int64)
        valid = labels != self.ignore_label if self.has_ignore_label else np.ones(labels.shape, bool)
        bad = valid & ((labels < 0) | (labels >= self.channels))
        if bad.any():
            raise self.error(f"label {int(labels[bad][0])} out of range: labels must lie in "
                             f"[0, {self.channels}) for {self.channels} classes on axis {self.axis}")
        return np.where(valid, labels, 0), valid

    def _matrix(self, bottom) -> np.ndarray:
        return self._h(bottom).cpu_data().reshape(self.channels, self.channels)

    def forward_cpu(self, bottom, top):
        self.softmax.forward_cpu([bottom[0]], [self.prob])
        prob = self.prob.cpu_data().reshape(self.outer, self.channels, self.inner)
        labels, valid = self._labels(bottom)
        logp = np.log(np.maximum(prob, self.dtype.type(LOG_THRESHOLD)))
        weights = self._matrix(bottom)[labels]  # (outer, inner, C): the row H[l] of each position
        per_position = np.einsum("osc,ocs->os", weights, logp)
        top[0].mutable_cpu_data()[...] = -per_position[valid].sum() / self.normalizer(int(valid.sum()))

    def backward_cpu(self, top, propagate_down, bottom):
        if not self._check_backward(propagate_down):
            return
        prob = self.prob.cpu_data().reshape(self.outer, self.channels, self.inner)
        labels, valid = self._labels(bottom)
        h = self._matrix(bottom)
        sums = h.sum(axis=1)[labels]  # (outer, inner)
        diff = prob * sums[:, None, :] - h[labels].transpose(0, 2, 1)
        diff *= valid[:, None, :]
        diff *= float(top[0].cpu_diff()) / self.normalizer(int(valid.sum()))
        bottom[0].mutable_cpu_diff()[...] = diff.reshape(bottom[0].shape)

    # -- GPU: per-position loss kernel, SoftmaxWithLoss's one-block reduction, gradient kernels --
    def _k(self, name: str, argtypes: str) -> backend.Kernel:
        return backend.kernel(KERNELS, name, self.dtype, argtypes)

    def forward_gpu(self, bottom, top):
        self.softmax.forward_gpu([bottom[0]], [self.prob])
        n, dt = self.outer * self.inner, self.dtype
        loss, valid = self._buf.mutable_gpu_data(), self._buf.mutable_gpu_diff()
        self._k("infogain_forward", "iPPPiiiiPP")(
            n, n, self.prob.gpu_data(), bottom[1].gpu_data(), self._h(bottom).gpu_data(), self.channels,
            self.inner, int(self.has_ignore_label), self.ignore_label, loss, valid,
        )
        threads = softmax_loss.REDUCE_THREADS
        backend.kernel(softmax_loss.KERNELS, "softmax_loss_reduce", dt, "iPPifPP")(
            0, n, loss, valid, int(self.normalization == caffe_pb2.LossParameter.VALID), self.normalizer(n),
            top[0].mutable_gpu_data(), self._norm.mutable_gpu_data(),
            grid=(1, 1, 1), block=threads, shared=2 * threads * dt.itemsize,
        )

    def backward_gpu(self, top, propagate_down, bottom):
        if not self._check_backward(propagate_down):
            return
        c, h = self.channels, self._h(bottom).gpu_data()
        self._k("infogain_row_sums", "iPP")(c, c, h, self.row_sums.mutable_gpu_data())
        count = bottom[0].count
        self._k("infogain_backward", "iPPPPiiiiPPP")(
            count, count, self.prob.gpu_data(), bottom[1].gpu_data(), h, self.row_sums.gpu_data(), c,
            self.inner, int(self.has_ignore_label), self.ignore_label, top[0].gpu_diff(), self._norm.gpu_data(),
            bottom[0].mutable_gpu_diff(),
        )
