"""Layer fusion the executor applies where Caffe's semantics allow it.

Convolution -> ReLU, the ReLU in place on the convolution's top with negative_slope 0 (VGG,
GoogLeNet, SqueezeNet, AlexNet), runs as one convolution whose engines apply the ReLU in their
epilogue, in every phase: the blob holds what the two layers leave, and backward runs both layers
as written (ReLU's backward reads only that blob; the convolution's does not read its top).

Convolution -> BatchNorm -> Scale (-> ReLU), written in place (``top == bottom``, as ResNet and MobileNet
write them) in a net that runs no backward through them, with BatchNorm on its global statistics
(TEST phase), is one convolution with folded weights and bias:

    f = 1 / s (0 when s == 0, Caffe's moving-average factor), g_c = gamma_c / sqrt(var_c·f + eps)
    W'[c] = W[c]·g_c,   b'_c = (b_c − mean_c·f)·g_c + beta_c

The folded weights are recomputed from the layers' current blobs on every forward (on the device,
inside captured graphs too), so weights a user changes after building are used. A following in-place
ReLU (negative_slope 0) joins as the epilogue. Because the chain is in place, the blob it writes
holds what the layers would leave there. Set ``PYCAFFE_LITE_FUSION=0`` to run every layer as written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np

from .. import common
from ..blob import Blob
from ..gpu import backend
from ..layer import Layer, create_layer
from ..proto import caffe_pb2

if TYPE_CHECKING:
    from ..net import Net


CONV_TYPES = ("Convolution", "DepthwiseConvolution", "ConvolutionDepthwise")  # the forks' depthwise types too


def fusion_enabled() -> bool:
    """False when ``PYCAFFE_LITE_FUSION=0`` asks for every layer as written."""
    return os.environ.get("PYCAFFE_LITE_FUSION", "1") != "0"


class _ReLUEpilogue(Protocol):  # the Convolution layer's fused forward (layers/convolution.py)
    def compute_forward_relu(self, bottom: list[Blob], top: list[Blob]) -> None: ...


@dataclass
class ConvReLU:
    """Layers ``first`` (Convolution) and ``last = first + 1`` (ReLU) run as one convolution."""

    first: int
    last: int
    conv: Layer

    @property
    def extra_blobs(self) -> list[Blob]:
        return []

    def forward(self, bottom: list[Blob], top: list[Blob]) -> None:
        cast(_ReLUEpilogue, self.conv).compute_forward_relu(bottom, top)


@dataclass
class ConvBNScale:
    """Layers ``first..last`` of a net replaced by one convolution with folded parameters (and a
    ReLU epilogue when ``relu``)."""

    first: int
    last: int
    conv: Layer
    bn: Layer
    scale: Layer | None
    fused: Layer  # a Convolution with a bias term whose blobs are the folded weight and bias
    relu: bool = False

    @property
    def extra_blobs(self) -> list[Blob]:
        return list(self.fused.blobs)

    def fold(self) -> None:
        """Write the folded weight and bias into ``fused``'s blobs from the current parameters."""
        w, b = self.fused.blobs
        conv, bn, scale = self.conv, self.bn, self.scale
        channels = w.shape[0]
        per_channel = w.count // channels
        has_bias = len(conv.blobs) > 1
        has_beta = scale is not None and len(scale.blobs) > 1
        eps = float(bn.layer_param.batch_norm_param.eps)
        if common.mode() is common.Mode.GPU:
            dt = w.dtype
            gamma = scale.blobs[0].gpu_data() if scale is not None else bn.blobs[0].gpu_data()
            beta = scale.blobs[1].gpu_data() if scale is not None and has_beta else gamma
            cbias = conv.blobs[1].gpu_data() if has_bias else gamma
            mean, var, s = (blob.gpu_data() for blob in bn.blobs[:3])
            factor = "(s[0] == 0 ? Dtype(0) : Dtype(1) / s[0])"
            g = f"{'gamma[c]' if scale is not None else 'Dtype(1)'} / sqrt(var[c] * {factor} + eps)"
            backend.elementwise(
                "fold_conv_weight", "const int per, const Dtype* w, const Dtype* gamma, const Dtype* var, "
                "const Dtype* s, const Dtype eps, Dtype* out", f"const int c = i / per; out[i] = w[i] * {g}",
                dt)(w.count, per_channel, conv.blobs[0].gpu_data(), gamma, var, s, eps, w.mutable_gpu_data())
            backend.elementwise(
                "fold_conv_bias", "const Dtype* cbias, const int has_bias, const Dtype* mean, const Dtype* gamma, "
                "const Dtype* var, const Dtype* s, const Dtype eps, const Dtype* beta, const int has_beta, "
                "Dtype* out",
                f"const int c = i; out[i] = ((has_bias ? cbias[c] : Dtype(0)) - mean[c] * {factor}) * {g}"
                " + (has_beta ? beta[c] : Dtype(0))",
                dt)(channels, cbias, int(has_bias), mean, gamma, var, s, eps, beta, int(has_beta),
                    b.mutable_gpu_data())
            return
        inv_s = float(bn.blobs[2].cpu_data().ravel()[0])
        inv_s = 0.0 if inv_s == 0 else 1.0 / inv_s
        cpu_mean = bn.blobs[0].cpu_data().ravel() * inv_s
        cpu_gain = 1.0 / np.sqrt(bn.blobs[1].cpu_data().ravel() * inv_s + eps)
        if scale is not None:
            cpu_gain = cpu_gain * scale.blobs[0].cpu_data().ravel()
        wdata = conv.blobs[0].cpu_data()
        w.mutable_cpu_data()[...] = wdata * cpu_gain.reshape((channels,) + (1,) * (wdata.ndim - 1)).astype(w.dtype)
        cpu_bias = conv.blobs[1].cpu_data().ravel() if has_bias else np.zeros(channels)
        cpu_beta = scale.blobs[1].cpu_data().ravel() if scale is not None and has_beta else np.zeros(channels)
        b.mutable_cpu_data()[...] = ((cpu_bias - cpu_mean) * cpu_gain + cpu_beta).astype(b.dtype)

    def forward(self, bottom: list[Blob], top: list[Blob]) -> None:
        self.fold()
        if self.relu:
            cast(_ReLUEpilogue, self.fused).compute_forward_relu(bottom, top)
        else:
            self.fused.compute_forward(bottom, top)


def _in_place(net: Net, i: int) -> bool:
    return len(net.bottom_id_vecs[i]) >= 1 and net.top_id_vecs[i] == net.bottom_id_vecs[i][:1]


def _relu_on(net: Net, k: int, blob_id: int) -> bool:
    """Layer ``k`` exists and is a ReLU with negative_slope 0, in place on blob ``blob_id``."""
    return (k < len(net.layers) and net.layers[k].type == "ReLU" and len(net.bottom_id_vecs[k]) == 1
            and _in_place(net, k) and net.bottom_id_vecs[k][0] == blob_id
            and net.layers[k].layer_param.relu_param.negative_slope == 0)


def find_fusions(net: Net) -> list[ConvBNScale | ConvReLU]:
    """The fusable chains of ``net`` in order (none when disabled)."""
    if not fusion_enabled():
        return []
    chains: list[ConvBNScale | ConvReLU] = []
    layers = net.layers
    i = 0
    while i < len(layers) - 1:
        conv = layers[i]
        bn_i = i + 1
        if (conv.type in CONV_TYPES and len(net.bottom_vecs[i]) == 1 and len(net.top_vecs[i]) == 1
                and _relu_on(net, i + 1, net.top_id_vecs[i][0])):
            chains.append(ConvReLU(i, i + 1, conv))
            i += 2
            continue
        if not (conv.type in CONV_TYPES and layers[bn_i].type == "BatchNorm"
                and len(net.bottom_vecs[i]) == 1 and len(net.top_vecs[i]) == 1
                and _in_place(net, bn_i) and net.bottom_id_vecs[bn_i][0] == net.top_id_vecs[i][0]
                and getattr(layers[bn_i], "use_global_stats", False)):
            i += 1
            continue
        last = bn_i
        scale = None
        nxt = bn_i + 1
        if (nxt < len(layers) and layers[nxt].type == "Scale" and len(net.bottom_vecs[nxt]) == 1
                and _in_place(net, nxt) and net.bottom_id_vecs[nxt][0] == net.top_id_vecs[i][0]
                and _per_channel(layers[nxt], net.top_vecs[i][0])):
            scale, last = layers[nxt], nxt
        if any(net.layer_need_backward[k] for k in range(i, last + 1)) or conv.layer_param.convolution_param.axis != 1:
            i = last + 1
            continue
        relu = _relu_on(net, last + 1, net.top_id_vecs[i][0]) and not net.layer_need_backward[last + 1]
        chains.append(ConvBNScale(first=i, last=last + 1 if relu else last, conv=conv, bn=layers[bn_i], scale=scale,
                                  fused=_folded_conv(conv, net.bottom_vecs[i], net.top_vecs[i]), relu=relu))
        i = chains[-1].last + 1
    return chains


def _per_channel(scale: Layer, blob: Blob) -> bool:
    p = scale.layer_param.scale_param
    return p.axis in (1, 1 - blob.num_axes) and p.num_axes == 1


def _folded_conv(conv: Layer, bottom: list[Blob], top: list[Blob]) -> Layer:
    """A Convolution like ``conv`` with a bias term, its weights left for :meth:`ConvBNScale.fold`."""
    lp = caffe_pb2.LayerParameter()
    lp.CopyFrom(conv.layer_param)
    lp.name = f"{conv.name} (folded BatchNorm)"
    del lp.blobs[:]
    cp = lp.convolution_param
    cp.bias_term = True
    cp.weight_filler.Clear()
    cp.weight_filler.type = "constant"
    cp.bias_filler.Clear()
    cp.bias_filler.type = "constant"
    fused = create_layer(lp, conv.dtype)
    fused.setup(bottom, top)
    return fused
