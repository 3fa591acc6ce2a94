"""Model zoo: the generated deploy prototxts of AlexNet, CaffeNet, GoogLeNet, VGG-16, ResNet-50,
SqueezeNet v1.1, MobileNet v1 and v2 and FCN-32s build unchanged, have the published parameter
counts and shapes and the published blob shapes (Caffe's ceil pooling), and run forward on random
weights (CPU; GPU agreement marked ``gpu``). MobileNet v2's figures are torchvision's.

"Learnable" parameters: every param blob except BatchNorm's statistics (mean, variance, moving
average factor) and blobs with lr_mult 0 (FCN's fixed bilinear ``upscore``). Scale layers' gamma
and beta count, as do biases.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.net import load_net_param
from pycaffe_lite.proto import protoio
from pycaffe_lite.schema import caffe_pb2

ZOO_DIR = Path(__file__).resolve().parents[2] / "examples" / "model_zoo"
sys.path.insert(0, str(ZOO_DIR))
import model_zoo  # noqa: E402  (examples/model_zoo/model_zoo.py: the generator, outside the package)

WB = "weights+bias"
ALEXNET_SHAPES = {
    "conv1": [(96, 3, 11, 11), (96,)],
    "conv2": [(256, 48, 5, 5), (256,)],
    "conv3": [(384, 256, 3, 3), (384,)],
    "conv4": [(384, 192, 3, 3), (384,)],
    "conv5": [(256, 192, 3, 3), (256,)],
    "fc6": [(4096, 9216), (4096,)],
    "fc7": [(4096, 4096), (4096,)],
    "fc8": [(1000, 4096), (1000,)],
}
ALEXNET_BLOBS = {
    "conv1": (10, 96, 55, 55), "pool1": (10, 96, 27, 27),
    "conv2": (10, 256, 27, 27), "pool2": (10, 256, 13, 13), "conv5": (10, 256, 13, 13),
    "pool5": (10, 256, 6, 6), "fc6": (10, 4096), "prob": (10, 1000),
}

# Published figures. total: all param blobs; learnable: see the module docstring.
SPECS: dict[str, dict] = {
    "bvlc_alexnet": dict(
        total=60_965_224, learnable=60_965_224, params=ALEXNET_SHAPES,
        blobs={**ALEXNET_BLOBS, "norm1": (10, 96, 55, 55), "norm2": (10, 256, 27, 27)},
        output="prob", logits="fc8", out_shape=(1, 1000),
    ),
    "bvlc_reference_caffenet": dict(  # pooling before LRN
        total=60_965_224, learnable=60_965_224, params=ALEXNET_SHAPES,
        blobs={**ALEXNET_BLOBS, "norm1": (10, 96, 27, 27), "norm2": (10, 256, 13, 13)},
        output="prob", logits="fc8", out_shape=(1, 1000),
    ),
    # bvlc_googlenet without the two auxiliary heads: 6,998,552.
    "bvlc_googlenet": dict(
        total=6_998_552, learnable=6_998_552,
        params={
            "conv1/7x7_s2": [(64, 3, 7, 7), (64,)],
            "conv2/3x3_reduce": [(64, 64, 1, 1), (64,)],
            "conv2/3x3": [(192, 64, 3, 3), (192,)],
            "inception_3a/1x1": [(64, 192, 1, 1), (64,)],
            "inception_3a/5x5": [(32, 16, 5, 5), (32,)],
            "inception_3b/pool_proj": [(64, 256, 1, 1), (64,)],
            "inception_4e/pool_proj": [(128, 528, 1, 1), (128,)],
            "inception_5b/3x3": [(384, 192, 3, 3), (384,)],
            "loss3/classifier": [(1000, 1024), (1000,)],
        },
        blobs={
            "conv1/7x7_s2": (10, 64, 112, 112), "pool1/3x3_s2": (10, 64, 56, 56),
            "pool2/3x3_s2": (10, 192, 28, 28), "inception_3a/output": (10, 256, 28, 28),
            "inception_3b/output": (10, 480, 28, 28), "pool3/3x3_s2": (10, 480, 14, 14),
            "inception_4a/output": (10, 512, 14, 14), "inception_4d/output": (10, 528, 14, 14),
            "inception_4e/output": (10, 832, 14, 14), "pool4/3x3_s2": (10, 832, 7, 7),
            "inception_5b/output": (10, 1024, 7, 7), "pool5/7x7_s1": (10, 1024, 1, 1),
            "prob": (10, 1000),
        },
        output="prob", logits="loss3/classifier", out_shape=(1, 1000),
    ),
    "vgg16": dict(
        total=138_357_544, learnable=138_357_544,
        params={
            "conv1_1": [(64, 3, 3, 3), (64,)],
            "conv3_3": [(256, 256, 3, 3), (256,)],
            "conv5_3": [(512, 512, 3, 3), (512,)],
            "fc6": [(4096, 25088), (4096,)],
            "fc8": [(1000, 4096), (1000,)],
        },
        blobs={"conv1_2": (10, 64, 224, 224), "pool1": (10, 64, 112, 112), "pool4": (10, 512, 14, 14),
               "pool5": (10, 512, 7, 7), "fc7": (10, 4096), "prob": (10, 1000)},
        output="prob", logits="fc8", out_shape=(1, 1000),
    ),
    # torchvision's 25,557,032 (conv + BN gamma/beta + fc) plus the 64 biases of Caffe's conv1;
    # the BatchNorm statistics add 53,173 more blobs entries (2 x 26,560 channels + 53 factors).
    "resnet50": dict(
        total=25_557_096 + 2 * 26_560 + 53, learnable=25_557_096,
        params={
            "conv1": [(64, 3, 7, 7), (64,)],
            "bn_conv1": [(64,), (64,), (1,)],
            "scale_conv1": [(64,), (64,)],
            "res2a_branch1": [(256, 64, 1, 1)],
            "res2a_branch2b": [(64, 64, 3, 3)],
            "res3a_branch2a": [(128, 256, 1, 1)],
            "res4f_branch2c": [(1024, 256, 1, 1)],
            "res5a_branch1": [(2048, 1024, 1, 1)],
            "res5c_branch2c": [(2048, 512, 1, 1)],
            "scale5c_branch2c": [(2048,), (2048,)],
            "fc1000": [(1000, 2048), (1000,)],
        },
        blobs={"conv1": (1, 64, 112, 112), "pool1": (1, 64, 56, 56), "res2c": (1, 256, 56, 56),
               "res3d": (1, 512, 28, 28), "res4f": (1, 1024, 14, 14), "res5c": (1, 2048, 7, 7),
               "pool5": (1, 2048, 1, 1), "prob": (1, 1000)},
        output="prob", logits="fc1000", out_shape=(1, 1000),
    ),
    "squeezenet_v1_1": dict(
        total=1_235_496, learnable=1_235_496,
        params={
            "conv1": [(64, 3, 3, 3), (64,)],
            "fire2/squeeze1x1": [(16, 64, 1, 1), (16,)],
            "fire2/expand3x3": [(64, 16, 3, 3), (64,)],
            "fire9/expand1x1": [(256, 64, 1, 1), (256,)],
            "conv10": [(1000, 512, 1, 1), (1000,)],
        },
        blobs={"conv1": (10, 64, 113, 113), "pool1": (10, 64, 56, 56), "fire2/concat": (10, 128, 56, 56),
               "pool3": (10, 128, 28, 28), "pool5": (10, 256, 14, 14), "fire9/concat": (10, 512, 14, 14),
               "conv10": (10, 1000, 14, 14), "pool10": (10, 1000, 1, 1), "prob": (10, 1000, 1, 1)},
        output="prob", logits="pool10", out_shape=(1, 1000, 1, 1),
    ),
    # 4,231,976 = convs (no bias) + Scale gamma/beta + fc7; BatchNorm statistics: 2 x 10,944 + 27.
    "mobilenet_v1": dict(
        total=4_231_976 + 2 * 10_944 + 27, learnable=4_231_976,
        params={
            "conv1": [(32, 3, 3, 3)],
            "conv1/bn": [(32,), (32,), (1,)],
            "conv1/scale": [(32,), (32,)],
            "conv2_1/dw": [(32, 1, 3, 3)],
            "conv2_1/sep": [(64, 32, 1, 1)],
            "conv5_6/dw": [(512, 1, 3, 3)],
            "conv6/dw": [(1024, 1, 3, 3)],
            "conv6/sep": [(1024, 1024, 1, 1)],
            "fc7": [(1000, 1024, 1, 1), (1000,)],
        },
        blobs={"conv1/bn": (1, 32, 112, 112), "conv2_2/sep/bn": (1, 128, 56, 56),
               "conv3_2/sep/bn": (1, 256, 28, 28), "conv4_2/sep/bn": (1, 512, 14, 14),
               "conv5_6/dw/bn": (1, 512, 7, 7), "conv6/sep/bn": (1, 1024, 7, 7),
               "pool6": (1, 1024, 1, 1), "fc7": (1, 1000, 1, 1)},
        output="fc7", logits=None, out_shape=(1, 1000, 1, 1),
    ),
    # torchvision's mobilenet_v2: 3,504,872 (convs without bias + BN gamma/beta as Scale + fc with
    # bias); BatchNorm statistics: 2 x 17,056 channels + 52 factors (52 BatchNorm layers).
    "mobilenet_v2": dict(
        total=3_504_872 + 2 * 17_056 + 52, learnable=3_504_872,
        params={
            "conv1": [(32, 3, 3, 3)],
            "conv1/bn": [(32,), (32,), (1,)],
            "conv2_1/dwise": [(32, 1, 3, 3)],
            "conv2_1/linear": [(16, 32, 1, 1)],
            "conv3_1/expand": [(96, 16, 1, 1)],
            "conv3_1/dwise": [(96, 1, 3, 3)],
            "conv3_1/linear": [(24, 96, 1, 1)],
            "conv8_1/expand": [(960, 160, 1, 1)],
            "conv8_1/linear": [(320, 960, 1, 1)],
            "conv8_1/linear/scale": [(320,), (320,)],
            "conv9": [(1280, 320, 1, 1)],
            "fc10": [(1000, 1280), (1000,)],
        },
        # 224 -> 112 (conv1) -> 112, 56, 28, 14, 14, 7, 7 after the stages (strides 1 2 2 2 1 2 1)
        blobs={"relu1": (1, 32, 112, 112), "conv2_1/linear/bn": (1, 16, 112, 112),
               "relu3_1/expand": (1, 96, 112, 112), "relu3_1/dwise": (1, 96, 56, 56),
               "block3_2": (1, 24, 56, 56), "block4_3": (1, 32, 28, 28), "block5_4": (1, 64, 14, 14),
               "conv6_1/linear/bn": (1, 96, 14, 14), "block6_3": (1, 96, 14, 14),
               "relu7_1/dwise": (1, 576, 7, 7), "relu7_2/dwise": (1, 960, 7, 7),
               "block7_3": (1, 160, 7, 7),
               "conv8_1/linear/bn": (1, 320, 7, 7), "relu9": (1, 1280, 7, 7), "pool9": (1, 1280, 1, 1),
               "fc10": (1, 1000), "prob": (1, 1000)},
        output="prob", logits="fc10", out_shape=(1, 1000),
    ),
    # VGG-16 without fc8 (134,260,544) + score_fr (86,037) = 134,346,581 learned, the paper's
    # "134M"; plus the fixed 21x21x64x64 bilinear upscore.
    "fcn32s": dict(
        total=134_346_581 + 21 * 21 * 64 * 64, learnable=134_346_581,
        params={
            "conv1_1": [(64, 3, 3, 3), (64,)],
            "fc6": [(4096, 512, 7, 7), (4096,)],
            "fc7": [(4096, 4096, 1, 1), (4096,)],
            "score_fr": [(21, 4096, 1, 1), (21,)],
            "upscore": [(21, 21, 64, 64)],
        },
        blobs={"conv1_1": (1, 64, 698, 698), "pool1": (1, 64, 349, 349), "pool2": (1, 128, 175, 175),
               "pool5": (1, 512, 22, 22), "fc7": (1, 4096, 16, 16), "upscore": (1, 21, 544, 544),
               "score": (1, 21, 500, 500)},
        output="score", logits=None, out_shape=(1, 21, 64, 64), input_hw=(64, 64),
    ),
}


def test_generator_is_outside_the_package():
    import importlib.util

    assert importlib.util.find_spec("pycaffe_lite.model_zoo") is None
    assert Path(model_zoo.__file__).resolve().parent == ZOO_DIR


def test_specs_cover_every_model():
    assert set(SPECS) == set(model_zoo.MODELS)


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def paths(zoo_dir):
    return model_zoo.write_all(zoo_dir)


def test_write_all_round_trips(paths, zoo_dir):
    assert sorted(p.name for p in zoo_dir.iterdir()) == sorted(f"{m}_deploy.prototxt" for m in model_zoo.MODELS)
    for name, path in paths.items():
        text = path.read_text()
        parsed = protoio.parse_text(text, caffe_pb2.NetParameter(), str(path))
        assert parsed == model_zoo.MODELS[name](), name
        names = [lp.name for lp in parsed.layer]
        assert len(names) == len(set(names)), f"{name}: duplicate layer names"


def test_write_all_subset_and_unknown(tmp_path):
    out = model_zoo.write_all(tmp_path / "sub", ["bvlc_alexnet"])
    assert list(out) == ["bvlc_alexnet"] and out["bvlc_alexnet"].is_file()
    with pytest.raises(KeyError, match="unknown model 'nope'"):
        model_zoo.write_all(tmp_path, ["nope"])


def test_published_layer_details():
    """Spot checks of the published layer parameters (independent of the builders' helpers)."""
    alex = {lp.name: lp for lp in model_zoo.alexnet().layer}
    caffe_ = [lp.name for lp in model_zoo.caffenet().layer]
    assert [lp.name for lp in model_zoo.alexnet().layer][1:9] == [
        "conv1", "relu1", "norm1", "pool1", "conv2", "relu2", "norm2", "pool2"]
    assert caffe_[1:9] == ["conv1", "relu1", "pool1", "norm1", "conv2", "relu2", "pool2", "norm2"]
    lrn = alex["norm1"].lrn_param
    assert (lrn.local_size, lrn.alpha, lrn.beta) == (5, pytest.approx(1e-4), pytest.approx(0.75))
    assert list(alex["conv1"].convolution_param.stride) == [4]
    assert [p.lr_mult for p in alex["fc8"].param] == [1, 2] and [p.decay_mult for p in alex["fc8"].param] == [1, 0]
    assert alex["relu1"].top == alex["relu1"].bottom == ["conv1"]

    g = {lp.name: lp for lp in model_zoo.googlenet().layer}
    assert g["inception_3a/pool"].pooling_param.pool == caffe_pb2.PoolingParameter.MAX
    assert g["inception_3a/pool"].pooling_param.pad == 1
    assert list(g["inception_3a/output"].bottom) == [
        "inception_3a/1x1", "inception_3a/3x3", "inception_3a/5x5", "inception_3a/pool_proj"]
    assert g["pool5/drop_7x7_s1"].dropout_param.dropout_ratio == pytest.approx(0.4)

    vgg = model_zoo.vgg16()
    assert list(vgg.input) == ["data"] and list(vgg.input_dim) == [10, 3, 224, 224]

    r = {lp.name: lp for lp in model_zoo.resnet50().layer}
    assert r["conv1"].convolution_param.bias_term and not r["res2a_branch2a"].convolution_param.bias_term
    assert list(r["res3a_branch2a"].convolution_param.stride) == [2]  # stride on the 1x1 reduce
    assert list(r["res3a_branch2b"].convolution_param.stride) == [1]
    assert list(r["res2b"].bottom) == ["res2a", "res2b_branch2c"]
    assert r["bn2a_branch1"].batch_norm_param.use_global_stats

    m = {lp.name: lp for lp in model_zoo.mobilenet_v1().layer}
    dw = m["conv5_6/dw"].convolution_param
    assert (dw.num_output, dw.group, list(dw.stride), dw.engine) == (512, 512, [2], caffe_pb2.ConvolutionParameter.CAFFE)
    assert list(m["conv1/bn"].top) == ["conv1/bn"] and list(m["conv1/scale"].top) == ["conv1/bn"]

    v2 = {lp.name: lp for lp in model_zoo.mobilenet_v2().layer}
    dw = v2["conv7_1/dwise"].convolution_param
    assert (dw.num_output, dw.group, list(dw.stride), list(dw.pad)) == (576, 576, [2], [1])
    assert "conv2_1/expand" not in v2  # expansion 1: no expand conv, as torchvision
    clip = v2["relu4_2/expand"]
    assert clip.type == "Clip" and (clip.clip_param.min, clip.clip_param.max) == (0, 6)
    assert list(clip.top) != list(clip.bottom)  # Clip's backward reads its input
    residual = sorted(name for name, lp in v2.items() if lp.type == "Eltwise")
    assert residual == ["block3_2", "block4_2", "block4_3", "block5_2", "block5_3", "block5_4",
                        "block6_2", "block6_3", "block7_2", "block7_3"]
    assert list(v2["block5_3"].bottom) == ["block5_2", "conv5_3/linear/bn"]
    assert sum(lp.type == "BatchNorm" for lp in v2.values()) == 52
    assert v2["drop9"].dropout_param.dropout_ratio == pytest.approx(0.2)

    f = {lp.name: lp for lp in model_zoo.fcn32s().layer}
    assert list(f["conv1_1"].convolution_param.pad) == [100]
    up = f["upscore"].convolution_param
    assert (up.num_output, list(up.kernel_size), list(up.stride), up.bias_term) == (21, [64], [32], False)
    assert (f["score"].crop_param.axis, list(f["score"].crop_param.offset)) == (2, [19])
    assert list(f["score"].bottom) == ["upscore", "data"]


# ----------------------------------------------------------------------------------------------
# one net per model, shared by the tests below (pytest runs them grouped by model)
# the two largest nets' CPU forwards take seconds: the slow step runs them
@pytest.fixture(scope="module", params=[pytest.param(n, marks=pytest.mark.slow) if n in ("fcn32s", "vgg16") else n
                                        for n in SPECS])
def built(request, paths):
    caffe.set_mode_cpu()
    name = request.param
    net = caffe.Net(str(paths[name]), caffe.TEST)
    yield name, net
    del net


def _counts(name: str, net) -> tuple[int, int]:
    param = load_net_param(model_zoo.MODELS[name]())
    specs = {lp.name: lp for lp in param.layer}
    total = learnable = 0
    for lname, blobs in net.params.items():
        lp = specs[lname]
        for j, blob in enumerate(blobs):
            total += blob.count
            frozen = lp.type == "BatchNorm" or (j < len(lp.param) and lp.param[j].lr_mult == 0)
            learnable += 0 if frozen else blob.count
    return total, learnable


@pytest.mark.slow
def test_parameter_counts(built):
    name, net = built
    total, learnable = _counts(name, net)
    assert learnable == SPECS[name]["learnable"], name
    assert total == SPECS[name]["total"], name


def test_parameter_shapes(built):
    name, net = built
    params = net.params
    for lname, shapes in SPECS[name]["params"].items():
        assert [tuple(b.shape) for b in params[lname]] == shapes, f"{name}: {lname}"


def test_published_blob_shapes(built):
    """Blob shapes at the published input size (ceil-mode pooling, padding, grouping, crop)."""
    name, net = built
    for bname, shape in SPECS[name]["blobs"].items():
        assert tuple(net.blobs[bname].shape) == shape, f"{name}: blob {bname}"


def _randomize(net, seed: int = 0) -> None:
    """He-uniform weights, small biases, BatchNorm with plausible statistics (factor 1), Scale
    gamma near 1: activations stay O(1) through every net."""
    rng = np.random.default_rng(seed)
    for lname, blobs in net.params.items():
        ltype = net.layer_dict[lname].type
        if ltype == "BatchNorm":
            c = blobs[0].count
            blobs[0].data[...] = rng.normal(0.0, 0.1, c)
            blobs[1].data[...] = rng.uniform(0.5, 1.5, c)
            blobs[2].data[...] = 1.0
            continue
        for j, blob in enumerate(blobs):
            shape = blob.shape
            if ltype == "Scale" and j == 0:
                blob.data[...] = rng.uniform(0.5, 1.0, shape)
            elif len(shape) == 1:
                blob.data[...] = rng.uniform(-0.1, 0.1, shape)
            else:
                fan_in = int(np.prod(shape[1:]))
                if ltype == "Deconvolution":  # each output sees ~ in*k*k/stride^2 inputs
                    fan_in = max(1, shape[0] * shape[2] * shape[3] // 1024)
                a = np.float32(np.sqrt(6.0 / fan_in))
                blob.data[...] = (rng.random(shape, dtype=np.float32) * 2 - 1) * a


def _prepare(name: str, net, seed: int = 1) -> tuple[tuple[int, ...], np.ndarray]:
    """Batch 1 (FCN at its test size), random weights and input; returns the old input shape."""
    data = net.blobs["data"]
    old = tuple(data.shape)
    hw = SPECS[name].get("input_hw", old[2:])
    data.reshape(1, old[1], *hw)
    net.reshape()
    _randomize(net)
    x = np.random.default_rng(seed).standard_normal(data.shape).astype(np.float32)
    return old, x


def _restore(net, old) -> None:
    net.blobs["data"].reshape(*old)
    net.reshape()


@pytest.mark.slow
def test_forward_cpu(built):
    name, net = built
    spec = SPECS[name]
    old, x = _prepare(name, net)
    try:
        out = net.forward(data=x)
        y = out[spec["output"]]
        assert y.shape == spec["out_shape"], name
        assert np.isfinite(y).all(), name
        assert y.std() > 0, f"{name}: constant output"
        if spec["logits"] is not None:  # the deploy net ends in Softmax
            probs = y.reshape(1, -1).astype(np.float64)
            np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
            z = net.blobs[spec["logits"]].data.reshape(1, -1).astype(np.float64)
            e = np.exp(z - z.max(axis=1, keepdims=True))
            np.testing.assert_allclose(probs, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-7)
        if name == "fcn32s":  # score is the (19, 19) window of upscore
            up = net.blobs["upscore"].data
            assert up.shape == (1, 21, 128, 128)
            np.testing.assert_array_equal(y, up[:, :, 19:83, 19:83])
        if name == "resnet50":  # identity shortcut: res2b = relu(res2a + res2b_branch2c)
            expect = np.maximum(net.blobs["res2a"].data + net.blobs["res2b_branch2c"].data, 0)
            np.testing.assert_allclose(net.blobs["res2b"].data, expect, rtol=1e-5, atol=1e-5)
        if name == "mobilenet_v2":  # ReLU6 as Clip; identity shortcut without activation
            assert 0 <= net.blobs["relu9"].data.min() and net.blobs["relu9"].data.max() <= 6
            np.testing.assert_allclose(net.blobs["block4_3"].data,
                                       net.blobs["block4_2"].data + net.blobs["conv4_3/linear/bn"].data,
                                       rtol=1e-5, atol=1e-5)
        if name == "squeezenet_v1_1":  # global average pooling
            np.testing.assert_allclose(
                net.blobs["pool10"].data[..., 0, 0], net.blobs["conv10"].data.mean(axis=(2, 3)), rtol=1e-4, atol=1e-6
            )
    finally:
        _restore(net, old)


@pytest.mark.gpu
def test_forward_gpu_matches_cpu(built):
    """Same weights and input: every blob after a GPU forward equals the CPU one (float32)."""
    name, net = built
    old, x = _prepare(name, net)
    try:
        caffe.set_mode_cpu()
        net.forward(data=x)
        cpu = {b: net.blobs[b].data.copy() for b in net.blobs}
        caffe.set_mode_gpu()
        net.forward(data=x)
        for b, ref in cpu.items():
            got = net.blobs[b].data
            scale = float(np.abs(ref).max()) if ref.size else 0.0
            np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * scale + 1e-6, err_msg=f"{name}: blob {b}")
    finally:
        caffe.set_mode_cpu()
        _restore(net, old)


@pytest.mark.slow
def test_example_prototxts_are_current():
    """examples/model_zoo holds the generator's current output."""
    folder = ZOO_DIR
    for name, build in model_zoo.MODELS.items():
        path = folder / f"{name}_deploy.prototxt"
        assert path.is_file(), f"{path} missing: run python examples/model_zoo/generate.py"
        parsed = protoio.parse_text(path.read_text(), caffe_pb2.NetParameter(), str(path))
        assert parsed == build(), f"{path} is stale: run python examples/model_zoo/generate.py"


@pytest.mark.slow
def test_generate_script(tmp_path, capsys):
    import runpy

    script = ZOO_DIR / "generate.py"
    mod = runpy.run_path(str(script), run_name="model_zoo_generate")
    assert mod["main"](["--out", str(tmp_path), "--models", "squeezenet_v1_1", "--summary"]) == 0
    out = capsys.readouterr().out
    assert "1,235,496 learnable" in out and "prob (10, 1000, 1, 1)" in out
    assert (tmp_path / "squeezenet_v1_1_deploy.prototxt").is_file()


@pytest.mark.slow
def test_published_prototxts_are_current():
    """examples/model_zoo also holds the published-style flavour of every net, current."""
    for name, build in model_zoo.MODELS.items():
        path = model_zoo.deploy_path(ZOO_DIR, name, "published")
        assert path.is_file(), f"{path} missing: run python examples/model_zoo/generate.py --published"
        parsed = protoio.parse_text(path.read_text(), caffe_pb2.NetParameter(), str(path))
        assert parsed == model_zoo.published(build()), f"{path} is stale"


@pytest.mark.parametrize("name", ["mobilenet_v2", "mobilenet_v1", "resnet50", "bvlc_alexnet", "fcn32s"])
def test_published_style(name):
    """Legacy input header, engine CAFFE on exactly the depthwise convs, BatchNorm and Scale never
    in place, everything else (names, types, params, use_global_stats) as our flavour."""
    ours, pub = model_zoo.MODELS[name](), model_zoo.published(model_zoo.MODELS[name]())
    has_input_layer = ours.layer[0].type == "Input"
    dims = list(ours.layer[0].input_param.shape[0].dim) if has_input_layer else list(ours.input_dim)
    layers = ours.layer[1:] if has_input_layer else ours.layer
    assert list(pub.input) == ["data"] and list(pub.input_dim) == dims
    assert [(lp.name, lp.type) for lp in pub.layer] == [(lp.name, lp.type) for lp in layers]
    produced = set(pub.input)
    for mine, lp in zip(layers, pub.layer):
        cp = lp.convolution_param
        depthwise = lp.type == "Convolution" and cp.group > 1 and cp.group == cp.num_output
        assert (cp.engine == caffe_pb2.ConvolutionParameter.CAFFE) == depthwise or mine.convolution_param.engine, lp.name
        if lp.type in ("BatchNorm", "Scale"):
            assert list(lp.top) == [lp.name] and lp.name not in lp.bottom, lp.name
        assert mine.batch_norm_param == lp.batch_norm_param and list(mine.param) == list(lp.param)
        assert all(b in produced for b in lp.bottom), f"{lp.name} reads a blob nobody wrote"
        produced.update(lp.top)
    depthwise = [lp for lp in pub.layer if lp.convolution_param.group > 1
                 and lp.convolution_param.group == lp.convolution_param.num_output]
    assert bool(depthwise) == name.startswith("mobilenet")


@pytest.mark.slow  # ~1.5 s: builds, saves and runs MobileNet v2 twice on the CPU
def test_published_flavour_loads_our_weights(tmp_path):
    """The two MobileNet v2 flavours hold the same params by layer name: a caffemodel saved from
    ours loads into the published net, and both give the same output on the same input (CPU)."""
    caffe.set_mode_cpu()
    nets = {}
    for flavour in ("ours", "published"):
        path = model_zoo.write_all(tmp_path / flavour, ["mobilenet_v2"], flavour)["mobilenet_v2"]
        nets[flavour] = caffe.Net(str(path), caffe.TEST)
    ours, pub = nets["ours"], nets["published"]
    assert {k: [b.shape for b in v] for k, v in ours.params.items()} == \
        {k: [b.shape for b in v] for k, v in pub.params.items()}
    _randomize(ours)
    weights = tmp_path / "mnv2.caffemodel"
    ours.save(str(weights))
    pub.copy_from(str(weights))
    for lname, blobs in ours.params.items():
        for a, b in zip(blobs, pub.params[lname]):
            np.testing.assert_array_equal(a.data, b.data, err_msg=lname)
    x = np.random.default_rng(3).standard_normal(ours.blobs["data"].shape).astype(np.float32)
    outs = []
    for net in (ours, pub):
        net.blobs["data"].data[...] = x
        outs.append(net.forward()["prob"].copy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-7)
    assert np.isfinite(outs[0]).all()
