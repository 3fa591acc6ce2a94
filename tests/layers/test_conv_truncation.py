"""BVLC's convolution output size with C++'s truncating division: a window that overhangs the
padded input by less than a stride still gives an output, reading zeros where the input is missing
(kernel 2 / stride 2 on a 1x1 input gives one output). 2-D and N-D paths, forward and gradients, CPU
and GPU (every engine that the autotune may pick reads outside the image as zero)."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.errors import CaffeError
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree, blobs, empty_blobs, make_layer, run_layer


def conv(body: str, kind: str = "Convolution") -> str:
    return (f'type: "{kind}" convolution_param {{ {body} weight_filler {{ type: "gaussian" std: 0.5 }} '
            'bias_filler { type: "gaussian" std: 0.5 } }')


def test_kernel_2_stride_2_on_one_pixel_reads_zeros(mode):
    x = np.random.default_rng(0).standard_normal((3, 4, 1, 1))
    layer, bottom, top = run_layer(conv("num_output: 5 kernel_size: 2 stride: 2"), [x])
    assert top[0].shape == (3, 5, 1, 1)
    w, b = layer.blobs[0].cpu_data(), layer.blobs[1].cpu_data()
    np.testing.assert_allclose(top[0].cpu_data()[:, :, 0, 0], x[:, :, 0, 0] @ w[:, :, 0, 0].T + b, rtol=1e-12)
    dy = top[0].cpu_diff()[:, :, 0, 0]
    np.testing.assert_allclose(bottom[0].cpu_diff()[:, :, 0, 0], dy @ w[:, :, 0, 0], rtol=1e-12)
    dw = layer.blobs[0].cpu_diff()
    np.testing.assert_allclose(dw[:, :, 0, 0], 0.25 + dy.T @ x[:, :, 0, 0], rtol=1e-12)
    np.testing.assert_array_equal(dw[:, :, 1, :], 0.25)  # the missing pixels are zeros: no gradient
    np.testing.assert_array_equal(dw[:, :, :, 1], 0.25)


@pytest.mark.parametrize("shape,body", [
    ((2, 3, 2, 5), "num_output: 4 kernel_size: 3 stride: 2 pad_h: 0 pad_w: 1"),  # H: (2-3)/2+1 = 1
    ((2, 2, 1, 3), "num_output: 2 kernel_h: 2 kernel_w: 3 stride: 3 group: 2"),
    ((1, 2, 1, 1, 3), "num_output: 3 kernel_size: 2 stride: 2"),             # 3-D: (1-2)/2+1, (3-2)/2+1
    ((2, 2, 1, 1), "num_output: 2 kernel_size: 2 stride: 2 force_nd_im2col: true"),
])
def test_overhanging_windows_gradient(mode, shape, body):
    rng = np.random.default_rng(1)
    layer = make_layer(conv(body))
    bottom, top = blobs([rng.standard_normal(shape)]), empty_blobs(1)
    checked = GradientChecker(stepsize=1e-3, threshold=1e-4).check(layer, bottom, top)
    assert checked == bottom[0].count + sum(b.count for b in layer.blobs)
    assert min(top[0].shape[2:]) == 1


def test_no_window_at_all_is_still_an_error():
    layer = make_layer(conv("num_output: 2 kernel_size: 3 stride: 2"))
    with pytest.raises(CaffeError, match="larger than the input"):  # (1 - 3) / 2 + 1 = 0 outputs
        layer.setup(blobs([np.zeros((1, 1, 1, 1))]), empty_blobs(1))


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["DEFAULT", "GEMM", "IMPLICIT_GEMM", "DIRECT", "TENSOR_CORE", "DEPTHWISE",
                                    "WINOGRAD"])
@pytest.mark.parametrize("shape,body", [
    ((3, 4, 1, 1), "num_output: 4 kernel_size: 2 stride: 2"),
    ((2, 4, 2, 3), "num_output: 4 kernel_size: 3 stride: 2"),
    ((2, 4, 2, 2), "num_output: 4 kernel_size: 3 stride: 2 pad: 0 group: 4"),
])
def test_gpu_engines_agree_with_cpu_on_overhanging_windows(engine, shape, body):
    """Each engine either runs the overhanging geometry (zeros outside) or declines it (the layer then
    names the engine's requirement); DEFAULT always runs."""
    x = np.random.default_rng(2).standard_normal(shape)
    text = conv(f"{body} engine: {engine}")
    try:
        assert_cpu_gpu_agree(text, [x], dtype=np.float32, rtol=2e-4, atol=2e-5)
    except CaffeError as exc:
        assert engine != "DEFAULT" and "needs" in str(exc), exc


@pytest.mark.gpu
def test_gpu_nd_path_agrees_with_cpu():
    rng = np.random.default_rng(3)
    assert_cpu_gpu_agree(conv("num_output: 3 kernel_size: 2 stride: 2"), [rng.standard_normal((2, 2, 1, 1, 3))])
    assert_cpu_gpu_agree(conv("num_output: 3 kernel_size: 2 stride: 2 force_nd_im2col: true"),
                         [rng.standard_normal((2, 2, 1, 1))])


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_pooling_keeps_bvlc_ceil_and_clipping(mode, pool):
    """Pooling is BVLC's own rule (ceil, then a window starting in the high pad is dropped), with
    windows clipped to the image; AVE divides by the window counted up to the padded edge."""
    x = np.arange(6.0).reshape(1, 6, 1, 1)
    _, _, top = run_layer(f'type: "Pooling" pooling_param {{ pool: {pool} kernel_size: 2 stride: 2 }}', [x])
    np.testing.assert_array_equal(top[0].cpu_data(), x)  # ceil((1 - 2) / 2) + 1 = 1; the window holds one pixel
    _, _, top = run_layer(f'type: "Pooling" pooling_param {{ pool: {pool} kernel_size: 3 stride: 2 pad: 1 }}',
                          [np.ones((1, 1, 2, 2))])
    want = np.ones((2, 2)) if pool == "MAX" else np.array([[4 / 9, 2 / 6], [2 / 6, 1 / 4]])
    np.testing.assert_allclose(top[0].cpu_data()[0, 0], want, rtol=1e-12)
    _, _, top = run_layer(f'type: "Pooling" pooling_param {{ pool: {pool} kernel_size: 2 stride: 2 pad: 1 }}',
                          [np.ones((1, 1, 3, 3))])
    assert top[0].shape == (1, 1, 2, 2)  # ceil((3 + 2 - 2) / 2) + 1 = 3, and (3 - 1) * 2 >= 3 + 1 drops one
