"""EuclideanLoss: ``loss = Σ (a - b)² / num / 2`` with ``num = a.shape[0]``.

bottom[0], bottom[1]: same first dimension and same count per item; top[0]: scalar.
Gradients: ``da = +w·(a - b)/num``, ``db = -w·(a - b)/num`` (w = the loss weight); both bottoms
can take a gradient (e.g. a learned target). GPU: forward is one fused pass (``a - b`` and the
block sums of its squares), then LossLayer's one-block finish; backward one scaled copy per bottom.
"""

from __future__ import annotations

from pathlib import Path

from pycaffe_lite.blob import Blob, math_dtype
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Traits, register_layer

from .loss_layer import REDUCE_THREADS, LossLayer, reduce_blocks

KERNELS = Path(__file__).with_suffix(".cu")


@register_layer("EuclideanLoss")
class EuclideanLossLayer(LossLayer):
    traits = Traits(graph_safe=True, backward_reads=('bottom',))
    label_bottoms = ()  # both inputs may take a gradient

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self.diff = Blob((), self.dtype)  # a - b, kept for backward

    def reshape(self, bottom, top):
        a, b = bottom
        super().reshape(bottom, top)  # the same first dimension
        if a.count_range(1) != b.count_range(1):
            raise self.error(
                f"inputs must have the same first dimension and "
                f"the same count per item, got {a.shape} and {b.shape}", ShapeError
            )
        self.diff.reshape(a.shape)

    def forward_cpu(self, bottom, top):
        d = bottom[0].cpu_data() - bottom[1].cpu_data().reshape(bottom[0].shape)
        self.diff.mutable_cpu_data()[...] = d
        top[0].mutable_cpu_data()[...] = float(d.ravel() @ d.ravel()) / self.normalizer() / 2

    def backward_cpu(self, top, propagate_down, bottom):
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                g = (sign * self.grad_scale(top)) * self.diff.cpu_data()
                bottom[i].mutable_cpu_diff()[...] = g.reshape(bottom[i].shape)

    def forward_gpu(self, bottom, top):
        n, blocks = bottom[0].count, reduce_blocks(bottom[0].count)
        (partials,) = backend.workspace(blocks * math_dtype(self.dtype).itemsize, slot="reduce")  # Mtype sums
        backend.kernel(KERNELS, "euclidean_forward", self.dtype)(
            n, bottom[0].gpu_data(), bottom[1].gpu_data(), self.diff.mutable_gpu_data(), partials,
            grid=blocks, block=REDUCE_THREADS,
        )
        self.gpu_finish(blocks, partials, top, scale=0.5)

    def backward_gpu(self, top, propagate_down, bottom):
        k = backend.kernel(KERNELS, "euclidean_backward", self.dtype)
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                k(bottom[i].count, sign, top[0].gpu_diff(), self.gpu_norm(), self.diff.gpu_data(),
                  bottom[i].mutable_gpu_diff())
