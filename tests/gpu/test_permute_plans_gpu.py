"""pycaffe_lite.gpu.permute on the device: every plan kind against numpy, exactly, forward and through
the inverse plan (the gradient), both dtypes; unaligned pointers; capture in a CUDA graph; the
layers that use it (Permute, Transpose, ShuffleChannel) against their CPU path."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.gpu import backend, cuda_graph, permute
from pycaffe_lite.testing.layer_testing import assert_cpu_gpu_agree

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_mode")]


class Dev:
    """A host array on the device at ``shift`` elements past a 256-byte aligned allocation."""

    def __init__(self, a: np.ndarray, shift: int = 0) -> None:
        self.a = np.ascontiguousarray(a)
        self.mem = backend.alloc(self.a.nbytes + 256)
        self.ptr = int(self.mem) + shift * self.a.itemsize
        backend.memcpy_htod(self.ptr, self.a)

    def get(self) -> np.ndarray:
        out = np.empty_like(self.a)
        backend.memcpy_dtoh(out, self.ptr)
        return out


CASES = [
    ((5, 7), (1, 0)),
    ((33, 65), (1, 0)),
    ((1000, 3), (1, 0)),
    ((3, 100, 37), (0, 2, 1)),
    ((32, 16, 38, 38), (0, 2, 3, 1)),      # SSD300 conv4_3 mbox_loc: permute_quads
    ((32, 24, 19, 19), (0, 2, 3, 1)),      # fc7 mbox_loc: narrow (361 positions)
    ((3, 8, 36), (0, 2, 1)),               # permute_quads, 8-wide sides
    ((12, 40), (1, 0)),                    # permute_quads, 2 axes
    ((32, 84, 38, 38), (0, 2, 3, 1)),      # conv4_3 mbox_conf
    ((32, 126, 19, 19), (0, 2, 3, 1)),     # fc7 mbox_conf
    ((8, 512, 38, 64), (3, 0, 2, 1)),      # CTPN's Transpose
    ((7, 5, 3, 11), (2, 0, 3, 1)),
    ((2, 3, 4, 5, 6), (4, 2, 0, 3, 1)),    # 5 axes
    ((2, 3, 4, 5, 6), (0, 1, 4, 2, 3)),
    ((1, 7, 1, 9), (3, 1, 2, 0)),          # size-1 axes
    ((4, 1, 1), (2, 1, 0)),                # a copy
    ((3, 4, 5), (0, 1, 2)),                # identity
    ((32, 3, 80, 784), (0, 2, 1, 3)),      # ShuffleChannel g3, 32x240x28x28
    ((2, 3, 4, 7), (2, 0, 1, 3)),          # runs of 7
    ((400, 3, 5), (0, 2, 1)),              # small planes: gathered
    ((40, 2, 3, 2, 2, 2, 2, 40), (7, 6, 5, 4, 3, 2, 1, 0)),  # 8 axes: host loop (tiles)
    ((2, 2, 2, 2, 2, 2, 2, 4), (6, 5, 4, 3, 2, 1, 0, 7)),    # 8 axes: host loop (runs)
]


def _check(shape, order, dtype, shift=0):
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(dtype)
    plan = permute.plan(shape, order)
    src, dst = Dev(x, shift), Dev(np.full(plan.top_shape, np.nan, dtype), shift)
    back = Dev(np.full(shape, np.nan, dtype), shift)
    plan(src.ptr, dst.ptr, dtype)
    plan.inverse()(dst.ptr, back.ptr, dtype)
    np.testing.assert_array_equal(dst.get(), x.transpose(order), err_msg=f"{shape} {order} {plan.kind}")
    np.testing.assert_array_equal(back.get(), x, err_msg=f"inverse of {shape} {order}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,order", CASES)
def test_matches_numpy(shape, order, dtype):
    _check(shape, order, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,order", [((2, 3, 4, 24), (0, 2, 1, 3)), ((33, 65), (1, 0)),
                                         ((2, 16, 6, 8), (0, 2, 3, 1))])
@pytest.mark.parametrize("shift", [0, 1, 3])
def test_any_alignment(shape, order, dtype, shift):
    _check(shape, order, dtype, shift)


def test_replays_in_a_cuda_graph():
    shape, order = (4, 84, 19, 19), (0, 2, 3, 1)
    plan = permute.plan(shape, order)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    src, dst = Dev(x), Dev(np.zeros(plan.top_shape, np.float32))
    back = Dev(np.zeros(shape, np.float32))
    plan(src.ptr, dst.ptr, np.float32)  # compile outside the capture
    plan.inverse()(dst.ptr, back.ptr, np.float32)
    recording = cuda_graph.Recording()
    with cuda_graph.capture(recording):
        plan(src.ptr, dst.ptr, np.float32)
        plan.inverse()(dst.ptr, back.ptr, np.float32)
    x2 = x * 2 + 1
    backend.memcpy_htod(src.ptr, x2)
    recording.graph.launch()
    backend.synchronize()
    np.testing.assert_array_equal(dst.get(), x2.transpose(order))
    np.testing.assert_array_equal(back.get(), x2)


X = np.random.default_rng(5).standard_normal((3, 12, 7, 9))


@pytest.mark.parametrize("text", [
    'type: "Permute" permute_param { order: 0 order: 2 order: 3 order: 1 }',
    'type: "Permute" permute_param { order: 3 order: 1 }',
    'type: "Permute" permute_param { order: 1 order: 0 }',
    'type: "Transpose" transpose_param { dim: 3 dim: 0 dim: 2 dim: 1 }',
    'type: "Transpose" transpose_param { dim: 2 dim: 3 dim: 1 dim: 0 }',
    'type: "ShuffleChannel" shuffle_channel_param { group: 3 }',
    'type: "ShuffleChannel" shuffle_channel_param { group: 4 }',
    'type: "ShuffleChannel" shuffle_channel_param { group: 12 }',
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layers_agree_with_cpu(text, dtype):
    assert_cpu_gpu_agree(text, [X], dtype=dtype, rtol=0, atol=0)
    assert_cpu_gpu_agree(text, [X[:, :, :4, :4]], dtype=dtype, rtol=0, atol=0)  # 4-wide planes
