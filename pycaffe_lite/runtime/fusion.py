"""Layer fusion the executor applies where Caffe's semantics allow it.

Convolution -> ReLU, the ReLU in place on the convolution's top with negative_slope 0 (VGG,
GoogLeNet, SqueezeNet, AlexNet), runs as one convolution whose engines apply the ReLU in their
epilogue, in every phase: the blob holds what the two layers leave, and backward runs both layers
as written (ReLU's backward reads only that blob; the convolution's does not read its top).

Convolution -> BatchNorm -> Scale (-> ReLU), written in place (``top == bottom``, as ResNet and MobileNet
write them) in a net that runs no backward through them, with BatchNorm on its global statistics
(TEST phase), is one convolution with folded weights and bias (``BatchNormLayer.fold_convolution``).

The folded weights are recomputed from the layers' current blobs on every forward (on the device,
inside captured graphs too), so weights a user changes after building are used. A following in-place
ReLU (negative_slope 0) joins as the epilogue. Because the chain is in place, the blob it writes
holds what the layers would leave there. ``config.fusion`` off (``PYCAFFE_LITE_FUSION=0``) runs every
layer as written. The layers declare their parts (:class:`~pycaffe_lite.layer.Layer`'s ``fusable_convolution``,
``relu_epilogue``, ``folds_into_convolution``, ``per_channel_affine``): no layer is matched by its type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from ..blob import Blob
from ..config import config
from ..layer import Layer

if TYPE_CHECKING:
    from ..net_graph import NetGraph


def fusion_enabled() -> bool:
    """False when ``PYCAFFE_LITE_FUSION=0`` asks for every layer as written."""
    return bool(config.fusion)


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
        self.bn.fold_convolution(self.conv, self.scale, self.fused)

    def forward(self, bottom: list[Blob], top: list[Blob]) -> None:
        self.fold()
        if self.relu:
            cast(_ReLUEpilogue, self.fused).compute_forward_relu(bottom, top)
        else:
            self.fused.compute_forward(bottom, top)


def _in_place(net: NetGraph, i: int) -> bool:
    return len(net.bottom_id_vecs[i]) >= 1 and net.top_id_vecs[i] == net.bottom_id_vecs[i][:1]


def _relu_on(net: NetGraph, k: int, blob_id: int) -> bool:
    """Layer ``k`` exists and is a ReLU epilogue (negative_slope 0), in place on blob ``blob_id``."""
    return (k < len(net.layers) and net.layers[k].relu_epilogue() and len(net.bottom_id_vecs[k]) == 1
            and _in_place(net, k) and net.bottom_id_vecs[k][0] == blob_id)


def _one_to_one(net: NetGraph, i: int) -> bool:
    return len(net.bottom_vecs[i]) == 1 and len(net.top_vecs[i]) == 1


def find_fusions(net: NetGraph) -> list[ConvBNScale | ConvReLU]:
    """The fusable chains of ``net`` in order (none when disabled). The layers say what they are
    (``fusable_convolution``, ``relu_epilogue``, ``folds_into_convolution``, ``per_channel_affine``)."""
    if not fusion_enabled():
        return []
    chains: list[ConvBNScale | ConvReLU] = []
    layers = net.layers
    i = 0
    while i < len(layers) - 1:
        conv = layers[i]
        if not (conv.fusable_convolution() and _one_to_one(net, i)):
            i += 1
            continue
        out = net.top_id_vecs[i][0]
        if _relu_on(net, i + 1, out):
            chains.append(ConvReLU(i, i + 1, conv))
            i += 2
            continue
        bn_i = i + 1
        if not (layers[bn_i].folds_into_convolution() and _in_place(net, bn_i) and net.bottom_id_vecs[bn_i][0] == out):
            i += 1
            continue
        last = bn_i
        scale = None
        nxt = bn_i + 1
        if (nxt < len(layers) and len(net.bottom_vecs[nxt]) == 1 and _in_place(net, nxt)
                and net.bottom_id_vecs[nxt][0] == out and layers[nxt].per_channel_affine(net.top_vecs[i][0])):
            scale, last = layers[nxt], nxt
        if any(net.layer_need_backward[k] for k in range(i, last + 1)):
            i = last + 1
            continue
        relu = _relu_on(net, last + 1, out) and not net.layer_need_backward[last + 1]
        chains.append(ConvBNScale(first=i, last=last + 1 if relu else last, conv=conv, bn=layers[bn_i], scale=scale,
                                  fused=conv.folded_copy(net.bottom_vecs[i], net.top_vecs[i]), relu=relu))
        i = chains[-1].last + 1
    return chains
