"""Dropout: at TRAIN, ``y = x · mask · scale`` with ``mask ~ Bernoulli(1 - dropout_ratio)``; at TEST
the identity. Any shape; works in place.

``scale = 1 / (1 - dropout_ratio)`` when ``scale_train`` (the default, Caffe's behaviour), else 1
at train time and ``1 - dropout_ratio`` at test time (``scale_train`` is read only where the
compiled caffe.proto has the field). The CPU mask comes from ``common.rng()``; the GPU mask is
drawn on the device by a counter-based hash of (seed, counter, index) with the pair from
``common.next_gpu_seed()`` at each forward, so ``set_random_seed`` makes both repeatable.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, register_layer

KERNELS = Path(__file__).with_suffix(".cu")
UINT_MAX = 2**32 - 1


@register_layer("Dropout")
class DropoutLayer(Layer):
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1
    # Each GPU forward draws a new (seed, counter) on the host: a replayed graph would repeat one mask.
    graph_safe = False

    def layer_setup(self, bottom, top):
        p = self.layer_param.dropout_param
        self.threshold = float(p.dropout_ratio)
        if not 0.0 <= self.threshold < 1.0:
            raise self.error(f"dropout_ratio must be in [0, 1), got {self.threshold}")
        self.scale = 1.0 / (1.0 - self.threshold)
        self.uint_thres = int(UINT_MAX * self.threshold)  # keep where the uint32 draw is above
        self.scale_train = p.scale_train if "scale_train" in p.DESCRIPTOR.fields_by_name else True
        self.mask: np.ndarray | None = None  # CPU mask (uint32 0/1)
        self._gpu_mask = None  # device allocation of count uint32 draws
        self._gpu_mask_count = 0
        self._gpu_mask_used = -1  # element count of the last GPU TRAIN forward

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    @property
    def train(self) -> bool:
        return self.phase == common.TRAIN

    def _train_scale(self) -> float:
        return self.scale if self.scale_train else 1.0

    def _test_scale(self) -> float:
        return 1.0 if self.scale_train else 1.0 - self.threshold

    # -- CPU --------------------------------------------------------------------------------
    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data()
        if self.train:
            self.mask = (common.rng().random(x.shape) >= self.threshold).astype(np.uint32)
            top[0].mutable_cpu_data()[...] = np.where(self.mask, x * self.dtype.type(self._train_scale()), 0)
        else:
            top[0].mutable_cpu_data()[...] = x * self.dtype.type(self._test_scale())

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].cpu_diff()
        if self.train:
            if self.mask is None or self.mask.shape != dy.shape:
                raise self.error("backward at TRAIN needs a forward pass first (no dropout mask)")
            bottom[0].mutable_cpu_diff()[...] = np.where(self.mask, dy * self.dtype.type(self._train_scale()), 0)
        else:
            bottom[0].mutable_cpu_diff()[...] = dy * self.dtype.type(self._test_scale())

    # -- GPU --------------------------------------------------------------------------------
    def _mask_ptr(self, count: int) -> int:
        if self._gpu_mask is None or self._gpu_mask_count < count:
            self._gpu_mask = backend.alloc(max(count, 1) * 4)
            self._gpu_mask_count = count
        return int(self._gpu_mask)

    def forward_gpu(self, bottom, top):
        n = bottom[0].count
        x, y = bottom[0].gpu_data(), top[0].mutable_gpu_data()
        if self.train:
            seed, counter = common.next_gpu_seed()
            self._gpu_mask_used = n
            backend.kernel(KERNELS, "dropout_forward", self.dtype, "iPuuuPfP")(
                n, n, x, seed, counter, self.uint_thres, self._mask_ptr(n), self._train_scale(), y,
            )
        else:
            backend.kernel(KERNELS, "dropout_scale", self.dtype, "iPfP")(n, n, x, self._test_scale(), y)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = top[0].count
        dy, dx = top[0].gpu_diff(), bottom[0].mutable_gpu_diff()
        if self.train:
            if self._gpu_mask is None or self._gpu_mask_used != n:
                raise self.error("backward at TRAIN needs a forward pass first (no dropout mask)")
            backend.kernel(KERNELS, "dropout_backward", self.dtype, "iPPufP")(
                n, n, dy, int(self._gpu_mask), self.uint_thres, self._train_scale(), dx,
            )
        else:
            backend.kernel(KERNELS, "dropout_scale", self.dtype, "iPfP")(n, n, dy, self._test_scale(), dx)
