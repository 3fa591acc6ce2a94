"""Accuracy: fraction of positions whose true class is among the ``top_k`` highest scores.

bottom[0]: scores (outer, C, inner) around ``accuracy_param.axis``; bottom[1]: labels,
``outer * inner`` values (floats truncated to int). A prediction is correct when fewer than
``top_k`` classes other than the true one score ``>=`` the true class's score (ties count against
it, as in Caffe). Positions labelled ``ignore_label`` are skipped. top[0]: scalar accuracy (0
when nothing counts); optional top[1]: (C,) per-class accuracy (0 for classes never seen).
No gradient. A label outside ``[0, C)`` raises on the CPU; on the GPU (no host read during forward)
it makes top[0] NaN.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")
REDUCE_THREADS = 256


@register_layer("Accuracy")
class AccuracyLayer(Layer):
    traits = Traits(half=True, graph_safe=True)
    exact_num_bottom_blobs = 2
    min_top_blobs = 1
    max_top_blobs = 2

    def layer_setup(self, bottom, top):
        p = self.layer_param.accuracy_param
        self.top_k = p.top_k
        self.has_ignore_label = p.HasField("ignore_label")
        self.ignore_label = p.ignore_label
        self._buf = Blob((), self.dtype)  # GPU: data = correct flags, diff = valid flags

    def allow_force_backward(self, bottom_index: int) -> bool:
        return False

    def reshape(self, bottom, top):
        where = self.where
        if bottom[1].count == 0 or self.top_k > bottom[0].count // bottom[1].count:
            raise ShapeError(
                f"{where}: top_k must be less than or equal to the number of classes: top_k {self.top_k}, "
                f"scores {bottom[0].shape}, labels {bottom[1].shape}"
            )
        self.axis = bottom[0].canonical_axis(self.layer_param.accuracy_param.axis)
        self.outer = bottom[0].count_range(0, self.axis)
        self.channels = bottom[0].shape[self.axis]
        self.inner = bottom[0].count_range(self.axis + 1)
        if self.outer * self.inner != bottom[1].count:
            raise ShapeError(
                f"{where}: number of labels must match number of predictions: prediction shape "
                f"{bottom[0].shape} with label axis {self.axis} needs {self.outer * self.inner} labels, but "
                f"the label blob {bottom[1].shape} holds {bottom[1].count}"
            )
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape((self.channels,))
        self._buf.reshape((self.outer, self.inner))

    def forward_cpu(self, bottom, top):
        scores = bottom[0].cpu_data().reshape(self.outer, self.channels, self.inner)
        raw = bottom[1].cpu_data().reshape(self.outer, self.inner)
        if not np.isfinite(raw).all():
            raise self.error(f"label {raw[~np.isfinite(raw)][0]} is not a number: labels must be class indices "
                             f"in [0, {self.channels})")
        labels = raw.astype(np.int64)
        valid = labels != self.ignore_label if self.has_ignore_label else np.ones(labels.shape, bool)
        bad = valid & ((labels < 0) | (labels >= self.channels))
        if bad.any():
            raise self.error(
                f"label {int(labels[bad][0])} out of range: labels must lie in [0, {self.channels}) "
                f"for {self.channels} classes on axis {self.axis}"
            )
        lab = np.where(valid, labels, 0)
        true_score = np.take_along_axis(scores, lab[:, None, :], axis=1)
        better = (scores >= true_score).sum(axis=1) - 1  # the true class itself is not "better"
        correct = valid & (better < self.top_k)
        undefined = valid & ~np.isfinite(scores).all(axis=1)  # NaN/Inf scores predict nothing: NaN accuracy
        count = int(valid.sum())
        total = np.nan if undefined.any() else correct.sum()
        top[0].mutable_cpu_data()[...] = total / count if count else 0.0
        if len(top) > 1:
            nums = np.bincount(lab[valid], minlength=self.channels)
            hits = np.bincount(lab[correct], minlength=self.channels).astype(np.float64)
            hits[np.unique(lab[undefined])] = np.nan
            per_class = np.divide(hits, nums, out=np.zeros(self.channels), where=nums > 0)
            top[1].mutable_cpu_data()[...] = per_class

    def backward_cpu(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise self.error("Accuracy has no backward pass (it cannot be used as a loss)")

    def backward_gpu(self, top, propagate_down, bottom):
        self.backward_cpu(top, propagate_down, bottom)

    # -- GPU: per-position test, then one-block reductions (total and per class) --------------
    def forward_gpu(self, bottom, top):
        n, dt = self.outer * self.inner, self.dtype
        correct, valid = self._buf.mutable_gpu_data(), self._buf.mutable_gpu_diff()
        labels = bottom[1].gpu_data()
        backend.kernel(KERNELS, "accuracy_forward", dt)(
            n, bottom[0].gpu_data(), labels, self.channels, self.inner,
            int(self.has_ignore_label), self.ignore_label, self.top_k, correct, valid,
        )
        reduce = backend.kernel(KERNELS, "accuracy_reduce", dt)
        for per_class, out, blocks in ((-1, top[0], 1), (0, top[-1], self.channels))[: len(top)]:
            reduce(n, correct, valid, per_class, labels, out.mutable_gpu_data(), grid=blocks, block=REDUCE_THREADS)
