"""SoftmaxWithLoss: softmax over ``softmax_param.axis`` followed by the multinomial logistic loss.

bottom[0]: scores (outer, C, inner) around the axis; bottom[1]: labels, ``outer * inner`` values
in ``{0..C-1}`` (stored as floats, truncated to int). top[0]: scalar loss
``-Σ log(max(p[label], FLT_MIN)) / normalizer``; optional top[1]: the probabilities.
``loss_param``: ``ignore_label`` and ``normalization`` (default VALID), see :mod:`loss_layer`.
Gradient w.r.t. the scores only: ``(p - onehot(label)) · loss_weight / normalizer``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

from .loss_layer import LossLayer, Norm
from .softmax import SoftmaxLayer

KERNELS = Path(__file__).with_suffix(".cu")
FLT_MIN = float(np.finfo(np.float32).tiny)  # Caffe clamps probabilities at FLT_MIN for both dtypes


@register_layer("SoftmaxWithLoss")
class SoftmaxWithLossLayer(LossLayer):
    traits = Traits(half=True, graph_safe=True, backward_reads=('bottom',))
    exact_num_top_blobs = None
    min_top_blobs = 1
    max_top_blobs = 2
    default_normalization = Norm.VALID
    uses_ignore_label = True

    def inner_softmax_param(self) -> caffe_pb2.SoftmaxParameter:
        """The parameters of the inner Softmax (InfogainLoss gives only its own axis)."""
        return self.layer_param.softmax_param

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        sm = caffe_pb2.LayerParameter(name=f"{self.name}_softmax", type="Softmax")
        sm.softmax_param.CopyFrom(self.inner_softmax_param())
        self.softmax = SoftmaxLayer(sm, dtype=self.dtype)
        self.prob = Blob((), self.dtype)
        self.softmax.setup([bottom[0]], [self.prob])
        self._buf = Blob((), self.dtype)  # GPU: data = per-position loss, diff = valid flags

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.softmax.reshape([bottom[0]], [self.prob])
        self.axis = bottom[0].canonical_axis(self.softmax.layer_param.softmax_param.axis)
        self.outer = bottom[0].count_range(0, self.axis)
        self.classes = bottom[0].shape[self.axis]
        self.inner = bottom[0].count_range(self.axis + 1)
        if self.outer * self.inner != bottom[1].count:
            raise self.error(
                f"number of labels must match number of predictions: prediction shape {bottom[0].shape} "
                f"with softmax axis {self.axis} needs {self.outer * self.inner} labels (outer {self.outer} x "
                f"inner {self.inner}), but the label blob {bottom[1].shape} holds {bottom[1].count}",
                ShapeError,
            )
        if len(top) >= 2:
            top[1].reshape(bottom[0].shape)
            top[1].share_data(self.prob)
        self._buf.reshape((self.outer, self.inner))

    # -- CPU: the shared steps around the per-position loss and gradient (InfogainLoss overrides those)
    def _prob(self) -> np.ndarray:
        return self.prob.cpu_data().reshape(self.outer, self.classes, self.inner)

    def _labels(self, bottom) -> tuple[np.ndarray, np.ndarray]:
        return self.class_labels(bottom[1].cpu_data().reshape(self.outer, self.inner))

    def position_loss_cpu(self, bottom, labels: np.ndarray) -> np.ndarray:
        """(outer, inner) per-position losses ``-log(max(p[label], FLT_MIN))`` (labels 0 where ignored)."""
        p = np.take_along_axis(self._prob(), labels[:, None, :], axis=1)[:, 0, :]
        return -np.log(np.maximum(p, FLT_MIN))

    def position_grad_cpu(self, bottom, labels: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """(outer, C, inner) unscaled gradient ``p - onehot(label)`` (rows of ignored positions are
        zeroed by the caller)."""
        diff = self._prob().copy()
        o, s = np.nonzero(valid)
        diff[o, labels[o, s], s] -= 1
        return diff

    def forward_cpu(self, bottom, top):
        self.softmax.forward_cpu([bottom[0]], [self.prob])
        labels, valid = self._labels(bottom)
        loss = self.position_loss_cpu(bottom, labels)[valid].sum()
        top[0].mutable_cpu_data()[...] = loss / self.normalizer(int(valid.sum()))

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        labels, valid = self._labels(bottom)
        diff = self.position_grad_cpu(bottom, labels, valid)
        diff *= valid[:, None, :] * self.grad_scale(top, int(valid.sum()))
        bottom[0].mutable_cpu_diff()[...] = diff.reshape(bottom[0].shape)

    # -- GPU: per-position loss kernel, LossLayer's reduction, per-element gradient kernel -----
    def position_loss_gpu(self, bottom, n: int, loss: int, valid: int) -> None:
        """Writes the ``n`` per-position losses and valid flags (and the bad-label flag)."""
        backend.kernel(KERNELS, "softmax_loss_forward", self.dtype)(
            n, self.prob.gpu_data(), bottom[1].gpu_data(), self.classes, self.inner,
            int(self.has_ignore_label), self.ignore_label, loss, valid, self.gpu_status(),
        )

    def forward_gpu(self, bottom, top):
        self.softmax.forward_gpu([bottom[0]], [self.prob])
        n = self.outer * self.inner
        loss, valid = self._buf.mutable_gpu_data(), self._buf.mutable_gpu_diff()
        self.position_loss_gpu(bottom, n, loss, valid)
        self.gpu_reduce(n, loss, top, valid if self.has_ignore_label else None)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            backend.kernel(KERNELS, "softmax_loss_backward", self.dtype)(
                bottom[0].count, self.prob.gpu_data(), bottom[1].gpu_data(), self.classes, self.inner,
                int(self.has_ignore_label), self.ignore_label, top[0].gpu_diff(), self.gpu_norm(),
                bottom[0].mutable_gpu_diff(),
            )
