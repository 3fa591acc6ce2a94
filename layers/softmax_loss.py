"""SoftmaxWithLoss: softmax over ``softmax_param.axis`` followed by the multinomial logistic loss.

bottom[0]: scores (outer, C, inner) around the axis; bottom[1]: labels, ``outer * inner`` values
in ``{0..C-1}`` (stored as floats, truncated to int). top[0]: scalar loss
``-Σ log(max(p[label], FLT_MIN)) / normalizer``; optional top[1]: the probabilities.
``loss_param``: ``ignore_label`` (positions with that label give no loss and no gradient) and
``normalization`` FULL (outer·inner), VALID (non-ignored count, the default), BATCH_SIZE (outer),
NONE (1); the legacy ``normalize: true/false`` means VALID/BATCH_SIZE when ``normalization`` is
unset. The normalizer is at least 1. Gradient w.r.t. the scores only:
``(p - onehot(label)) · loss_weight / normalizer``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer
from pycaffe_lite.proto import caffe_pb2

from .softmax import SoftmaxLayer

KERNELS = Path(__file__).with_suffix(".cu")
FLT_MIN = float(np.finfo(np.float32).tiny)  # Caffe clamps probabilities at FLT_MIN for both dtypes
REDUCE_THREADS = 256
_Norm = caffe_pb2.LossParameter


@register_layer("SoftmaxWithLoss")
class SoftmaxWithLossLayer(Layer):
    exact_num_bottom_blobs = 2
    min_top_blobs = 1
    max_top_blobs = 2
    is_loss = True
    auto_top_blobs = True  # Caffe's LossLayer: a missing top is created

    def layer_setup(self, bottom, top):
        sm = caffe_pb2.LayerParameter(name=f"{self.name}_softmax", type="Softmax")
        sm.softmax_param.CopyFrom(self.layer_param.softmax_param)
        self.softmax = SoftmaxLayer(sm, dtype=self.dtype)
        self.prob = Blob((), self.dtype)
        self.softmax.setup([bottom[0]], [self.prob])
        lp = self.layer_param.loss_param
        self.has_ignore_label = lp.HasField("ignore_label")
        self.ignore_label = lp.ignore_label
        if not lp.HasField("normalization") and lp.HasField("normalize"):
            self.normalization = _Norm.VALID if lp.normalize else _Norm.BATCH_SIZE
        else:
            self.normalization = lp.normalization
        self._buf = Blob((), self.dtype)  # GPU: data = per-position loss, diff = valid flags
        self._norm = Blob((), self.dtype)  # GPU: the normalizer of the last forward

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def reshape(self, bottom, top):
        if bottom[0].num_axes and bottom[1].num_axes and bottom[0].shape[0] != bottom[1].shape[0]:
            raise ShapeError(
                f"layer '{self.name}' (SoftmaxWithLoss): the data and label should have the same first "
                f"dimension, got data {bottom[0].shape} and label {bottom[1].shape}"
            )
        self.softmax.reshape([bottom[0]], [self.prob])
        self.axis = bottom[0].canonical_axis(self.layer_param.softmax_param.axis)
        self.outer = bottom[0].count_range(0, self.axis)
        self.channels = bottom[0].shape[self.axis]
        self.inner = bottom[0].count_range(self.axis + 1)
        if self.outer * self.inner != bottom[1].count:
            raise ShapeError(
                f"layer '{self.name}' (SoftmaxWithLoss): number of labels must match number of "
                f"predictions: prediction shape {bottom[0].shape} with softmax axis {self.axis} needs "
                f"{self.outer * self.inner} labels (outer {self.outer} x inner {self.inner}), but the "
                f"label blob {bottom[1].shape} holds {bottom[1].count}"
            )
        top[0].reshape(())
        if len(top) >= 2:
            top[1].reshape(bottom[0].shape)
            top[1].share_data(self.prob)
        self._buf.reshape((self.outer, self.inner))

    def normalizer(self, valid_count: int) -> float:
        """Caffe's get_normalizer: the divisor of the summed loss (at least 1)."""
        mode = self.normalization
        if mode == _Norm.FULL:
            n = self.outer * self.inner
        elif mode == _Norm.VALID:
            n = valid_count
        elif mode == _Norm.BATCH_SIZE:
            n = self.outer
        elif mode == _Norm.NONE:
            n = 1
        else:
            raise self.error(f"unknown normalization mode {mode}")
        return max(1.0, float(n))

    # -- CPU --------------------------------------------------------------------------------
    def _labels(self, bottom) -> tuple[np.ndarray, np.ndarray]:
        """Integer labels (outer, inner) and the mask of positions that count."""
        labels = bottom[1].cpu_data().reshape(self.outer, self.inner).astype(np.int64)
        valid = labels != self.ignore_label if self.has_ignore_label else np.ones(labels.shape, bool)
        bad = valid & ((labels < 0) | (labels >= self.channels))
        if bad.any():
            raise self.error(
                f"label {int(labels[bad][0])} out of range: labels must lie in [0, {self.channels}) "
                f"for {self.channels} classes on axis {self.axis}"
            )
        return np.where(valid, labels, 0), valid

    def forward_cpu(self, bottom, top):
        self.softmax.forward_cpu([bottom[0]], [self.prob])
        prob = self.prob.cpu_data().reshape(self.outer, self.channels, self.inner)
        labels, valid = self._labels(bottom)
        p = np.take_along_axis(prob, labels[:, None, :], axis=1)[:, 0, :]
        loss = -np.log(np.maximum(p, FLT_MIN))[valid].sum()
        top[0].mutable_cpu_data()[...] = loss / self.normalizer(int(valid.sum()))

    def backward_cpu(self, top, propagate_down, bottom):
        if len(propagate_down) > 1 and propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom 1)")
        if not propagate_down[0]:
            return
        labels, valid = self._labels(bottom)
        diff = self.prob.cpu_data().reshape(self.outer, self.channels, self.inner).copy()
        o, s = np.nonzero(valid)
        diff[o, labels[o, s], s] -= 1
        diff *= valid[:, None, :]
        diff *= float(top[0].cpu_diff()) / self.normalizer(int(valid.sum()))
        bottom[0].mutable_cpu_diff()[...] = diff.reshape(bottom[0].shape)

    # -- GPU: per-position loss kernel, one-block reduction, per-element gradient kernel -------
    def _k(self, name: str, argtypes: str) -> backend.Kernel:
        return backend.kernel(KERNELS, name, self.dtype, argtypes)

    def forward_gpu(self, bottom, top):
        self.softmax.forward_gpu([bottom[0]], [self.prob])
        n = self.outer * self.inner
        loss_buf, count_buf = self._buf.mutable_gpu_data(), self._buf.mutable_gpu_diff()
        self._k("softmax_loss_forward", "iPPiiiiPP")(
            n, n, self.prob.gpu_data(), bottom[1].gpu_data(), self.channels, self.inner,
            int(self.has_ignore_label), self.ignore_label, loss_buf, count_buf,
        )
        use_valid = self.normalization == _Norm.VALID and self.has_ignore_label
        fixed = self.normalizer(n)  # VALID without an ignore label: every position counts
        self._k("softmax_loss_reduce", "iPPifPP")(
            0, n, loss_buf, count_buf, int(use_valid), fixed, top[0].mutable_gpu_data(),
            self._norm.mutable_gpu_data(),
            grid=(1, 1, 1), block=REDUCE_THREADS, shared=2 * REDUCE_THREADS * self.dtype.itemsize,
        )

    def backward_gpu(self, top, propagate_down, bottom):
        if len(propagate_down) > 1 and propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom 1)")
        if not propagate_down[0]:
            return
        count = bottom[0].count
        self._k("softmax_loss_backward", "iPPiiiiPPP")(
            count, count, self.prob.gpu_data(), bottom[1].gpu_data(), self.channels, self.inner,
            int(self.has_ignore_label), self.ignore_label, top[0].gpu_diff(), self._norm.gpu_data(),
            bottom[0].mutable_gpu_diff(),
        )
