"""Layers whose GPU kernels run on half storage (``Traits.half_kernels``): the declarations (CPU), and
each layer on the GPU in fp16 and bf16 against float64 on the CPU (``testing.half_check``).

k (the bound is k · eps · max|reference|, eps = 2^-11 fp16, 2^-8 bf16) per case: 1 where each result
is one rounding of an exact or float-accurate value (ReLU, max pooling, copies), 2 where float math
on rounded inputs adds a little (sigmoid, averages, scale, sums of two gradients), 4-8 where a
result goes through several stored roundings (Power's backward reads its rounded top, Swish its
rounded sigmoid, BatchNorm's backward its rounded normalized values, PReLU's slope gradient sums
half products; overlapping max-pooling windows add two gradients).

The same cases run on the host through the float32 view path (half storage, float32 math, results
rounded as the kernels round them; check_half_gpu with its native-layer check removed and GPU mode
mapped to CPU) reached at most 0.91 of their bound (Sigmoid's bottom diff, at k = 2 then; now 3),
0.75 for max pooling's bottom diff in bf16 (at k = 1 then; now 2), at most 0.57 for the others.
The layers' own kernels on half storage built for the host (test_half_kernels_on_host.py) reach at
most 0.60 of the bounds (Sigmoid's bottom diff in fp16).
"""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite import common
from pycaffe_lite.layer import layer_class
from pycaffe_lite.runtime import fusion

SHAPE = (2, 3, 5, 6)
HALF = [pytest.param(np.float16, id="fp16"), pytest.param(np.uint16, id="bf16")]

DECLARED = ["ReLU", "Sigmoid", "TanH", "AbsVal", "BNLL", "ELU", "Exp", "Log", "Power", "PReLU", "Threshold",
            "Clip", "ReLU6", "Swish", "Dropout", "Pooling", "BatchNorm", "Scale", "Bias", "Eltwise", "Concat",
            "Split", "Flatten", "Reshape", "Softmax"]
NOT_DECLARED = ["SoftmaxWithLoss", "EuclideanLoss", "Accuracy", "Data", "Input", "DummyData", "LRN"]


def _x(low=-2.0, high=2.0, seed=0, shape=SHAPE):
    return np.random.default_rng(seed).uniform(low, high, shape)


# (id, layer text, bottoms, k, ntop, propagate, params)
CASES = [
    ("relu", "type: 'ReLU'", [_x()], 1, 1, None, None),
    ("leaky_relu", "type: 'ReLU' relu_param { negative_slope: 0.1 }", [_x()], 1, 1, None, None),
    ("sigmoid", "type: 'Sigmoid'", [_x(-6, 6)], 3, 1, None, None),
    ("tanh", "type: 'TanH'", [_x(-3, 3)], 2, 1, None, None),
    ("absval", "type: 'AbsVal'", [_x()], 1, 1, None, None),
    ("bnll", "type: 'BNLL'", [_x(-4, 4)], 2, 1, None, None),
    ("elu", "type: 'ELU' elu_param { alpha: 0.5 }", [_x()], 2, 1, None, None),
    ("exp", "type: 'Exp' exp_param { base: 2 scale: 0.5 shift: 1 }", [_x()], 2, 1, None, None),
    ("log", "type: 'Log' log_param { base: 10 scale: 2 shift: 0.5 }", [_x(0.1, 3)], 2, 1, None, None),
    ("power", "type: 'Power' power_param { power: 2 scale: 0.5 shift: 1.5 }", [_x()], 4, 1, None, None),
    ("prelu", "type: 'PReLU'", [_x()], 8, 1, None, [_x(0.1, 0.6, 5, (3,))]),
    ("threshold", "type: 'Threshold' threshold_param { threshold: 0.3 }", [_x()], 1, 1, [False], None),
    ("clip", "type: 'Clip' clip_param { min: -0.5 max: 0.7 }", [_x()], 1, 1, None, None),
    ("relu6", "type: 'ReLU6'", [_x(-8, 8)], 1, 1, None, None),
    ("swish", "type: 'Swish' swish_param { beta: 1.5 }", [_x(-3, 3)], 4, 1, None, None),
    ("dropout_test", "type: 'Dropout' phase: TEST", [_x()], 1, 1, None, None),
    ("max_pool", "type: 'Pooling' pooling_param { pool: MAX kernel_size: 3 stride: 2 }", [_x()], 2, 1, None, None),
    ("ave_pool", "type: 'Pooling' pooling_param { pool: AVE kernel_size: 2 stride: 2 pad: 1 }", [_x()], 2, 1,
     None, None),
    ("global_ave_pool", "type: 'Pooling' pooling_param { pool: AVE global_pooling: true }", [_x()], 2, 1, None,
     None),
    ("batch_norm_train", "type: 'BatchNorm' batch_norm_param { use_global_stats: false }", [_x(-1, 3)], 8, 1,
     None, None),
    ("batch_norm_global", "type: 'BatchNorm' batch_norm_param { use_global_stats: true }", [_x(-1, 3)], 2, 1,
     None, [_x(-1, 1, 6, (3,)), _x(0.5, 2, 7, (3,)), np.array([0.9])]),
    ("scale", "type: 'Scale' scale_param { bias_term: true }", [_x()], 2, 1, None,
     [_x(0.5, 1.5, 3, (3,)), _x(-1, 1, 4, (3,))]),
    ("bias", "type: 'Bias'", [_x()], 2, 1, None, [_x(-1, 1, 4, (3,))]),
    ("eltwise_sum", "type: 'Eltwise' eltwise_param { operation: SUM coeff: 1 coeff: -0.5 }", [_x(), _x(seed=1)],
     2, 1, None, None),
    ("eltwise_prod", "type: 'Eltwise' eltwise_param { operation: PROD }", [_x(0.5, 2), _x(0.5, 2, seed=1)], 4, 1,
     None, None),
    ("eltwise_max", "type: 'Eltwise' eltwise_param { operation: MAX }", [_x(), _x(seed=1)], 1, 1, None, None),
    ("concat", "type: 'Concat'", [_x(), _x(seed=1)], 1, 1, None, None),
    ("split", "type: 'Split'", [_x()], 2, 2, None, None),
    ("flatten", "type: 'Flatten'", [_x()], 1, 1, None, None),
    ("reshape", "type: 'Reshape' reshape_param { shape { dim: 0 dim: -1 } }", [_x()], 1, 1, None, None),
    ("softmax", "type: 'Softmax'", [_x(-3, 3)], 4, 1, None, None),
]


@pytest.mark.parametrize("name", DECLARED)
def test_hot_layers_declare_half_kernels(name):
    traits = layer_class(name).traits
    assert traits.half and traits.half_kernels, f"{name}: {traits}"


@pytest.mark.parametrize("name", NOT_DECLARED)
def test_losses_metrics_and_data_layers_stay_float32(name):
    assert not layer_class(name).traits.half_kernels


def test_every_declared_layer_has_a_gpu_case():
    covered = {text.split("'")[1] for _, text, *_ in CASES}
    assert set(DECLARED) <= covered


def test_fusions_refuse_layers_of_different_dtypes():
    class _L:
        def __init__(self, dtype):
            self.dtype = np.dtype(dtype)

    assert fusion._one_dtype([_L(np.float16), _L(np.float16)])
    assert not fusion._one_dtype([_L(np.float16), _L(np.float32)])
    assert not fusion._one_dtype([_L(np.float16), _L(np.uint16)])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(("text", "bottoms", "k", "ntop", "propagate", "params"),
                         [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_layer_kernels_in_half_match_float64(text, bottoms, k, ntop, propagate, params, dtype):
    from pycaffe_lite.testing.half_check import check_half_gpu

    try:
        ratios = check_half_gpu(text, bottoms, dtype, k, ntop=ntop, propagate=propagate, params=params)
    finally:
        common.set_mode_cpu()
    assert ratios and max(ratios.values()) <= 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
def test_max_pooling_mask_top_is_refused_in_half(dtype):
    from pycaffe_lite.testing.half_check import HalfCheckError, check_half_gpu

    try:
        with pytest.raises(Exception, match="mask top holds window positions") as info:
            check_half_gpu("type: 'Pooling' pooling_param { pool: MAX kernel_size: 2 stride: 2 }", [_x()], dtype,
                           1, ntop=2)
        assert not isinstance(info.value, HalfCheckError)
    finally:
        common.set_mode_cpu()


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("text", ["type: 'BatchNorm'", "type: 'Scale' scale_param { bias_term: true }", "type: 'ReLU'"])
def test_half_native_layer_runs_on_its_blobs_without_a_view(monkeypatch, text, dtype):
    """Created as a half net built in GPU mode creates it (set up on the host: no GPU needed): dtype is the
    storage type, params are stored in it (BatchNorm's running statistics in float32, with its
    per-channel buffers), and no float view is made, at setup or at a later pass."""
    from pycaffe_lite.blob import Blob
    from pycaffe_lite.layer import create_layer
    from pycaffe_lite.precision import layer_precision, type_of_dtype
    from pycaffe_lite.schema import caffe_pb2
    from pycaffe_lite.testing.layer_testing import make_layer

    net = caffe_pb2.NetParameter()
    net.default_forward_type = net.default_backward_type = type_of_dtype(dtype)
    param = make_layer(text, np.float32).layer_param
    with monkeypatch.context() as patch:  # created as in a net built in GPU mode
        patch.setattr(common, "mode", lambda: common.Mode.GPU)
        layer = create_layer(param, np.float32, layer_precision(net, param))
    assert layer.half_native and layer.dtype == np.dtype(dtype)
    bottom, top = [Blob(SHAPE, dtype)], [Blob((), layer.top_dtype, layer.top_diff_dtype)]
    layer.setup(bottom, top)
    assert top[0].dtype == np.dtype(dtype) and top[0].shape == SHAPE
    want = np.float32 if "BatchNorm" in text else dtype
    assert all(p.dtype == np.dtype(want) and p.diff_dtype == np.dtype(want) for p in layer.blobs)
    if "BatchNorm" in text:
        assert {b.dtype for b in (layer._mean, layer._var, layer._inv_std, layer._coef)} == {np.dtype(np.float32)}
    assert layer.math_view(bottom, top) is None and layer._float_view is None
