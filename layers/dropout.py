"""Dropout: at TRAIN, ``y = x · mask · scale`` with ``mask ~ Bernoulli(1 - dropout_ratio)``; at TEST
the identity. Any shape; works in place.

``scale = 1 / (1 - dropout_ratio)`` when ``scale_train`` (the default, Caffe's behaviour), else 1
at train time and ``1 - dropout_ratio`` at test time (caffe-fast-rcnn's ``scale_train: false``). The mask (1 kept, 0 dropped) is an internal Blob read by
backward. CPU masks come from ``common.rng()``. GPU masks are drawn on the device by Philox-4x32-10
(``dropout.cu``) keyed by ``common.next_gpu_seed()`` (taken at the first forward after each
``set_random_seed``, so both devices are repeatable) at a draw counter kept in device memory and
advanced by a kernel, so a captured CUDA graph draws a fresh mask on every replay.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import CudaError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Traits, register_layer

from .neuron_layer import NeuronLayer

KERNELS = Path(__file__).with_suffix(".cu")
UINT_MAX = 2**32 - 1


@register_layer("Dropout")
class DropoutLayer(NeuronLayer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True, backward_reads=('bottom',))
    gpu_forward = "y[i] = x[i] * scale"  # TEST; TRAIN draws in dropout.cu
    gpu_backward = "dx[i] = dy[i] * scale"  # TEST
    gpu_backward_train = "dx[i] = mask[i] != Dtype(0) ? dy[i] * scale : Dtype(0)"

    def layer_setup(self, bottom, top):
        p = self.layer_param.dropout_param
        self.threshold = float(p.dropout_ratio)
        if not 0.0 <= self.threshold < 1.0:
            raise self.error(f"dropout_ratio must be in [0, 1), got {self.threshold}")
        self.scale = 1.0 / (1.0 - self.threshold)
        self.uint_thres = int(UINT_MAX * self.threshold)  # the GPU keeps where the uint32 draw is above
        self.scale_train = p.scale_train
        self.mask = Blob((), self.dtype)
        self.mask_shape: tuple | None = None  # shape of the last TRAIN forward's mask
        self.draw_counter = Blob((1,), np.float32)  # device-only: holds the uint32 counter's bits
        self.generator: tuple[int, int, int] | None = None  # (seed generation, seed, stream)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.mask.reshape(bottom[0].shape)

    @property
    def train(self) -> bool:
        return self.phase == common.TRAIN

    def _scale(self) -> float:
        if self.train:
            return self.scale if self.scale_train else 1.0
        return 1.0 if self.scale_train else 1.0 - self.threshold

    def gpu_scalars(self):
        return {"scale": self._scale()}

    def _checked_mask(self, shape) -> None:
        if self.mask_shape != tuple(shape):
            raise self.error("backward at TRAIN needs a forward pass first (no dropout mask)")

    # -- CPU --------------------------------------------------------------------------------
    def forward_cpu(self, bottom, top):
        if not self.train:
            return super().forward_cpu(bottom, top)
        x, mask = bottom[0].cpu_data(), self.mask.mutable_cpu_data()
        mask[...] = common.rng().random(x.shape) >= self.threshold
        self.mask_shape = x.shape
        top[0].mutable_cpu_data()[...] = np.where(mask != 0, x * self.dtype.type(self._scale()), 0)

    def cpu_forward(self, x):
        return x * self.dtype.type(self._scale())

    def cpu_backward(self, x, y, dy):
        scale = self.dtype.type(self._scale())
        if not self.train:
            return dy * scale
        self._checked_mask(dy.shape)
        return np.where(self.mask.cpu_data() != 0, dy * scale, 0)

    # -- GPU --------------------------------------------------------------------------------
    def _seed_and_stream(self) -> tuple[int, int]:
        """The generator's key; after a set_random_seed a new one, with the draw counter zeroed."""
        generation = common.seed_generation()
        if self.generator is None or self.generator[0] != generation:
            if backend.recording() is not None:  # the reset would be replayed: every replay the same mask
                raise CudaError(f"Dropout '{self.name}' re-seeds its generator: run once before capturing")
            self.generator = (generation, *common.next_gpu_seed())
            backend.memset_zero(self.draw_counter.mutable_gpu_data(), 4)
        return self.generator[1:]

    def forward_gpu(self, bottom, top):
        if not self.train:
            return super().forward_gpu(bottom, top)
        n, (seed, stream) = bottom[0].count, self._seed_and_stream()
        counter = self.draw_counter.mutable_gpu_data()
        backend.kernel(KERNELS, "dropout_forward_train", self.dtype)(
            n, bottom[0].gpu_data(), counter, seed, stream, self.uint_thres, self._scale(),
            self.mask.mutable_gpu_data(), top[0].mutable_gpu_data(),
        )
        backend.kernel(KERNELS, "dropout_advance", self.dtype)(counter, grid=1, block=1)
        self.mask_shape = tuple(bottom[0].shape)

    def backward_gpu(self, top, propagate_down, bottom):
        if not (self.train and propagate_down[0]):
            return super().backward_gpu(top, propagate_down, bottom)
        self._checked_mask(top[0].shape)
        self.launch("backward_train", self.gpu_backward_train, top[0].count, mask=self.mask.gpu_data(),
                    dy=top[0].gpu_diff(), dx=bottom[0].mutable_gpu_diff())
