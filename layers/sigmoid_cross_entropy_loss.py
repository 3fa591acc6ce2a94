"""SigmoidCrossEntropyLoss: cross-entropy of ``sigmoid(x)`` against targets in [0, 1] (BVLC master).

bottom[0]: scores x (N, ...); bottom[1]: targets t with the same count. Per element, computed
stably: ``l = max(x, 0) - x·t + log(1 + exp(-|x|))``. top[0]: ``Σ l / normalizer`` over the
elements that count. ``loss_param``: ``ignore_label`` (elements whose target, truncated to int,
equals it give no loss and no gradient) and ``normalization`` (FULL: N·D; VALID: the counted
elements; BATCH_SIZE: N; NONE: 1; at least 1). Caffe's default here is BATCH_SIZE; the legacy
``normalize: true/false`` means VALID/BATCH_SIZE when ``normalization`` is unset. Gradient, for
the scores only: ``(sigmoid(x) - t) · w / normalizer`` (0 where ignored; w = the loss weight).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer
from pycaffe_lite.proto import caffe_pb2

from . import softmax_loss
from .multinomial_logistic_loss import check_same_num

KERNELS = Path(__file__).with_suffix(".cu")
_Norm = caffe_pb2.LossParameter


@register_layer("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(Layer):
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1
    is_loss = True
    auto_top_blobs = True

    # Caffe's get_normalizer (reads self.normalization, self.outer, self.inner), shared with SoftmaxWithLoss
    normalizer = softmax_loss.SoftmaxWithLossLayer.normalizer

    def layer_setup(self, bottom, top):
        lp = self.layer_param.loss_param
        self.has_ignore_label = lp.HasField("ignore_label")
        self.ignore_label = lp.ignore_label
        if lp.HasField("normalization"):
            self.normalization = lp.normalization
        elif lp.HasField("normalize"):
            self.normalization = _Norm.VALID if lp.normalize else _Norm.BATCH_SIZE
        else:
            self.normalization = _Norm.BATCH_SIZE
        self._buf = Blob((), self.dtype)  # GPU: data = per-element loss, diff = counted flags
        self._norm = Blob((), self.dtype)  # GPU: the normalizer of the last forward

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def reshape(self, bottom, top):
        self.outer = check_same_num(self, bottom, "scores and targets")
        if bottom[0].count != bottom[1].count:
            raise ShapeError(
                f"layer '{self.name}' (SigmoidCrossEntropyLoss): inputs must have the same count, got "
                f"scores {bottom[0].shape} and targets {bottom[1].shape}"
            )
        self.inner = bottom[0].count // self.outer
        top[0].reshape(())
        self._buf.reshape(bottom[0].shape)

    def _check_backward(self, propagate_down) -> bool:
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom 1)")
        return bool(propagate_down[0])

    # -- CPU --------------------------------------------------------------------------------
    def _valid(self, target: np.ndarray) -> np.ndarray:
        if not self.has_ignore_label:
            return np.ones(target.shape, bool)
        return target.astype(np.int64) != self.ignore_label

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        t = bottom[1].cpu_data().reshape(x.shape)
        valid = self._valid(t)
        loss = np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))
        top[0].mutable_cpu_data()[...] = loss[valid].sum() / self.normalizer(int(valid.sum()))

    def backward_cpu(self, top, propagate_down, bottom):
        if not self._check_backward(propagate_down):
            return
        x = bottom[0].cpu_data()
        t = bottom[1].cpu_data().reshape(x.shape)
        valid = self._valid(t)
        e = np.exp(-np.abs(x))
        sigmoid = np.where(x >= 0, 1 / (1 + e), e / (1 + e))
        scale = float(top[0].cpu_diff()) / self.normalizer(int(valid.sum()))
        bottom[0].mutable_cpu_diff()[...] = np.where(valid, (sigmoid - t) * scale, 0)

    # -- GPU: per-element kernel, SoftmaxWithLoss's one-block reduction, gradient kernel ----------
    def forward_gpu(self, bottom, top):
        n, dt = bottom[0].count, self.dtype
        loss, valid = self._buf.mutable_gpu_data(), self._buf.mutable_gpu_diff()
        backend.kernel(KERNELS, "sigmoid_ce_forward", dt, "iPPiiPP")(
            n, n, bottom[0].gpu_data(), bottom[1].gpu_data(), int(self.has_ignore_label), self.ignore_label,
            loss, valid,
        )
        use_valid = self.normalization == _Norm.VALID and self.has_ignore_label
        threads = softmax_loss.REDUCE_THREADS
        backend.kernel(softmax_loss.KERNELS, "softmax_loss_reduce", dt, "iPPifPP")(
            0, n, loss, valid, int(use_valid), self.normalizer(n), top[0].mutable_gpu_data(),
            self._norm.mutable_gpu_data(), grid=(1, 1, 1), block=threads, shared=2 * threads * dt.itemsize,
        )

    def backward_gpu(self, top, propagate_down, bottom):
        if not self._check_backward(propagate_down):
            return
        n = bottom[0].count
        backend.kernel(KERNELS, "sigmoid_ce_backward", self.dtype, "iPPiiPPP")(
            n, n, bottom[0].gpu_data(), bottom[1].gpu_data(), int(self.has_ignore_label), self.ignore_label,
            top[0].gpu_diff(), self._norm.gpu_data(), bottom[0].mutable_gpu_diff(),
        )
