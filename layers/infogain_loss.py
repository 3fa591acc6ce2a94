"""InfogainLoss: softmax followed by an infogain-weighted log loss (BVLC master semantics).

bottom[0]: scores (outer, C, inner) around the softmax axis (``infogain_loss_param.axis``,
default 1); bottom[1]: ``outer*inner`` labels in ``{0..C-1}`` (floats truncated to int); optional
bottom[2]: the infogain matrix H (C*C values), otherwise H is read from the ``.binaryproto``
``infogain_loss_param.source`` at set-up. With p = softmax(x):
``loss = -Σ_{o,s} Σ_c H[l, c]·log(max(p[o, c, s], 1e-20)) / normalizer``, l = the label at (o, s).
``loss_param``: ``ignore_label`` and ``normalization`` (default VALID, see :mod:`loss_layer`); the
deprecated ``normalize`` is rejected as in Caffe. Optional top[1]: p.
Gradient, for the scores only: ``(p[c]·Σ_k H[l, k] - H[l, c])·w / normalizer`` (0 where ignored).
With H the identity this is SoftmaxWithLoss (up to the clamp).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Traits, register_layer
from pycaffe_lite.proto.protoio import read_binary
from pycaffe_lite.schema import caffe_pb2

from .loss_layer import LOG_THRESHOLD
from .softmax_loss import SoftmaxWithLossLayer

KERNELS = Path(__file__).with_suffix(".cu")


def infogain_axis(param: caffe_pb2.InfogainLossParameter) -> int:
    """``param.axis`` (BVLC master; default 1), or 1 when the schema has no such field."""
    return param.axis if "axis" in param.DESCRIPTOR.fields_by_name else 1


@register_layer("InfogainLoss")
class InfogainLossLayer(SoftmaxWithLossLayer):
    """SoftmaxWithLoss's softmax, label checks, reduction and normalization with H-weighted
    per-position losses and gradients."""
    traits = Traits(graph_safe=True, backward_reads=('bottom',))

    exact_num_bottom_blobs = None
    min_bottom_blobs = 2
    max_bottom_blobs = 3
    label_bottoms = (1, 2)  # labels and H take no gradient
    accepts_normalize = False

    def inner_softmax_param(self) -> caffe_pb2.SoftmaxParameter:
        return caffe_pb2.SoftmaxParameter(axis=infogain_axis(self.layer_param.infogain_loss_param))

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        ip = self.layer_param.infogain_loss_param
        self.infogain: Blob | None = None
        if len(bottom) < 3:
            if not ip.source:
                raise self.error("infogain_loss_param.source is required when H is not given as bottom 2")
            proto = read_binary(ip.source, caffe_pb2.BlobProto(), "infogain matrix (BlobProto)")
            self.infogain = Blob((), self.dtype)
            self.infogain.from_proto(proto, where=f"{self.where}: infogain matrix {ip.source}")
        self.row_sums = Blob((), self.dtype)

    def _h(self, bottom) -> Blob:
        if len(bottom) >= 3:
            return bottom[2]
        assert self.infogain is not None, "layer_setup loads H when no bottom gives it"
        return self.infogain

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        h = self._h(bottom)
        if h.count != self.classes * self.classes:
            raise self.error(
                f"the infogain matrix H must be {self.classes}x"
                f"{self.classes} for {self.classes} labels, got shape {h.shape}", ShapeError
            )
        self.row_sums.reshape((self.classes,))

    # -- CPU: the per-position math inside SoftmaxWithLoss's forward_cpu/backward_cpu --------------
    def _matrix(self, bottom) -> np.ndarray:
        return self._h(bottom).cpu_data().reshape(self.classes, self.classes)

    def position_loss_cpu(self, bottom, labels: np.ndarray) -> np.ndarray:
        logp = np.log(np.maximum(self._prob(), self.dtype.type(LOG_THRESHOLD)))
        weights = self._matrix(bottom)[labels]  # (outer, inner, C): the row H[l] of each position
        return -np.einsum("osc,ocs->os", weights, logp)

    def position_grad_cpu(self, bottom, labels: np.ndarray, valid: np.ndarray) -> np.ndarray:
        h = self._matrix(bottom)
        sums = h.sum(axis=1)[labels]  # (outer, inner)
        return self._prob() * sums[:, None, :] - h[labels].transpose(0, 2, 1)

    # -- GPU: per-position loss kernel (in SoftmaxWithLoss's forward_gpu), gradient kernels ------
    def position_loss_gpu(self, bottom, n: int, loss: int, valid: int) -> None:
        backend.kernel(KERNELS, "infogain_forward", self.dtype)(
            n, self.prob.gpu_data(), bottom[1].gpu_data(), self._h(bottom).gpu_data(), self.classes,
            self.inner, int(self.has_ignore_label), self.ignore_label, loss, valid, self.gpu_status(),
        )

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        c, h = self.classes, self._h(bottom).gpu_data()
        backend.kernel(KERNELS, "infogain_row_sums", self.dtype)(c, h, self.row_sums.mutable_gpu_data())
        backend.kernel(KERNELS, "infogain_backward", self.dtype)(
            bottom[0].count, self.prob.gpu_data(), bottom[1].gpu_data(), h, self.row_sums.gpu_data(), c,
            self.inner, int(self.has_ignore_label), self.ignore_label, top[0].gpu_diff(), self.gpu_norm(),
            bottom[0].mutable_gpu_diff(),
        )
