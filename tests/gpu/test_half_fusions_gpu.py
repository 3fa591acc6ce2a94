"""The fused passes on half storage (fp16, bf16): a half net built in GPU mode runs BatchNorm ->
Scale -> ReLU as one chain, ReLU -> MAX pooling's backward as one, Eltwise SUM -> ReLU as one, all on
the half blobs themselves (the layers declare ``half_kernels``). The fused net agrees with the same
net unfused, over eager passes and CUDA-graph replays, and both with the float64 net on the CPU.

Bounds (eps = 2^-11 fp16, 2^-8 bf16, relative to each array's largest reference value): fused vs
unfused 8 eps (the chain rounds where the layers' own passes round, but its batch backward uses the
stored normalized values, as the float chain does); half vs float64 32 eps (BatchNorm's backward
divides by the batch's standard deviation, which amplifies the roundings of its inputs).
"""

from __future__ import annotations

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.runtime.fusion import NormChain, ReLUMaxPool, SumReLU, find_backward_fusions
from pycaffe_lite.testing.gradient_check import UNIT_ROUNDOFF
from pycaffe_lite.testing.half_check import representable
from pycaffe_lite.testing.nets import fused_and_plain

pytestmark = pytest.mark.gpu

NET = """
name: "hf"
{types}
force_backward: true
layer {{ name: "input" type: "Input" top: "data" input_param {{ shape {{ dim: 2 dim: 4 dim: 8 dim: 8 }} }} }}
layer {{ name: "bn" type: "BatchNorm" bottom: "data" top: "bn" batch_norm_param {{ use_global_stats: false }} }}
layer {{ name: "sc" type: "Scale" bottom: "bn" top: "sc"
        scale_param {{ bias_term: true filler {{ type: "uniform" min: 0.5 max: 1.5 }}
                       bias_filler {{ type: "uniform" min: -0.5 max: 0.5 }} }} }}
layer {{ name: "r1" type: "ReLU" bottom: "sc" top: "sc" }}
layer {{ name: "pool" type: "Pooling" bottom: "sc" top: "pool" pooling_param {{ pool: MAX kernel_size: 3 stride: 2 }} }}
layer {{ name: "pool2" type: "Pooling" bottom: "data" top: "pool2" pooling_param {{ pool: AVE kernel_size: 3 stride: 2 }} }}
layer {{ name: "sum" type: "Eltwise" bottom: "pool" bottom: "pool2" top: "sum"
        eltwise_param {{ coeff: 1 coeff: -0.5 }} }}
layer {{ name: "r2" type: "ReLU" bottom: "sum" top: "sum" }}
"""
TYPES = {np.dtype(np.float16): "FLOAT16", np.dtype(np.uint16): "BFLOAT16"}
HALF = [pytest.param(np.float16, id="fp16"), pytest.param(np.uint16, id="bf16")]


def _close(got: np.ndarray, want: np.ndarray, k: float, eps: float, what: str) -> None:
    bound = k * eps * max(float(np.abs(want).max(initial=0.0)), 1e-30)
    err = float(np.abs(np.asarray(got, np.float64) - want).max(initial=0.0))
    assert err <= bound, f"{what}: differs by {err:.3g} > {bound:.3g} ({k:g} eps max|ref|)"


def _blobs(net) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {name: (b.math_data().astype(np.float64), b.math_diff().astype(np.float64)) for name, b in net.blobs.items()}
    for name, params in net.params.items():
        for j, p in enumerate(params):
            out[f"{name}[{j}]"] = (p.math_data().astype(np.float64), p.math_diff().astype(np.float64))
    return out


@pytest.mark.parametrize("dtype", HALF)
def test_half_fusions_agree_with_the_layers_and_float64(tmp_path, dtype):
    dtype = np.dtype(dtype)
    eps = UNIT_ROUNDOFF[dtype]
    half_path, ref_path = tmp_path / "half.prototxt", tmp_path / "ref.prototxt"
    half_path.write_text(NET.format(types=f"default_forward_type: {TYPES[dtype]} "
                                          f"default_backward_type: {TYPES[dtype]}"))
    ref_path.write_text(NET.format(types=""))
    rng = np.random.default_rng(3)
    x = representable(rng.uniform(-1, 3, (2, 4, 8, 8)), dtype)
    g = representable(rng.uniform(-1, 1, (2, 4, 4, 4)), dtype)
    caffe.set_mode_gpu()
    try:
        fused, plain = fused_and_plain(lambda: caffe.Net(str(half_path), caffe.TRAIN), seed=5)
        names = fused._layer_names
        for name in ("bn", "sc", "r1", "pool", "sum", "r2"):
            layer = fused.layers[names.index(name)]
            assert layer.half_native and layer.dtype == dtype, f"{name} does not run on {dtype} blobs"
        kinds = {type(c) for c in fused.executor.fusions.values()}
        assert {NormChain, SumReLU} <= kinds and not plain.executor.fusions
        assert any(isinstance(c, ReLUMaxPool) for c in find_backward_fusions(fused.executor.net))
        caffe.set_mode_cpu()
        ref = caffe.Net(str(ref_path), caffe.TRAIN, dtype=np.float64)
        for name, params in ref.params.items():
            for p, h in zip(params, plain.params[name]):
                p.data[...] = h.math_data()
        caffe.set_mode_gpu()
        for it in range(3):  # eager, capture, replay
            for net in (fused, plain):
                net.clear_param_diffs()
                net.forward(data=x)
                net.backward(sum=g)
            got, want = _blobs(fused), _blobs(plain)
            for key, (data, diff) in want.items():
                _close(got[key][0], data, 8, eps, f"iteration {it}: fused {key} data")
                _close(got[key][1], diff, 8, eps, f"iteration {it}: fused {key} diff")
            if it == 0:
                caffe.set_mode_cpu()
                ref.clear_param_diffs()
                ref.forward(data=x)
                ref.backward(sum=g)
                exact = _blobs(ref)  # (read in the mode it ran in: its memory plan's buffers are host arrays)
                caffe.set_mode_gpu()
                for key, (data, diff) in exact.items():
                    _close(want[key][0], data, 32, eps, f"{key} data against float64")
                    _close(want[key][1], diff, 32, eps, f"{key} diff against float64")
        assert (fused.blobs["sc"].math_data() == 0).any() and fused.blobs["data"].math_diff().any()
    finally:
        caffe.set_mode_cpu()


def test_net_run_on_the_cpu_answers_reads_in_gpu_mode(tmp_path):
    """A float64 net built and run in CPU mode, whose memory plan shares diffs, answers reads of its
    diffs after a switch to GPU mode (the plan's copies of the backward's seeds are host arrays)
    with the values the same net read in CPU mode gives."""
    path = tmp_path / "ref.prototxt"
    path.write_text(NET.format(types=""))
    rng = np.random.default_rng(3)
    x, g = rng.uniform(-1, 3, (2, 4, 8, 8)), rng.uniform(-1, 1, (2, 4, 4, 4))
    nets = []
    for _ in range(2):
        caffe.set_mode_cpu()
        caffe.set_random_seed(5)
        net = caffe.Net(str(path), caffe.TRAIN, dtype=np.float64)
        net.forward(data=x)
        net.backward(sum=g)
        nets.append(net)
    on_cpu = {name: b.diff.copy() for name, b in nets[0].blobs.items()}
    caffe.set_mode_gpu()
    try:
        on_gpu = {name: b.diff.copy() for name, b in nets[1].blobs.items()}
    finally:
        caffe.set_mode_cpu()
    for name, want in on_cpu.items():
        np.testing.assert_allclose(on_gpu[name], want, rtol=1e-12, atol=1e-12, err_msg=name)
