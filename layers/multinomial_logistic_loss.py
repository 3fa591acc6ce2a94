"""MultinomialLogisticLoss: ``loss = -Σ_n log(max(p[n, label_n], 1e-20)) / N`` on given probabilities.

bottom[0]: probabilities (N, ...) read as (N, D), D = count / N (no softmax is applied);
bottom[1]: labels, N values in ``{0..D-1}`` (floats truncated to int), legacy shape (N, 1, 1, 1)
or (N,). top[0]: scalar. Gradient, for the probabilities only: ``-w / N / max(p, 1e-20)`` at each
label position and 0 elsewhere (w = the loss weight). ``1e-20`` is Caffe's ``kLOG_THRESHOLD`` (a
float). Also hosts small helpers the other loss layers import.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend, blas
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_suffix(".cu")
LOG_THRESHOLD = float(np.float32(1e-20))  # Caffe's kLOG_THRESHOLD is a float for both dtypes


def check_same_num(layer: Layer, bottom: Sequence[Blob], what: str = "data and label") -> int:
    """Caffe's LossLayer::Reshape check: bottom 0 and 1 share their first dimension; returns it."""
    a, b = bottom[0], bottom[1]
    if a.num_axes == 0 or b.num_axes == 0 or a.shape[0] != b.shape[0]:
        raise ShapeError(
            f"layer '{layer.name}' ({layer.type}): the {what} should have the same first dimension, "
            f"got {a.shape} and {b.shape}"
        )
    return a.shape[0]


def integer_labels(layer: Layer, labels: np.ndarray, classes: int) -> np.ndarray:
    """Labels truncated to int (as C does); raises when one lies outside ``[0, classes)``."""
    ints = labels.astype(np.int64)
    bad = (ints < 0) | (ints >= classes)
    if bad.any():
        raise layer.error(f"label {int(ints[bad][0])} out of range: labels must lie in [0, {classes})")
    return ints


def gpu_sum_into(n: int, alpha: float, vec: int, out: int, dtype) -> None:
    """``out[0] = alpha · Σ vec[:n]`` on the device (a 1-wide GEMM with a ones row: no host read)."""
    blas.gemm(False, True, 1, 1, n, alpha, gm.ones_vector(n, dtype), vec, 0.0, out, dtype)


@register_layer("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(Layer):
    exact_num_bottom_blobs = 2
    exact_num_top_blobs = 1
    is_loss = True
    auto_top_blobs = True

    def layer_setup(self, bottom, top):
        self._loss = Blob((), self.dtype)  # GPU: per-sample losses

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def reshape(self, bottom, top):
        self.num = check_same_num(self, bottom)
        lab = bottom[1]
        if lab.num_axes > 4 or (lab.channels, lab.height, lab.width) != (1, 1, 1):
            raise ShapeError(
                f"layer '{self.name}' (MultinomialLogisticLoss): the label blob must hold one value per "
                f"sample, shape (N, 1, 1, 1) or (N,), got {lab.shape}"
            )
        self.dim = bottom[0].count // self.num
        top[0].reshape(())
        self._loss.reshape((self.num,))

    def _check_backward(self, propagate_down) -> bool:
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs (bottom 1)")
        return bool(propagate_down[0])

    def forward_cpu(self, bottom, top):
        prob = bottom[0].cpu_data().reshape(self.num, self.dim)
        labels = integer_labels(self, bottom[1].cpu_data().reshape(-1), self.dim)
        p = np.maximum(prob[np.arange(self.num), labels], self.dtype.type(LOG_THRESHOLD))
        top[0].mutable_cpu_data()[...] = -np.log(p).sum() / self.num

    def backward_cpu(self, top, propagate_down, bottom):
        if not self._check_backward(propagate_down):
            return
        prob = bottom[0].cpu_data().reshape(self.num, self.dim)
        labels = integer_labels(self, bottom[1].cpu_data().reshape(-1), self.dim)
        rows = np.arange(self.num)
        diff = np.zeros((self.num, self.dim), self.dtype)
        scale = -float(top[0].cpu_diff()) / self.num
        diff[rows, labels] = scale / np.maximum(prob[rows, labels], self.dtype.type(LOG_THRESHOLD))
        bottom[0].mutable_cpu_diff()[...] = diff.reshape(bottom[0].shape)

    # GPU: a per-sample loss kernel, a device-side sum, a per-element gradient kernel.
    def forward_gpu(self, bottom, top):
        k = backend.kernel(KERNELS, "mll_forward", self.dtype, "iPPiP")
        k(self.num, self.num, bottom[0].gpu_data(), bottom[1].gpu_data(), self.dim, self._loss.mutable_gpu_data())
        gpu_sum_into(self.num, 1.0 / self.num, self._loss.gpu_data(), top[0].mutable_gpu_data(), self.dtype)

    def backward_gpu(self, top, propagate_down, bottom):
        if not self._check_backward(propagate_down):
            return
        count = bottom[0].count
        k = backend.kernel(KERNELS, "mll_backward", self.dtype, "iPPiPfP")
        k(count, count, bottom[0].gpu_data(), bottom[1].gpu_data(), self.dim, top[0].gpu_diff(),
          1.0 / self.num, bottom[0].mutable_gpu_diff())
