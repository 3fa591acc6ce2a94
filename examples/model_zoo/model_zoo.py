"""Deploy nets of the classic Caffe model zoo, generated with :mod:`pycaffe_lite.net_spec`.

An example, not part of the framework package: import it from this folder (``generate.py`` and
the tests put ``examples/model_zoo`` on ``sys.path``).

Each function returns a NetParameter whose layers (names, types, tops, parameters) match the
published deploy prototxt of that model, so the published ``.caffemodel`` weights load into it by
layer name (MobileNet v2, which has no single reference Caffe file, follows torchvision's
architecture with the Caffe ports' naming):

========================  ===========================================================  ==========
function                  published model                                              input
========================  ===========================================================  ==========
:func:`alexnet`           ``bvlc_alexnet`` (grouped conv2/4/5, LRN after ReLU)          10x3x227²
:func:`caffenet`          ``bvlc_reference_caffenet`` (pooling before LRN)              10x3x227²
:func:`googlenet`         ``bvlc_googlenet`` (Inception v1, no auxiliary heads)         10x3x224²
:func:`vgg16`             ``VGG_ILSVRC_16_layers`` deploy (legacy ``input_dim`` header)  10x3x224²
:func:`resnet50`          KaimingHe ``ResNet-50-deploy`` (BatchNorm + Scale)            1x3x224²
:func:`squeezenet_v1_1`   forresti ``SqueezeNet_v1.1`` deploy                           10x3x227²
:func:`mobilenet_v1`      shicai ``MobileNet-Caffe`` v1 (depthwise = grouped conv)      1x3x224²
:func:`mobilenet_v2`      torchvision ``mobilenet_v2`` (inverted residuals, ReLU6 = Clip) 1x3x224²
:func:`fcn32s`            shelhamer ``voc-fcn32s`` (conv1_1 pad 100, Deconvolution+Crop) 1x3x500²
========================  ===========================================================  ==========

Pooling uses Caffe's default ceil rounding (GoogLeNet's and ResNet's 112 -> 56 rely on it).
``batch`` (and ``size`` where the net is size-agnostic) override the published input shape.
:func:`write_all` writes ``<model>_deploy.prototxt`` for every model; with ``flavour="published"``
``<model>_published_deploy.prototxt``, the same net in the published files' style (:func:`published`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from pycaffe_lite.net_spec import NetSpec
from pycaffe_lite.net_spec import layers as L
from pycaffe_lite.net_spec import params as P
from pycaffe_lite.proto import protoio
from pycaffe_lite.schema import caffe_pb2

# lr/decay multipliers of the weights and biases in the BVLC reference nets.
_WB = [dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)]
_BN_FROZEN = [dict(lr_mult=0, decay_mult=0)] * 3


def _input(n: NetSpec, shape: tuple[int, ...]) -> None:
    n.data = L.Input(input_param=dict(shape=dict(dim=list(shape))))


def _legacy_input(net: caffe_pb2.NetParameter, shape: tuple[int, ...]) -> caffe_pb2.NetParameter:
    """Replace the leading Input layer by the net-level ``input`` / ``input_dim`` fields that the
    older published deploy files (VGG, ResNet, MobileNet) use."""
    first = net.layer[0]
    assert first.type == "Input", first.type
    name = first.top[0]
    del net.layer[0]
    net.input.append(name)
    net.input_dim.extend(shape)
    return net


def _finish(n: NetSpec, name: str) -> caffe_pb2.NetParameter:
    net = n.to_proto()
    net.name = name
    return net


def _lrn(bottom):
    return L.LRN(bottom, local_size=5, alpha=0.0001, beta=0.75)


def _max_pool(bottom, kernel: int, stride: int, pad: int = 0):
    kw = dict(pool=P.Pooling.MAX, kernel_size=kernel, stride=stride)
    if pad:
        kw["pad"] = pad
    return L.Pooling(bottom, **kw)


# ----------------------------------------------------------------------------------------------
# AlexNet family
def _alexnet_like(name: str, batch: int, pool_before_norm: bool) -> caffe_pb2.NetParameter:
    n = NetSpec()
    _input(n, (batch, 3, 227, 227))
    n.conv1 = L.Convolution(n.data, param=_WB, num_output=96, kernel_size=11, stride=4)
    n.relu1 = L.ReLU(n.conv1, in_place=True)
    if pool_before_norm:
        n.pool1 = _max_pool(n.relu1, 3, 2)
        n.norm1 = _lrn(n.pool1)
        x = n.norm1
    else:
        n.norm1 = _lrn(n.relu1)
        n.pool1 = _max_pool(n.norm1, 3, 2)
        x = n.pool1
    n.conv2 = L.Convolution(x, param=_WB, num_output=256, pad=2, kernel_size=5, group=2)
    n.relu2 = L.ReLU(n.conv2, in_place=True)
    if pool_before_norm:
        n.pool2 = _max_pool(n.relu2, 3, 2)
        n.norm2 = _lrn(n.pool2)
        x = n.norm2
    else:
        n.norm2 = _lrn(n.relu2)
        n.pool2 = _max_pool(n.norm2, 3, 2)
        x = n.pool2
    n.conv3 = L.Convolution(x, param=_WB, num_output=384, pad=1, kernel_size=3)
    n.relu3 = L.ReLU(n.conv3, in_place=True)
    n.conv4 = L.Convolution(n.relu3, param=_WB, num_output=384, pad=1, kernel_size=3, group=2)
    n.relu4 = L.ReLU(n.conv4, in_place=True)
    n.conv5 = L.Convolution(n.relu4, param=_WB, num_output=256, pad=1, kernel_size=3, group=2)
    n.relu5 = L.ReLU(n.conv5, in_place=True)
    n.pool5 = _max_pool(n.relu5, 3, 2)
    n.fc6 = L.InnerProduct(n.pool5, param=_WB, num_output=4096)
    n.relu6 = L.ReLU(n.fc6, in_place=True)
    n.drop6 = L.Dropout(n.relu6, dropout_ratio=0.5, in_place=True)
    n.fc7 = L.InnerProduct(n.drop6, param=_WB, num_output=4096)
    n.relu7 = L.ReLU(n.fc7, in_place=True)
    n.drop7 = L.Dropout(n.relu7, dropout_ratio=0.5, in_place=True)
    n.fc8 = L.InnerProduct(n.drop7, param=_WB, num_output=1000)
    n.prob = L.Softmax(n.fc8)
    return _finish(n, name)


def alexnet(batch: int = 10) -> caffe_pb2.NetParameter:
    """bvlc_alexnet deploy: conv1 96@11x11/4, LRN(5, 1e-4, 0.75) then max-pool 3/2; conv2 256@5x5
    pad 2 group 2; conv3 384@3x3; conv4 384@3x3 group 2; conv5 256@3x3 group 2; fc6/fc7 4096
    with dropout 0.5; fc8 1000; Softmax ``prob``. 60,965,224 parameters."""
    return _alexnet_like("AlexNet", batch, pool_before_norm=False)


def caffenet(batch: int = 10) -> caffe_pb2.NetParameter:
    """bvlc_reference_caffenet deploy: AlexNet with each max-pool before its LRN."""
    return _alexnet_like("CaffeNet", batch, pool_before_norm=True)


# ----------------------------------------------------------------------------------------------
# GoogLeNet
def _xavier(std: float | None = None) -> dict:
    return dict(type="xavier", std=std) if std is not None else dict(type="xavier")


def _gconv(n: NetSpec, name: str, relu: str, bottom, nout: int, ks: int, std: float, stride: int = 1, pad: int = 0):
    kw = dict(num_output=nout, kernel_size=ks)
    if pad:
        kw["pad"] = pad
    if stride != 1:
        kw["stride"] = stride
    n[name] = L.Convolution(
        bottom, param=_WB, weight_filler=_xavier(std), bias_filler=dict(type="constant", value=0.2), **kw
    )
    n[relu] = L.ReLU(n[name], in_place=True)
    return n[relu]


# (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj) per inception module (Szegedy et al., Table 1).
GOOGLENET_INCEPTIONS: dict[str, tuple[int, int, int, int, int, int]] = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def _inception(n: NetSpec, tag: str, bottom):
    c1, r3, c3, r5, c5, pp = GOOGLENET_INCEPTIONS[tag]
    p = f"inception_{tag}/"
    b1 = _gconv(n, p + "1x1", p + "relu_1x1", bottom, c1, 1, 0.03)
    x = _gconv(n, p + "3x3_reduce", p + "relu_3x3_reduce", bottom, r3, 1, 0.09)
    b3 = _gconv(n, p + "3x3", p + "relu_3x3", x, c3, 3, 0.03, pad=1)
    x = _gconv(n, p + "5x5_reduce", p + "relu_5x5_reduce", bottom, r5, 1, 0.2)
    b5 = _gconv(n, p + "5x5", p + "relu_5x5", x, c5, 5, 0.03, pad=2)
    n[p + "pool"] = _max_pool(bottom, 3, 1, pad=1)
    bp = _gconv(n, p + "pool_proj", p + "relu_pool_proj", n[p + "pool"], pp, 1, 0.1)
    n[p + "output"] = L.Concat(b1, b3, b5, bp)
    return n[p + "output"]


def googlenet(batch: int = 10) -> caffe_pb2.NetParameter:
    """bvlc_googlenet deploy (no auxiliary classifiers): conv1/7x7_s2, max-pool, LRN, conv2
    (1x1 reduce + 3x3), LRN, max-pool, inceptions 3a-3b, pool, 4a-4e, pool, 5a-5b, 7x7 average
    pool, dropout 0.4, ``loss3/classifier`` (1000), Softmax ``prob``."""
    n = NetSpec()
    _input(n, (batch, 3, 224, 224))
    x = _gconv(n, "conv1/7x7_s2", "conv1/relu_7x7", n.data, 64, 7, 0.1, stride=2, pad=3)
    n["pool1/3x3_s2"] = _max_pool(x, 3, 2)
    n["pool1/norm1"] = _lrn(n["pool1/3x3_s2"])
    x = _gconv(n, "conv2/3x3_reduce", "conv2/relu_3x3_reduce", n["pool1/norm1"], 64, 1, 0.1)
    x = _gconv(n, "conv2/3x3", "conv2/relu_3x3", x, 192, 3, 0.03, pad=1)
    n["conv2/norm2"] = _lrn(x)
    n["pool2/3x3_s2"] = _max_pool(n["conv2/norm2"], 3, 2)
    x = n["pool2/3x3_s2"]
    for tag in ("3a", "3b", "4a", "4b", "4c", "4d", "4e", "5a", "5b"):
        if tag in ("4a", "5a"):
            stage = int(tag[0]) - 1
            n[f"pool{stage}/3x3_s2"] = _max_pool(x, 3, 2)
            x = n[f"pool{stage}/3x3_s2"]
        x = _inception(n, tag, x)
    n["pool5/7x7_s1"] = L.Pooling(x, pool=P.Pooling.AVE, kernel_size=7, stride=1)
    n["pool5/drop_7x7_s1"] = L.Dropout(n["pool5/7x7_s1"], dropout_ratio=0.4, in_place=True)
    n["loss3/classifier"] = L.InnerProduct(
        n["pool5/drop_7x7_s1"], param=_WB, num_output=1000,
        weight_filler=_xavier(), bias_filler=dict(type="constant", value=0),
    )
    n.prob = L.Softmax(n["loss3/classifier"])
    return _finish(n, "GoogleNet")


# ----------------------------------------------------------------------------------------------
# VGG-16 and FCN-32s
VGG16_STAGES: tuple[tuple[int, int], ...] = ((2, 64), (2, 128), (3, 256), (3, 512), (3, 512))


def _vgg16_body(n: NetSpec, bottom, param=None, first_pad: int = 1):
    """conv{s}_{i} 3x3 pad 1 + ReLU blocks, each stage closed by pool{s} (max 2/2)."""
    x = bottom
    extra = dict(param=param) if param else {}
    for s, (reps, width) in enumerate(VGG16_STAGES, start=1):
        for i in range(1, reps + 1):
            pad = first_pad if (s, i) == (1, 1) else 1
            conv = f"conv{s}_{i}"
            n[conv] = L.Convolution(x, num_output=width, pad=pad, kernel_size=3, **extra)
            n[f"relu{s}_{i}"] = L.ReLU(n[conv], in_place=True)
            x = n[f"relu{s}_{i}"]
        n[f"pool{s}"] = _max_pool(x, 2, 2)
        x = n[f"pool{s}"]
    return x


def vgg16(batch: int = 10) -> caffe_pb2.NetParameter:
    """VGG_ILSVRC_16_layers deploy: 13 3x3 convs in 5 stages (64, 128, 256, 512, 512), max-pool
    2/2 after each; fc6/fc7 4096 with dropout 0.5; fc8 1000; Softmax ``prob``. 138,357,544
    parameters. Uses the net-level ``input``/``input_dim`` header, as the published file does."""
    n = NetSpec()
    _input(n, (batch, 3, 224, 224))
    x = _vgg16_body(n, n.data)
    n.fc6 = L.InnerProduct(x, num_output=4096)
    n.relu6 = L.ReLU(n.fc6, in_place=True)
    n.drop6 = L.Dropout(n.relu6, dropout_ratio=0.5, in_place=True)
    n.fc7 = L.InnerProduct(n.drop6, num_output=4096)
    n.relu7 = L.ReLU(n.fc7, in_place=True)
    n.drop7 = L.Dropout(n.relu7, dropout_ratio=0.5, in_place=True)
    n.fc8 = L.InnerProduct(n.drop7, num_output=1000)
    n.prob = L.Softmax(n.fc8)
    return _legacy_input(_finish(n, "VGG_ILSVRC_16_layers"), (batch, 3, 224, 224))


def fcn32s(batch: int = 1, size: int = 500, num_classes: int = 21) -> caffe_pb2.NetParameter:
    """voc-fcn32s: VGG-16 with conv1_1 pad 100, fc6/fc7 as 7x7 and 1x1 convolutions (dropout 0.5),
    ``score_fr`` 1x1 conv to ``num_classes``, ``upscore`` Deconvolution (kernel 64, stride 32, no
    bias, lr_mult 0: fixed bilinear upsampling once initialized) and ``score`` = Crop of upscore to
    the input at offset 19 on the spatial axes. Output ``score``: (batch, num_classes, size, size)."""
    n = NetSpec()
    _input(n, (batch, 3, size, size))
    x = _vgg16_body(n, n.data, param=_WB, first_pad=100)
    n.fc6 = L.Convolution(x, param=_WB, num_output=4096, pad=0, kernel_size=7)
    n.relu6 = L.ReLU(n.fc6, in_place=True)
    n.drop6 = L.Dropout(n.relu6, dropout_ratio=0.5, in_place=True)
    n.fc7 = L.Convolution(n.drop6, param=_WB, num_output=4096, pad=0, kernel_size=1)
    n.relu7 = L.ReLU(n.fc7, in_place=True)
    n.drop7 = L.Dropout(n.relu7, dropout_ratio=0.5, in_place=True)
    n.score_fr = L.Convolution(n.drop7, param=_WB, num_output=num_classes, pad=0, kernel_size=1)
    n.upscore = L.Deconvolution(
        n.score_fr,
        convolution_param=dict(num_output=num_classes, kernel_size=64, stride=32, bias_term=False),
        param=[dict(lr_mult=0)],
    )
    n.score = L.Crop(n.upscore, n.data, crop_param=dict(axis=2, offset=19))
    return _finish(n, "FCN-32s")


# ----------------------------------------------------------------------------------------------
# ResNet-50
def _conv_bn(n: NetSpec, bottom, name: str, suffix: str, nout: int, ks: int, stride: int, pad: int, relu: bool):
    """``name`` conv (no bias) + ``bn{suffix}`` BatchNorm + ``scale{suffix}`` Scale, in place."""
    n[name] = L.Convolution(bottom, num_output=nout, kernel_size=ks, pad=pad, stride=stride, bias_term=False)
    n["bn" + suffix] = L.BatchNorm(n[name], use_global_stats=True, in_place=True)
    n["scale" + suffix] = L.Scale(n["bn" + suffix], bias_term=True, in_place=True)
    x = n["scale" + suffix]
    if relu:
        n[name + "_relu"] = L.ReLU(x, in_place=True)
        x = n[name + "_relu"]
    return x


# (blocks, bottleneck width) of stages res2..res5.
RESNET50_STAGES: tuple[tuple[int, int], ...] = ((3, 64), (4, 128), (6, 256), (3, 512))


def resnet50(batch: int = 1) -> caffe_pb2.NetParameter:
    """KaimingHe ResNet-50 deploy: conv1 7x7/2 (with bias) + bn_conv1/scale_conv1 + ReLU, max-pool
    3/2; bottleneck blocks res2a-c, res3a-d, res4a-f, res5a-c (1x1 reduce with the stride on it,
    3x3, 1x1 expand x4; projection ``branch1`` in each stage's first block), Eltwise SUM + ReLU;
    7x7 average pool, ``fc1000``, Softmax ``prob``. Every conv but conv1 has no bias; BatchNorm
    (use_global_stats) holds mean/variance/factor, Scale the learned gamma and beta."""
    n = NetSpec()
    _input(n, (batch, 3, 224, 224))
    n.conv1 = L.Convolution(n.data, num_output=64, kernel_size=7, pad=3, stride=2)
    n.bn_conv1 = L.BatchNorm(n.conv1, use_global_stats=True, in_place=True)
    n.scale_conv1 = L.Scale(n.bn_conv1, bias_term=True, in_place=True)
    n.conv1_relu = L.ReLU(n.scale_conv1, in_place=True)
    n.pool1 = L.Pooling(n.conv1_relu, kernel_size=3, stride=2, pool=P.Pooling.MAX)
    x = n.pool1
    for s, (blocks, width) in enumerate(RESNET50_STAGES, start=2):
        for b in range(blocks):
            tag = f"{s}{chr(ord('a') + b)}"
            stride = 2 if (b == 0 and s > 2) else 1
            if b == 0:
                shortcut = _conv_bn(n, x, f"res{tag}_branch1", f"{tag}_branch1", 4 * width, 1, stride, 0, False)
            else:
                shortcut = x
            y = _conv_bn(n, x, f"res{tag}_branch2a", f"{tag}_branch2a", width, 1, stride, 0, True)
            y = _conv_bn(n, y, f"res{tag}_branch2b", f"{tag}_branch2b", width, 3, 1, 1, True)
            y = _conv_bn(n, y, f"res{tag}_branch2c", f"{tag}_branch2c", 4 * width, 1, 1, 0, False)
            n[f"res{tag}"] = L.Eltwise(shortcut, y)
            n[f"res{tag}_relu"] = L.ReLU(n[f"res{tag}"], in_place=True)
            x = n[f"res{tag}_relu"]
    n.pool5 = L.Pooling(x, kernel_size=7, stride=1, pool=P.Pooling.AVE)
    n.fc1000 = L.InnerProduct(n.pool5, num_output=1000)
    n.prob = L.Softmax(n.fc1000)
    return _legacy_input(_finish(n, "ResNet-50"), (batch, 3, 224, 224))


# ----------------------------------------------------------------------------------------------
# SqueezeNet v1.1
# (squeeze, expand) of fire2..fire9.
SQUEEZENET_FIRES: dict[int, tuple[int, int]] = {
    2: (16, 64), 3: (16, 64), 4: (32, 128), 5: (32, 128),
    6: (48, 192), 7: (48, 192), 8: (64, 256), 9: (64, 256),
}


def _fire(n: NetSpec, i: int, bottom):
    sq, ex = SQUEEZENET_FIRES[i]
    p = f"fire{i}/"
    n[p + "squeeze1x1"] = L.Convolution(bottom, num_output=sq, kernel_size=1)
    n[p + "relu_squeeze1x1"] = L.ReLU(n[p + "squeeze1x1"], in_place=True)
    s = n[p + "relu_squeeze1x1"]
    n[p + "expand1x1"] = L.Convolution(s, num_output=ex, kernel_size=1)
    n[p + "relu_expand1x1"] = L.ReLU(n[p + "expand1x1"], in_place=True)
    n[p + "expand3x3"] = L.Convolution(s, num_output=ex, pad=1, kernel_size=3)
    n[p + "relu_expand3x3"] = L.ReLU(n[p + "expand3x3"], in_place=True)
    n[p + "concat"] = L.Concat(n[p + "relu_expand1x1"], n[p + "relu_expand3x3"])
    return n[p + "concat"]


def squeezenet_v1_1(batch: int = 10) -> caffe_pb2.NetParameter:
    """SqueezeNet v1.1 deploy: conv1 64@3x3/2, max-pool 3/2, fire2-3, pool3, fire4-5, pool5,
    fire6-9 (each: squeeze 1x1, expand 1x1 + expand 3x3 pad 1, Concat), dropout 0.5, conv10
    1000@1x1 + ReLU, global average pool10, Softmax ``prob``. 1,235,496 parameters."""
    n = NetSpec()
    _input(n, (batch, 3, 227, 227))
    n.conv1 = L.Convolution(n.data, num_output=64, kernel_size=3, stride=2)
    n.relu_conv1 = L.ReLU(n.conv1, in_place=True)
    n.pool1 = _max_pool(n.relu_conv1, 3, 2)
    x = n.pool1
    for i in range(2, 10):
        x = _fire(n, i, x)
        if i in (3, 5):
            n[f"pool{i}"] = _max_pool(x, 3, 2)
            x = n[f"pool{i}"]
    n.drop9 = L.Dropout(x, dropout_ratio=0.5, in_place=True)
    n.conv10 = L.Convolution(n.drop9, num_output=1000, kernel_size=1)
    n.relu_conv10 = L.ReLU(n.conv10, in_place=True)
    n.pool10 = L.Pooling(n.relu_conv10, pool=P.Pooling.AVE, global_pooling=True)
    n.prob = L.Softmax(n.pool10)
    return _finish(n, "SqueezeNet_v1.1")


# ----------------------------------------------------------------------------------------------
# MobileNet v1
# (name, output channels, stride of the depthwise conv) of the 13 separable blocks.
MOBILENET_V1_BLOCKS: tuple[tuple[str, int, int], ...] = (
    ("2_1", 64, 1), ("2_2", 128, 2), ("3_1", 128, 1), ("3_2", 256, 2), ("4_1", 256, 1),
    ("4_2", 512, 2), ("5_1", 512, 1), ("5_2", 512, 1), ("5_3", 512, 1), ("5_4", 512, 1),
    ("5_5", 512, 1), ("5_6", 1024, 2), ("6", 1024, 1),
)


def _mb_conv(n: NetSpec, bottom, conv: str, act: str | None, nout: int, ks: int, stride: int, group: int = 1,
             relu6: bool = False, engine_caffe: bool = True):
    """``conv`` (no bias, msra; grouped ones with ``engine: CAFFE`` unless ``engine_caffe`` is
    False) -> ``conv/bn`` (own top) -> ``conv/scale`` in place -> activation
    ``act``: ReLU in place, or with ``relu6`` a Clip(0, 6) with its own top (Clip's backward reads
    its input); ``act=None``: no activation (MobileNet v2's linear bottleneck)."""
    kw = dict(num_output=nout, bias_term=False, pad=(ks - 1) // 2, kernel_size=ks)
    if group > 1:
        kw["group"] = group
        if engine_caffe:
            kw["engine"] = P.Convolution.CAFFE
    n[conv] = L.Convolution(
        bottom, param=[dict(lr_mult=1, decay_mult=1)], stride=stride, weight_filler=dict(type="msra"), **kw
    )
    n[conv + "/bn"] = L.BatchNorm(n[conv], param=_BN_FROZEN)
    n[conv + "/scale"] = L.Scale(
        n[conv + "/bn"], filler=dict(value=1), bias_term=True, bias_filler=dict(value=0), in_place=True
    )
    if act is None:
        return n[conv + "/scale"]
    if relu6:
        n[act] = L.Clip(n[conv + "/scale"], clip_param=dict(min=0, max=6))
    else:
        n[act] = L.ReLU(n[conv + "/scale"], in_place=True)
    return n[act]


def mobilenet_v1(batch: int = 1) -> caffe_pb2.NetParameter:
    """shicai MobileNet v1 deploy: conv1 32@3x3/2, then 13 blocks of depthwise 3x3 (a Convolution
    with group = channels, engine CAFFE) and pointwise 1x1 ``sep`` convs, each conv followed by
    BatchNorm (own top ``<conv>/bn``), Scale and ReLU in place; global average ``pool6``, ``fc7``
    as a 1x1 Convolution to 1000 with bias. The deploy net ends at ``fc7`` (no Softmax)."""
    n = NetSpec()
    _input(n, (batch, 3, 224, 224))
    x = _mb_conv(n, n.data, "conv1", "relu1", 32, 3, 2)
    channels = 32
    for tag, nout, stride in MOBILENET_V1_BLOCKS:
        x = _mb_conv(n, x, f"conv{tag}/dw", f"relu{tag}/dw", channels, 3, stride, group=channels)
        x = _mb_conv(n, x, f"conv{tag}/sep", f"relu{tag}/sep", nout, 1, 1)
        channels = nout
    n.pool6 = L.Pooling(x, pool=P.Pooling.AVE, global_pooling=True)
    n.fc7 = L.Convolution(
        n.pool6, param=_WB, num_output=1000, kernel_size=1,
        weight_filler=dict(type="msra"), bias_filler=dict(type="constant", value=0),
    )
    return _legacy_input(_finish(n, "MOBILENET"), (batch, 3, 224, 224))


# ----------------------------------------------------------------------------------------------
# MobileNet v2
# (expansion t, output channels c, repeats n, stride s of the first repeat) per stage (Sandler et
# al., Table 2; torchvision's inverted_residual_setting).
MOBILENET_V2_STAGES: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
)


def mobilenet_v2(batch: int = 1) -> caffe_pb2.NetParameter:
    """MobileNet v2 as torchvision's ``mobilenet_v2`` (3,504,872 learnable parameters), in the
    layout of the Caffe ports: conv1 32@3x3/2; inverted residual blocks ``conv{s}_{i}`` (stage
    s = 2..8, repeat i) of 1x1 ``expand`` to t·C (absent when t = 1), 3x3 ``dwise`` (Convolution
    with group = channels, stride on it) and 1x1 ``linear`` projection without activation, an
    Eltwise SUM ``block{s}_{i}`` with the block input when the stride is 1 and the channels
    match; ``conv9`` 1280@1x1; global average ``pool9``; dropout 0.2; ``fc10`` InnerProduct 1000;
    Softmax ``prob``. The depthwise convs leave the engine to the autotune. Every conv has no bias and is followed by BatchNorm (own top ``<conv>/bn``)
    and Scale in place; ReLU6 is ``Clip`` (min 0, max 6) with its own top ``relu...``."""
    n = NetSpec()
    _input(n, (batch, 3, 224, 224))
    x = _mb_conv(n, n.data, "conv1", "relu1", 32, 3, 2, relu6=True)
    channels = 32
    for s, (t, c, reps, first_stride) in enumerate(MOBILENET_V2_STAGES, start=2):
        for i in range(1, reps + 1):
            tag = f"{s}_{i}"
            stride = first_stride if i == 1 else 1
            y = x
            if t != 1:
                y = _mb_conv(n, y, f"conv{tag}/expand", f"relu{tag}/expand", t * channels, 1, 1, relu6=True)
            y = _mb_conv(n, y, f"conv{tag}/dwise", f"relu{tag}/dwise", t * channels, 3, stride,
                         group=t * channels, relu6=True, engine_caffe=False)
            y = _mb_conv(n, y, f"conv{tag}/linear", None, c, 1, 1)
            if stride == 1 and channels == c:
                n[f"block{tag}"] = L.Eltwise(x, y, operation=P.Eltwise.SUM)
                y = n[f"block{tag}"]
            x, channels = y, c
    x = _mb_conv(n, x, "conv9", "relu9", 1280, 1, 1, relu6=True)
    n.pool9 = L.Pooling(x, pool=P.Pooling.AVE, global_pooling=True)
    n.drop9 = L.Dropout(n.pool9, dropout_ratio=0.2, in_place=True)
    n.fc10 = L.InnerProduct(
        n.drop9, param=_WB, num_output=1000,
        weight_filler=dict(type="msra"), bias_filler=dict(type="constant", value=0),
    )
    n.prob = L.Softmax(n.fc10)
    return _finish(n, "MOBILENET_V2")


# ----------------------------------------------------------------------------------------------
MODELS: dict[str, Callable[..., caffe_pb2.NetParameter]] = {
    "bvlc_alexnet": alexnet,
    "bvlc_reference_caffenet": caffenet,
    "bvlc_googlenet": googlenet,
    "vgg16": vgg16,
    "resnet50": resnet50,
    "squeezenet_v1_1": squeezenet_v1_1,
    "mobilenet_v1": mobilenet_v1,
    "mobilenet_v2": mobilenet_v2,
    "fcn32s": fcn32s,
}


# ----------------------------------------------------------------------------------------------
# The published flavour: the same nets written the way the authors' files write them.
def published(net: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """A copy of ``net`` written in the style of the published deploy files (same layer names,
    types and parameter blobs, so weights load by name from one flavour into the other):

    * the inputs as the legacy net-level ``input: "data"`` + ``input_dim`` header;
    * ``engine: CAFFE`` on every depthwise Convolution (group = num_output), as MobileNet-Caffe's files set it;
    * BatchNorm and Scale each writing a top of its own (named after the layer) instead of working
      in place; later layers read the renamed blob, activations after them stay in place on it.

    Every other field (``use_global_stats`` where the net sets it, fillers, multipliers) is kept."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    if out.layer and out.layer[0].type == "Input" and not out.input:
        first = out.layer[0]
        dims = [tuple(s.dim) for s in first.input_param.shape]
        tops = list(first.top)
        del out.layer[0]
        for top, shape in zip(tops, dims):
            out.input.append(top)
            out.input_dim.extend(shape)
    current: dict[str, str] = {}  # blob name in ``net`` -> its name now
    for lp in out.layer:
        original_bottoms = list(lp.bottom)
        for i, b in enumerate(original_bottoms):
            lp.bottom[i] = current.get(b, b)
        cp = lp.convolution_param
        if lp.type == "Convolution" and cp.group > 1 and cp.group == cp.num_output:  # depthwise
            lp.convolution_param.engine = caffe_pb2.ConvolutionParameter.CAFFE
        for i, t in enumerate(list(lp.top)):
            in_place = t in original_bottoms
            if lp.type in ("BatchNorm", "Scale") and in_place:
                lp.top[i] = lp.name
                current[t] = lp.name
            elif in_place:
                lp.top[i] = current.get(t, t)
            else:
                current.pop(t, None)
    return out


def deploy_path(folder: str | os.PathLike, name: str, flavour: str = "ours") -> Path:
    """``<name>_deploy.prototxt`` (flavour ``ours``) or ``<name>_published_deploy.prototxt``."""
    suffix = "_published_deploy" if flavour == "published" else "_deploy"
    return Path(folder) / f"{name}{suffix}.prototxt"


def write_all(folder: str | os.PathLike, models: list[str] | None = None,
              flavour: str = "ours") -> dict[str, Path]:
    """Write ``<model>_deploy.prototxt`` (``flavour="published"``: ``<model>_published_deploy
    .prototxt``, see :func:`published`) into ``folder`` (created if missing) for each model of
    :data:`MODELS` (or the named subset); returns model name -> path."""
    if flavour not in ("ours", "published"):
        raise ValueError(f"model_zoo: unknown flavour '{flavour}' (ours or published)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = list(MODELS) if models is None else list(models)
    out = {}
    for name in names:
        if name not in MODELS:
            raise KeyError(f"model_zoo: unknown model '{name}' (known: {', '.join(MODELS)})")
        path = deploy_path(folder, name, flavour)
        net = MODELS[name]()
        protoio.write_text(path, published(net) if flavour == "published" else net)
        out[name] = path
    return out
