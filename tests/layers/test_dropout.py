"""Dropout: TRAIN masks (rate, scaling, repeatability under a seed), TEST identity, backward with
the forward's mask, in place, gradients; GPU: device-drawn masks (statistics, seed repeatability,
independence, bit-exact Philox draws, fresh masks on CUDA graph replays), TEST identity."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import common
from pycaffe_lite.errors import NetError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer

DROPOUT_CU = Path(__file__).resolve().parents[2] / "layers" / "dropout.cu"
M32 = np.uint64(0xFFFFFFFF)


def philox_first_word(c0, c1, c2, c3, k0, k1) -> np.ndarray:
    """Independent numpy Philox-4x32-10 (Random123's constants): the first output word, element-wise."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & M32 for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & M32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & M32
    return c0


def expected_mask(layer, count: int, offset: int) -> np.ndarray:
    """The keep mask the device draws for forward number ``offset`` since the layer was (re)seeded."""
    _, seed, stream = layer.generator
    return philox_first_word(np.arange(count), offset, 0, 0, seed, stream) > layer.uint_thres


def forward(text, x, dtype=np.float64, seed=None):
    layer = make_layer(f"type: 'Dropout' {text}", dtype)
    bottom, top = blobs([x], dtype), empty_blobs(1, dtype)
    layer.setup(bottom, top)
    if seed is not None:
        common.set_random_seed(seed)
    layer.forward(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("ratio", [0.5, 0.2, 0.8])
def test_train_rate_and_scale(mode, ratio):
    x = np.random.default_rng(0).uniform(1, 2, (200, 500))  # nonzero everywhere
    _, _, top = forward(f"dropout_param {{ dropout_ratio: {ratio} }}", x, seed=1)
    y = top[0].data
    kept = y != 0
    ratio32 = float(np.float32(ratio))  # dropout_ratio is a float field
    assert abs(1 - kept.mean() - ratio32) < 0.01
    np.testing.assert_allclose(y[kept], x[kept] / (1 - ratio32), rtol=1e-6)
    assert abs(y.mean() / x.mean() - 1) < 0.03  # unbiased in expectation


def test_same_seed_same_mask_new_draw_otherwise(mode):
    x = np.ones((50, 40))
    layer, bottom, top = forward("", x, seed=7)
    first = top[0].data.copy()
    layer.forward(bottom, top)
    assert not np.array_equal(first, top[0].data)  # a new mask each forward
    common.set_random_seed(7)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(first, top[0].data)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_test_phase_is_identity(mode, dtype):
    x = np.random.default_rng(1).standard_normal((3, 4, 5))
    layer, bottom, top = forward("phase: TEST dropout_param { dropout_ratio: 0.7 }", x, dtype)
    np.testing.assert_array_equal(top[0].data, x.astype(dtype))
    top[0].diff[...] = 2 * x
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, (2 * x).astype(dtype))


def test_backward_uses_forward_mask(mode):
    rng = np.random.default_rng(2)
    x, dy = rng.uniform(1, 2, (6, 7)), rng.standard_normal((6, 7))
    layer, bottom, top = forward("dropout_param { dropout_ratio: 0.4 }", x, seed=3)
    kept = top[0].data != 0
    assert 0 < kept.sum() < kept.size
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    scale = 1 / (1 - float(np.float32(0.4)))
    np.testing.assert_allclose(bottom[0].diff, np.where(kept, dy * scale, 0), rtol=1e-12)


def test_in_place(mode):
    x = np.random.default_rng(3).uniform(1, 2, (8, 9))
    layer, (b,) = make_layer("type: 'Dropout'"), blobs([x])
    layer.setup([b], [b])
    common.set_random_seed(5)
    layer.forward([b], [b])
    kept = b.data != 0
    np.testing.assert_allclose(b.data[kept], 2 * x[kept])
    b.diff[...] = 1.0
    layer.backward([b], [True], [b])
    np.testing.assert_allclose(b.diff, np.where(kept, 2.0, 0.0))


def test_scale_train_false_scales_at_test_instead():
    """The non-BVLC ``scale_train: false`` behaviour (set on the layer: BVLC's proto lacks the field)."""
    x = np.random.default_rng(4).uniform(1, 2, (20, 30))
    for phase, check in (("TRAIN", "train"), ("TEST", "test")):
        layer = make_layer(f"type: 'Dropout' phase: {phase} dropout_param {{ dropout_ratio: 0.25 }}")
        bottom, top = blobs([x]), empty_blobs(1)
        layer.setup(bottom, top)
        layer.scale_train = False
        layer.forward(bottom, top)
        y = top[0].data
        if check == "train":
            np.testing.assert_array_equal(y[y != 0], x[y != 0])
        else:
            np.testing.assert_allclose(y, x * 0.75)


def test_mask_blob_is_kept_for_backward(mode):
    x = np.random.default_rng(8).uniform(1, 2, (5, 6))
    layer, _, top = forward("dropout_param { dropout_ratio: 0.3 }", x, seed=9)
    mask = layer.mask.cpu_data()
    assert set(np.unique(mask)) == {0.0, 1.0}
    np.testing.assert_array_equal(mask != 0, top[0].data != 0)


def test_backward_before_forward_is_an_error():
    layer = make_layer("type: 'Dropout'")
    bottom, top = blobs([np.ones(4)]), empty_blobs(1)
    layer.setup(bottom, top)
    with pytest.raises(NetError, match="needs a forward pass first"):
        layer.backward(top, [True], bottom)


def test_philox_reference_known_answers():
    """Random123's known-answer vectors (first word) for philox4x32 with 10 rounds."""
    words = [philox_first_word(0, 0, 0, 0, 0, 0),
             philox_first_word(*[0xFFFFFFFF] * 4, 0xFFFFFFFF, 0xFFFFFFFF),
             philox_first_word(0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0)]
    assert [int(w) for w in words] == [0x6627E8D5, 0x408F276D, 0xD16CFE09]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.slow
def test_device_generator_matches_reference(tmp_path):
    """dropout.cu's generator (host-callable) built by nvcc and run on the host gives the reference draws."""
    rng = np.random.default_rng(0)
    cases = rng.integers(0, 2**32, (6, 6), dtype=np.uint64)
    calls = "".join(f'  printf("%u\\n", philox4x32_10({", ".join(f"{int(v)}U" for v in row)}));\n' for row in cases)
    src = tmp_path / "philox.cu"
    src.write_text(f'typedef float Dtype;\ntypedef float Mtype;\n'
                   f'static __device__ Mtype to_m(const Dtype x) {{ return x; }}\n'
                   f'static __device__ Dtype from_m(const Mtype x) {{ return x; }}\n'
                   f'#define CUDA_KERNEL_LOOP(i, n) for (int i = 0; i < (n); ++i)\n'
                   f'#include <cstdio>\nextern "C" {{\n#include "{DROPOUT_CU}"\n}}\nint main() {{\n{calls}}}\n')
    subprocess.run(["nvcc", "-arch=sm_90", "-o", str(tmp_path / "philox"), str(src)], check=True,
                   capture_output=True)
    out = subprocess.run([str(tmp_path / "philox")], check=True, capture_output=True, text=True).stdout
    assert [int(v) for v in out.split()] == [int(philox_first_word(*row)) for row in cases]


@pytest.mark.parametrize("ratio", [1.0, -0.1])
def test_bad_ratio_is_clear(ratio):
    with pytest.raises(NetError, match="dropout_ratio"):
        forward(f"dropout_param {{ dropout_ratio: {ratio} }}", np.ones(3))


def test_gradient(mode):
    x = np.random.default_rng(5).standard_normal((3, 4, 2))
    layer = make_layer("type: 'Dropout' dropout_param { dropout_ratio: 0.3 }")
    GradientChecker(1e-3, 1e-4).check(layer, blobs([x]), empty_blobs(1))


# -- GPU: masks come from the device generator, so compare statistics, not bits ----------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ratio", [0.5, 0.1, 0.9])
def test_gpu_mask_statistics(gpu_mode, dtype, ratio):
    x = np.ones((1000, 1000))
    layer, bottom, top = forward(f"dropout_param {{ dropout_ratio: {ratio} }}", x, dtype, seed=11)
    y = top[0].data.astype(np.float64)
    kept = y != 0
    ratio32 = float(np.float32(ratio))
    assert abs(1 - kept.mean() - ratio32) < 0.003
    np.testing.assert_allclose(y[kept], 1 / (1 - ratio32), rtol=1e-6)
    # neighbours and rows are independent: joint drop rates match the product of the marginals
    flat = ~kept.ravel()
    assert abs((flat[1:] & flat[:-1]).mean() - ratio32**2) < 0.004
    assert abs((~kept[1:] & ~kept[:-1]).mean() - ratio32**2) < 0.004
    # and every block of the array sees the same rate (no stuck lanes)
    blocks = (~kept).reshape(100, -1).mean(axis=1)
    assert np.all(np.abs(blocks - ratio32) < 0.03)


@pytest.mark.gpu
def test_gpu_seed_repeatability_and_fresh_draws(gpu_mode):
    x = np.ones((64, 33))
    layer, bottom, top = forward("", x, seed=21)
    first = top[0].data.copy()
    layer.forward(bottom, top)
    second = top[0].data.copy()
    assert not np.array_equal(first, second)
    common.set_random_seed(21)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, first)
    common.set_random_seed(22)
    layer.forward(bottom, top)
    assert not np.array_equal(top[0].data, first)
    # a second layer seeded the same way draws the same mask (the seed, not the layer, decides)
    _, _, top2 = forward("", x, seed=21)
    np.testing.assert_array_equal(top2[0].data, first)


@pytest.mark.gpu
def test_gpu_backward_matches_forward_mask(gpu_mode):
    rng = np.random.default_rng(6)
    x, dy = rng.uniform(1, 2, (30, 40)), rng.standard_normal((30, 40))
    layer, bottom, top = forward("dropout_param { dropout_ratio: 0.35 }", x, seed=4)
    kept = top[0].data != 0
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    scale = 1 / (1 - float(np.float32(0.35)))
    np.testing.assert_allclose(bottom[0].diff, np.where(kept, dy * scale, 0), rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_gpu_agree_at_test(dtype):
    x = np.random.default_rng(7).standard_normal((4, 6))
    assert_cpu_gpu_agree("type: 'Dropout' phase: TEST", [x], dtype=dtype, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_masks_are_the_philox_draws(gpu_mode, dtype):
    x = np.random.default_rng(9).uniform(1, 2, (37, 29))
    layer, bottom, top = forward("dropout_param { dropout_ratio: 0.4 }", x, dtype, seed=13)
    assert layer.generator[1:] == (13, 1)  # the first next_gpu_seed() after set_random_seed
    for offset in range(3):
        if offset:
            layer.forward(bottom, top)
        keep = expected_mask(layer, x.size, offset).reshape(x.shape)
        np.testing.assert_array_equal(layer.mask.cpu_data(), keep.astype(dtype))
        np.testing.assert_allclose(top[0].data, np.where(keep, x / (1 - float(np.float32(0.4))), 0), rtol=1e-6)


@pytest.mark.gpu
def test_gpu_graph_replays_draw_fresh_masks(gpu_mode):
    """A net's Dropout range is captured as a CUDA graph; each replay advances the device counter."""
    from pycaffe_lite.proto.protoio import parse_text
    from pycaffe_lite.schema import caffe_pb2

    text = """layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 30 dim: 40 } } }
    layer { name: "drop" type: "Dropout" bottom: "data" top: "drop" dropout_param { dropout_ratio: 0.5 } }"""
    net = caffe.Net(parse_text(text, caffe_pb2.NetParameter(), "<net>"), caffe.TRAIN, dtype=np.float64)
    net.blobs["data"].data[...] = 1.0
    layer = net.layer_dict["drop"]
    common.set_random_seed(17)
    masks = []
    for _ in range(5):
        net.forward()
        masks.append(net.blobs["drop"].data != 0)
    assert net.executor.replays >= 2
    for offset, mask in enumerate(masks):
        np.testing.assert_array_equal(mask.ravel(), expected_mask(layer, mask.size, offset))
    common.set_random_seed(17)  # re-keys the graph: the next forward draws the first mask again
    net.forward()
    np.testing.assert_array_equal(net.blobs["drop"].data != 0, masks[0])


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_phase_comes_from_the_net(mode, phase):
    from pycaffe_lite.proto.protoio import parse_text
    from pycaffe_lite.schema import caffe_pb2

    text = """layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 40 dim: 50 } } }
    layer { name: "drop" type: "Dropout" bottom: "data" top: "data" dropout_param { dropout_ratio: 0.5 } }"""
    net = caffe.Net(parse_text(text, caffe_pb2.NetParameter(), "<net>"), getattr(caffe, phase), dtype=np.float64)
    net.blobs["data"].data[...] = 1.0
    common.set_random_seed(3)
    net.forward()
    y = net.blobs["data"].data
    if phase == "TEST":
        assert np.all(y == 1.0)
    else:
        assert set(np.unique(y)) == {0.0, 2.0}
        assert 0.4 < (y == 0).mean() < 0.6


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_scale_train_false_from_the_prototxt(mode, phase):
    """caffe-fast-rcnn's DropoutParameter.scale_train (field 2), as py-faster-rcnn's ZF nets write it."""
    x = np.random.default_rng(5).uniform(1, 2, (20, 30))
    layer = make_layer(f"type: 'Dropout' phase: {phase} dropout_param {{ dropout_ratio: 0.25 scale_train: false }}")
    bottom, top = blobs([x]), empty_blobs(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    y = top[0].cpu_data()
    if phase == "TRAIN":
        assert 0 < (y == 0).sum() < y.size
        np.testing.assert_array_equal(y[y != 0], x[y != 0])
    else:
        np.testing.assert_allclose(y, x * 0.75, rtol=1e-15)
