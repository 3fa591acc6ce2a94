"""Layer fusion the executor applies where Caffe's semantics allow it.

Convolution -> ReLU, the ReLU in place on the convolution's top with negative_slope 0 (VGG,
GoogLeNet, SqueezeNet, AlexNet), runs as one convolution whose engines apply the ReLU in their
epilogue, in every phase: the blob holds what the two layers leave. On the GPU the ReLU's backward
pass also sums the bias gradient (which the convolution's weight pass then leaves out); a ReLU that
a MAX pooling reads next runs its backward inside the pooling's instead (:class:`ReLUMaxPool`).

Convolution -> BatchNorm -> Scale (-> ReLU), written in place (``top == bottom``, as ResNet and MobileNet
write them) in a net that runs no backward through them, with BatchNorm on its global statistics
(TEST phase), is one convolution with folded weights and bias (``BatchNormLayer.fold_convolution``).
Because the chain is in place, the blob it writes holds what the layers would leave there.

The same chain written with a top of its own per layer (``conv1 -> conv1/bn -> conv1/scale``, as
published MobileNet files write it) folds too in a net that runs no backward at all, when each
intermediate blob is read by the next layer of the chain only: the fused convolution writes the
last blob and *skips* the intermediate ones (:attr:`ConvBNScale.skipped`). Their values are then
the data memory plan's business (:class:`~pycaffe_lite.runtime.shared_data.SharedData`): they are
stale like overwritten blobs, and a user reading one has the net re-run its last forward without
skipping, for good. Where data sharing is off for the net, the chain runs as written.

BatchNorm -> Scale (-> ReLU) left over (nets that run backward, batch statistics, a BatchNorm after
a pooling or a sum) runs on the GPU as one forward pass (:class:`NormChain`: statistics, then one
pass writing the normalized values and the result) when the chain is written all in place (ResNet)
or with a top per layer (published files); the normalized values go where the layers keep them (the
BatchNorm's top, or its saved buffer in place, which the in-place Scale then reads as its input).
An in-place chain also runs backward as one: a pass for the per-channel sums (the Scale's
gradients) and one for the input's gradient (one in all on global statistics), when the whole
chain is in the range and its last forward was the chain's; otherwise each layer runs backward
from the state the chain's forward left, as after its own forward.

The folded weights are recomputed from the layers' current blobs before a forward whenever one of
those blobs may have been written since (``SyncedMemory.watched``: a host or device write, a
graph replay writing it), outside captured graphs; a training iteration, whose update may change
them inside its graph, folds inside it. A following in-place ReLU (negative_slope 0) joins as the
epilogue. ``config.fusion`` off (``PYCAFFE_LITE_FUSION=0``) runs every
layer as written. The layers declare their parts (``traits.fuses``, checked against their parameters by
:meth:`~pycaffe_lite.layer.Layer.fuses_as`): no layer is matched by its type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np

from ..blob import Blob
from ..config import config
from ..layer import AFFINE, CONVOLUTION, NORM_CHAIN, NORM_FOLD, RELU, RELU_MASK, SPLIT_SUM, SUM_RELU, Layer

if TYPE_CHECKING:
    from ..net_graph import NetGraph


def fusion_enabled() -> bool:
    """False when ``PYCAFFE_LITE_FUSION=0`` asks for every layer as written."""
    return bool(config.fusion)


class _ReLUEpilogue(Protocol):  # the Convolution layer's fused passes (layers/convolution.py)
    def compute_forward_relu(self, bottom: list[Blob], top: list[Blob]) -> None: ...
    def sums_bias_in_relu_backward(self) -> bool: ...
    def backward_gpu_relu(self, top: list[Blob], propagate_down: list[bool], bottom: list[Blob]) -> None: ...


@dataclass
class ConvReLU:
    """Layers ``first`` (Convolution) and ``last = first + 1`` (ReLU) run as one convolution;
    backward (GPU) runs the ReLU's pass with the bias gradient's sum in it, then the convolution's
    weight and data gradients."""

    first: int
    last: int
    conv: Layer
    vecs: tuple[list[Blob], list[Blob]]  # the convolution's (bottom, top)

    @property
    def extra_blobs(self) -> list[Blob]:
        return []

    def forward(self, bottom: list[Blob], top: list[Blob], fold: bool = False) -> None:
        """``fold``: as :meth:`ConvBNScale.forward`'s (nothing is folded here)."""
        cast(_ReLUEpilogue, self.conv).compute_forward_relu(bottom, top)

    def runs_backward(self) -> bool:
        """A convolution without a learning bias (or an N-D one) runs the two layers as written."""
        return cast(_ReLUEpilogue, self.conv).sums_bias_in_relu_backward()

    def backward(self, propagate_down: list[bool]) -> None:
        bottom, top = self.vecs
        cast(_ReLUEpilogue, self.conv).backward_gpu_relu(top, propagate_down, bottom)


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
    out: Blob | None = None  # the blob the chain leaves its result in, when not the convolution's top
    skipped: frozenset[int] = frozenset()  # ids of the intermediate blobs a fused run does not write

    @property
    def extra_blobs(self) -> list[Blob]:
        return list(self.fused.blobs)

    @property
    def sources(self) -> list[Blob]:
        """The parameter blobs the folded weight and bias are computed from."""
        return [*self.conv.blobs, *self.bn.blobs, *(self.scale.blobs if self.scale is not None else [])]

    def fold(self) -> None:
        """Write the folded weight and bias into ``fused``'s blobs from the current parameters."""
        self.bn.fold_convolution(self.conv, self.scale, self.fused)

    def forward(self, bottom: list[Blob], top: list[Blob], fold: bool = True) -> None:
        """Run the chain on ``bottom``; ``top`` is the convolution's (``out`` replaces it). ``fold``
        first writes the folded parameters (else the caller keeps them current)."""
        if fold:
            self.fold()
        out = [self.out] if self.out is not None else top
        if self.relu:
            cast(_ReLUEpilogue, self.fused).compute_forward_relu(bottom, out)
        else:
            self.fused.compute_forward(bottom, out)


class _NormHead(Protocol):  # BatchNormLayer's chain passes (layers/batch_norm.py)
    def saved_normalized(self) -> Blob: ...
    def chain_forward_gpu(self, bottom: Blob, xhat: Blob, top: Blob, scale: Layer, relu: bool) -> None: ...
    def chain_backward_gpu(self, top: Blob, xhat: Blob, bottom: Blob | None, scale: Layer, relu: bool) -> None: ...


@dataclass
class NormChain:
    """Layers ``first`` (a layer fusing as ``NORM_CHAIN``), ``first + 1`` (its per-channel Scale) and,
    when ``relu``, ``last`` (a ReLU in place on the Scale's top) as one pass each way (GPU only)."""

    first: int
    last: int
    norm: Layer
    scale: Layer
    relu: bool
    in_place: bool  # all on one blob (else the normalized values stay in the BatchNorm's top)
    saves: bool  # some layer of the chain runs backward: keep the normalized values
    members: list[Layer]  # the layers first..last
    vecs: list[tuple[list[Blob], list[Blob]]]  # each layer's (bottom, top)

    @property
    def extra_blobs(self) -> list[Blob]:
        return []

    def _normalized(self) -> Blob:
        head = cast(_NormHead, self.norm)
        if not self.in_place:
            return self.vecs[0][1][0]
        return head.saved_normalized() if self.saves else self.vecs[-1][1][0]

    def forward(self, bottom: list[Blob], top: list[Blob], fold: bool = False) -> None:
        """Reshape the layers, then run the chain from ``bottom`` (the normalization's); ``fold``
        is the other chains' (nothing is folded here)."""
        for layer, (b, t) in zip(self.members, self.vecs):
            layer.checked_reshape(b, t)
        xhat = self._normalized()
        cast(_NormHead, self.norm).chain_forward_gpu(bottom[0], xhat, self.vecs[1][1][0], self.scale, self.relu)

    def ran_forward(self, whole: bool) -> None:
        """Note (on the host, also after a graph replay) a forward over the chain's layers: ``whole``
        if it ran as the chain. An in-place Scale then reads the normalized values as its input;
        after its own forward, its saved copy."""
        self.scale.input_from = self._normalized() if whole and self.in_place and self.saves else None

    def runs_backward(self) -> bool:
        """Whether :meth:`backward` applies: in place, and the chain ran the layers' last forward."""
        return self.in_place and self.saves and self.scale.input_from is not None

    def backward(self, propagate_down: list[bool]) -> None:
        """Gradients of the chain: the Scale's params and, when ``propagate_down[0]``, the input."""
        blob = self.vecs[0][0][0]
        cast(_NormHead, self.norm).chain_backward_gpu(blob, self._normalized(), blob if propagate_down[0] else None,
                                                      self.scale, self.relu)


class _SumReLUHead(Protocol):  # EltwiseLayer's chain passes (layers/eltwise.py)
    def chain_forward_relu_gpu(self, bottom: list[Blob], top: list[Blob]) -> None: ...
    def chain_backward_relu_gpu(self, sources: list[Blob], top: list[Blob], propagate_down: list[bool],
                                bottom: list[Blob]) -> None: ...


@dataclass
class SumReLU:
    """Layers ``first`` (a sum fusing as ``SUM_RELU``), ``first + 1`` (a ReLU, negative_slope 0, in
    place on its top) and, when ``split``, ``last = first + 2`` (the Split of that top) as one
    pass each way (GPU only). Backward writes what the layers leave: the top's diff (the ReLU's
    gradient) and the bottoms' diffs."""

    first: int
    last: int
    head: Layer
    members: list[Layer]
    vecs: list[tuple[list[Blob], list[Blob]]]  # each layer's (bottom, top)
    split: bool

    @property
    def extra_blobs(self) -> list[Blob]:
        return []

    def forward(self, bottom: list[Blob], top: list[Blob], fold: bool = False) -> None:
        for layer, (b, t) in zip(self.members, self.vecs):
            layer.checked_reshape(b, t)
        cast(_SumReLUHead, self.head).chain_forward_relu_gpu(bottom, top)

    def runs_backward(self) -> bool:
        return True

    def backward(self, propagate_down: list[bool]) -> None:
        bottom, top = self.vecs[0]
        sources = self.vecs[-1][1] if self.split else top
        cast(_SumReLUHead, self.head).chain_backward_relu_gpu(sources, top, propagate_down, bottom)


class _ReLUMasker(Protocol):  # PoolingLayer's backward with the ReLU before it (layers/pooling.py)
    def backward_relu_gpu(self, top: list[Blob], bottom: list[Blob]) -> None: ...


@dataclass
class ReLUMaxPool:
    """Backward of layers ``first`` (a ReLU, negative_slope 0, in place) and ``last = first + 1``
    (a MAX pooling of its blob) as one pass (GPU only): the pooling's backward of its top
    gradient masked by its top (it fuses as ``RELU_MASK``)."""

    first: int
    last: int
    pool: Layer
    vecs: tuple[list[Blob], list[Blob]]  # the pooling's (bottom, top)

    def runs_backward(self) -> bool:
        return True

    def backward(self, propagate_down: list[bool]) -> None:
        if propagate_down[0]:
            bottom, top = self.vecs
            cast(_ReLUMasker, self.pool).backward_relu_gpu(top, bottom)


def find_backward_fusions(net: NetGraph) -> list[ReLUMaxPool]:
    """Layer pairs whose backward runs as one (none when disabled): a ReLU (negative_slope 0) in
    place on a blob that a layer fusing as ``RELU_MASK`` reads next."""
    if not fusion_enabled():
        return []
    out = []
    for k in range(len(net.layers) - 1):
        if not (_relu_on(net, k, net.top_id_vecs[k][0] if net.top_id_vecs[k] else -1)
                and _one_to_one(net, k + 1) and net.layers[k + 1].fuses_as(RELU_MASK)):
            continue
        if (net.bottom_id_vecs[k + 1] == net.top_id_vecs[k] and not _in_place(net, k + 1)
                and _one_dtype(net.layers[k:k + 2])):
            out.append(ReLUMaxPool(k, k + 1, net.layers[k + 1], (net.bottom_vecs[k + 1], net.top_vecs[k + 1])))
    return out


def _one_dtype(layers) -> bool:
    """Whether ``layers`` compute in one dtype: a fused pass runs one kernel type, so a chain mixing
    storage types (a half layer next to a float32 one, fp16 next to bf16) is not fused."""
    return len({np.dtype(layer.dtype) for layer in layers}) == 1


def _in_place(net: NetGraph, i: int) -> bool:
    return len(net.bottom_id_vecs[i]) >= 1 and net.top_id_vecs[i] == net.bottom_id_vecs[i][:1]


def _relu_on(net: NetGraph, k: int, blob_id: int) -> bool:
    """Layer ``k`` exists and is a ReLU epilogue (negative_slope 0), in place on blob ``blob_id``."""
    return (k < len(net.layers) and net.layers[k].fuses_as(RELU) and len(net.bottom_id_vecs[k]) == 1
            and _in_place(net, k) and net.bottom_id_vecs[k][0] == blob_id)


def _one_to_one(net: NetGraph, i: int) -> bool:
    return len(net.bottom_vecs[i]) == 1 and len(net.top_vecs[i]) == 1


def _layers_touching(net: NetGraph) -> dict[int, list[int]]:
    """Blob id -> the layers reading or writing it, in order."""
    users: dict[int, list[int]] = {}
    for k in range(len(net.layers)):
        for bid in dict.fromkeys(net.bottom_id_vecs[k] + net.top_id_vecs[k]):
            users.setdefault(bid, []).append(k)
    return users


def _next_in_chain(net: NetGraph, k: int, blob_id: int, users: dict[int, list[int]] | None
                   ) -> tuple[int, bool] | None:
    """Layer ``k`` (one bottom, one top) reads ``blob_id``: (the blob it leaves its result in, whether
    ``blob_id`` is skipped), or None. Out of place only in a net that runs no backward (``users``,
    :func:`_layers_touching`, given), and only when ``blob_id`` is no output or loss top and no
    other layer touches it."""
    if k >= len(net.layers) or not _one_to_one(net, k) or net.bottom_id_vecs[k][0] != blob_id:
        return None
    if _in_place(net, k):
        return blob_id, False
    if (users is None or users[blob_id] != [k - 1, k] or blob_id in net.output_blob_indices
            or net.blob_loss_weights[blob_id]):
        return None
    return net.top_id_vecs[k][0], True


def find_fusions(net: NetGraph) -> list[ConvBNScale | ConvReLU | NormChain | SumReLU]:
    """The fusable chains of ``net`` in order (none when disabled). The layers say what they are
    (``Layer.fuses_as`` a role of ``layer.FUSIONS``)."""
    if not fusion_enabled():
        return []
    chains: list[ConvBNScale | ConvReLU | NormChain | SumReLU] = []
    layers = net.layers
    users = None if any(net.layer_need_backward) else _layers_touching(net)  # out-of-place chains
    i = 0
    while i < len(layers) - 1:
        conv = layers[i]
        if not (conv.fuses_as(CONVOLUTION) and _one_to_one(net, i)):
            i += 1
            continue
        out = net.top_id_vecs[i][0]
        if _relu_on(net, i + 1, out) and _one_dtype(layers[i:i + 2]):
            chains.append(ConvReLU(i, i + 1, conv, (net.bottom_vecs[i], net.top_vecs[i])))
            i += 2
            continue
        chain, last = _conv_bn_scale(net, i, users)
        if chain is not None:
            chains.append(chain)
            i = last + 1
            continue
        i += 1
    covered = {k for chain in chains for k in range(chain.first, chain.last + 1)}
    for k in range(len(layers) - 1):
        found: NormChain | SumReLU | None = None
        if k not in covered and layers[k].fuses_as(NORM_CHAIN):
            found = _norm_chain(net, k)
        elif k not in covered and layers[k].fuses_as(SUM_RELU):
            found = _sum_relu(net, k)
        if (found is not None and not covered & set(range(found.first, found.last + 1))
                and _one_dtype(layers[found.first:found.last + 1])):
            chains.append(found)
            covered |= set(range(found.first, found.last + 1))
    return sorted(chains, key=lambda chain: chain.first)


def _sum_relu(net: NetGraph, k: int) -> SumReLU | None:
    """The sum -> in-place ReLU (-> Split of its top, at most 4 tops) chain at layer ``k``."""
    if len(net.top_id_vecs[k]) != 1:
        return None
    top = net.top_id_vecs[k][0]
    if top in net.bottom_id_vecs[k] or not _relu_on(net, k + 1, top):
        return None
    s = k + 2
    split = (s < len(net.layers) and net.layers[s].fuses_as(SPLIT_SUM) and net.bottom_id_vecs[s] == [top]
             and 2 <= len(net.top_id_vecs[s]) <= 4)
    last = s if split else k + 1
    return SumReLU(first=k, last=last, head=net.layers[k], members=net.layers[k:last + 1],
                   vecs=[(net.bottom_vecs[j], net.top_vecs[j]) for j in range(k, last + 1)], split=split)


def _norm_chain(net: NetGraph, k: int) -> NormChain | None:
    """The normalization -> per-channel Scale (-> ReLU) chain at layer ``k``: all in place on one
    blob, or each with a top of its own (the ReLU in place on the Scale's)."""
    layers, s = net.layers, k + 1
    if not (_one_to_one(net, k) and _one_to_one(net, s)):
        return None
    norm_top = net.top_id_vecs[k][0]
    in_place = _in_place(net, k)
    if (net.bottom_id_vecs[s][0] != norm_top or _in_place(net, s) != in_place
            or not layers[s].fuses_as(AFFINE, net.blobs[norm_top])):
        return None
    out = net.top_id_vecs[s][0]
    relu = _relu_on(net, s + 1, out)
    last = s + 1 if relu else s
    return NormChain(first=k, last=last, norm=layers[k], scale=layers[s], relu=relu, in_place=in_place,
                     saves=any(net.layer_need_backward[j] for j in range(k, last + 1)),
                     members=layers[k:last + 1], vecs=[(net.bottom_vecs[j], net.top_vecs[j]) for j in range(k, last + 1)])


def _conv_bn_scale(net: NetGraph, i: int, users: dict[int, list[int]] | None) -> tuple[ConvBNScale | None, int]:
    """The Convolution -> BatchNorm (-> Scale) (-> ReLU) chain from layer ``i`` (None where there is
    none or a layer of it needs backward) and the last layer matching looked at."""
    layers = net.layers
    out = net.top_id_vecs[i][0]
    bn_i = i + 1
    step = _next_in_chain(net, bn_i, out, users) if bn_i < len(layers) else None
    if step is None or not layers[bn_i].fuses_as(NORM_FOLD):
        return None, i
    cur, skip = step
    skipped = {out} if skip else set()
    last, scale = bn_i, None
    nxt = _next_in_chain(net, bn_i + 1, cur, users)
    if nxt is not None and layers[bn_i + 1].fuses_as(AFFINE, net.blobs[cur]):
        scale, last = layers[bn_i + 1], bn_i + 1
        skipped |= {cur} if nxt[1] else set()
        cur = nxt[0]
    conv = layers[i]
    if any(net.layer_need_backward[k] for k in range(i, last + 1)):
        return None, last
    relu = _relu_on(net, last + 1, cur) and not net.layer_need_backward[last + 1]
    if not _one_dtype(layers[i:last + 2 if relu else last + 1]):
        return None, last
    chain = ConvBNScale(first=i, last=last + 1 if relu else last, conv=conv, bn=layers[bn_i], scale=scale,
                        fused=conv.folded_copy(net.bottom_vecs[i], net.top_vecs[i]), relu=relu,
                        out=net.blobs[cur] if skipped else None, skipped=frozenset(skipped))
    return chain, chain.last
