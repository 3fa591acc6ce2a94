"""Every layer type that declares ``graph_safe`` is captured and replayed as it runs eagerly.

One small net per type (an Input layer feeding the layer, TEST phase, ``force_backward``): on the
GPU, three pycaffe forward/backward passes with CUDA graphs (warm-up, capture, replay) give the same
tops and input diffs as the same net run without graphs, the executor captured the passes and
abandoned no capture. On the CPU every case builds and runs (so the table stays valid), and the
table covers every package layer type that declares ``graph_safe``.
"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

import pycaffe_lite as caffe
from pycaffe_lite import common
from pycaffe_lite.layer import _REGISTRY, layer_type_list
from pycaffe_lite.schema import caffe_pb2

N, C, H, W = 2, 4, 6, 6
X = (N, C, H, W)
G = 'weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 }'


def _pool_mask(shape: tuple[int, ...], out_w: int) -> np.ndarray:
    """MAX-pooling switches of a 2x2 / stride 2 pooling: each window's top-left pixel, as a flat index."""
    n, c, h, w = shape
    i, j = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    return np.broadcast_to((2 * i * out_w + 2 * j).astype(np.float64), shape).copy()


# type -> (layer body after its bottoms and tops, [(shape, kind)] of its bottoms, number of tops)
# kinds: x (normal), pos (positive), label (class ids < C), prob (0..1), cont (0 at t = 0, 1 after),
# or a numpy array of the exact values
CASES: dict[str, tuple[str, list, int]] = {
    "AbsVal": ("", [(X, "x")], 1),
    "Accuracy": ("", [((N, C), "x"), ((N,), "label")], 1),
    "Axpy": ("", [((N, C, 1, 1), "x"), (X, "x"), (X, "x")], 1),
    "BN": ('bn_param { slope_filler { type: "constant" value: 1.5 } bias_filler { type: "constant" value: 0.2 } }',
           [(X, "x")], 1),
    "BNLL": ("", [(X, "x")], 1),
    "BReLU": ("brelu_param { minval: -0.5 maxval: 0.5 }", [(X, "x")], 1),
    "BatchNorm": ("batch_norm_param { use_global_stats: false }", [(X, "x")], 1),
    "BatchReindex": ("", [(X, "x"), (np.array([1.0, 0.0, 1.0]), "index")], 1),
    "Bias": ('bias_param { filler { type: "gaussian" } }', [(X, "x")], 1),
    "Clip": ("clip_param { min: -0.5 max: 0.5 }", [(X, "x")], 1),
    "Concat": ("", [(X, "x"), (X, "x")], 1),
    "ContrastiveLoss": ("", [((N, C), "x"), ((N, C), "x"), ((N,), "binary")], 1),
    "Convolution": (f"convolution_param {{ num_output: 3 kernel_size: 3 pad: 1 {G} }}", [(X, "x")], 1),
    "ConvolutionDepthwise": (f"convolution_param {{ num_output: 4 group: 4 kernel_size: 3 pad: 1 {G} }}",
                             [(X, "x")], 1),
    "Crop": ("crop_param { axis: 2 offset: 1 }", [(X, "x"), ((N, C, 4, 4), "x")], 1),
    "Deconvolution": (f"convolution_param {{ num_output: 3 kernel_size: 2 stride: 2 {G} }}", [(X, "x")], 1),
    "DepthwiseConvolution": (f"convolution_param {{ num_output: 4 group: 4 kernel_size: 3 pad: 1 {G} }}",
                             [(X, "x")], 1),
    "Dropout": ("", [(X, "x")], 1),
    "ELU": ("", [(X, "x")], 1),
    "Eltwise": ("eltwise_param { operation: PROD }", [(X, "x"), (X, "x")], 1),
    "Embed": ('embed_param { num_output: 5 input_dim: 4 weight_filler { type: "gaussian" } }',
              [((N, 3), "label")], 1),
    "EuclideanLoss": ("", [((N, C), "x"), ((N, C), "x")], 1),
    "Exp": ("", [(X, "x")], 1),
    "Flatten": ("", [(X, "x")], 1),
    "HingeLoss": ("", [((N, C), "x"), ((N,), "label")], 1),
    "Im2col": ("convolution_param { kernel_size: 3 pad: 1 }", [(X, "x")], 1),
    "InfogainLoss": ("", [((N, C), "prob"), ((N,), "label"), ((1, 1, C, C), "pos")], 1),
    "InnerProduct": (f"inner_product_param {{ num_output: 3 {G} }}", [(X, "x")], 1),
    "Interp": ("interp_param { zoom_factor: 2 }", [(X, "x")], 1),
    "LRN": ("lrn_param { local_size: 3 }", [(X, "x")], 1),
    "LSTM": ('recurrent_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } }',
             [((3, N, C), "x"), ((3, N), "cont")], 1),
    "LSTMUnit": ("", [((1, N, 5), "x"), ((1, N, 20), "x"), ((1, N), "cont")], 2),
    "Log": ("", [(X, "pos")], 1),
    "Lstm": ('lstm_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } }', [((4, N, 3), "x")], 1),
    "MVN": ("", [(X, "x")], 1),
    "MultinomialLogisticLoss": ("", [((N, C), "prob"), ((N,), "label")], 1),
    "Normalize": ("norm_param { across_spatial: false channel_shared: false }", [(X, "x")], 1),
    "PReLU": ("", [(X, "x")], 1),
    "Parameter": ('parameter_param { shape { dim: 2 dim: 3 } }', [], 1),
    "Permute": ("permute_param { order: 0 order: 2 order: 3 order: 1 }", [(X, "x")], 1),
    "Pooling": ("pooling_param { pool: MAX kernel_size: 2 stride: 2 }", [(X, "x")], 1),
    "Power": ("power_param { power: 2 scale: 0.5 shift: 1 }", [(X, "x")], 1),
    "ROIPooling": ("roi_pooling_param { pooled_h: 2 pooled_w: 2 spatial_scale: 1 }",
                   [((1, C, H, W), "x"), (np.array([[0.0, 0, 0, 3, 3], [0, 1, 1, 5, 5]]), "index")], 1),
    "RNN": ('recurrent_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } }',
            [((3, N, C), "x"), ((3, N), "cont")], 1),
    "ReLU": ("", [(X, "x")], 1),
    "ReLU6": ("", [(X, "x")], 1),
    "Reduction": ("reduction_param { operation: SUMSQ axis: 1 }", [(X, "x")], 1),
    "Reshape": ("reshape_param { shape { dim: 0 dim: -1 } }", [(X, "x")], 1),
    "Reverse": ("reverse_param { axis: 1 }", [(X, "x")], 1),
    "SPP": ("spp_param { pyramid_height: 2 pool: MAX }", [(X, "x")], 1),
    "Scale": ('scale_param { bias_term: true filler { type: "gaussian" } }', [(X, "x")], 1),
    "ShuffleChannel": ("shuffle_channel_param { group: 2 }", [(X, "x")], 1),
    "Sigmoid": ("", [(X, "x")], 1),
    "SigmoidCrossEntropyLoss": ("", [((N, C), "x"), ((N, C), "prob")], 1),
    "Silence": ("", [(X, "x")], 0),
    "Slice": ("slice_param { axis: 1 slice_point: 1 }", [(X, "x")], 2),
    "SmoothL1Loss": ("", [((N, C), "x"), ((N, C), "x")], 1),
    "Softmax": ("", [(X, "x")], 1),
    "SoftmaxWithLoss": ("", [((N, C), "x"), ((N,), "label")], 1),
    "Split": ("", [(X, "x")], 2),
    "Swish": ("", [(X, "x")], 1),
    "TanH": ("", [(X, "x")], 1),
    "Threshold": ("threshold_param { threshold: 0.1 }", [(X, "x")], 1),
    "Tile": ("tile_param { axis: 1 tiles: 2 }", [(X, "x")], 1),
    "Transpose": ("transpose_param { dim: 0 dim: 2 dim: 3 dim: 1 }", [(X, "x")], 1),
    "UnPooling": ("unpooling_param { unpool: MAX kernel_size: 2 stride: 2 unpool_h: 6 unpool_w: 6 }",
                  [((N, C, 3, 3), "x"), (_pool_mask((N, C, 3, 3), 6), "index")], 1),
    "Unpooling": ("unpooling_param { kernel_size: 2 stride: 2 unpool_size: 6 }",
                  [((N, C, 3, 3), "x"), (_pool_mask((N, C, 3, 3), 6), "index")], 1),
    "Upsample": ("upsample_param { scale: 2 }", [((N, C, 3, 3), "x"), (_pool_mask((N, C, 3, 3), 6), "index")], 1),
}


NO_BACKWARD = {"Threshold"}  # a step function: Caffe has no backward for it (forward only, no force_backward)


def _graph_safe_types() -> list[str]:
    layer_type_list()
    return sorted(t for t, cls in _REGISTRY.items()
                  if cls.__module__.startswith("pycaffe_lite.layers.") and cls.traits.graph_safe)


def _values(shape, kind: str, rng: np.random.Generator) -> np.ndarray:
    if isinstance(shape, np.ndarray):
        return shape
    if kind == "x":
        return rng.normal(size=shape)
    if kind == "pos":
        return rng.uniform(0.5, 1.5, size=shape)
    if kind == "prob":
        return rng.uniform(0.05, 0.95, size=shape)
    if kind == "label":
        return rng.integers(0, C, size=shape).astype(np.float64)
    if kind == "binary":
        return rng.integers(0, 2, size=shape).astype(np.float64)
    if kind == "cont":
        out = np.ones(shape)
        out[0] = 0
        return out
    raise ValueError(kind)


def _net(type_name: str) -> tuple[caffe.Net, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The case's net (fillers seeded), its input values and the diffs given to its tops."""
    body, inputs, ntop = CASES[type_name]
    rng = np.random.default_rng(5)
    values = {f"b{i}": _values(shape, kind, rng) for i, (shape, kind) in enumerate(inputs)}
    shapes = "".join(f" shape {{ {' '.join(f'dim: {d}' for d in v.shape)} }}" for v in values.values())
    tops = [f"t{i}" for i in range(ntop)]
    text = "" if type_name in NO_BACKWARD else "force_backward: true\n"
    if values:
        text += (f'layer {{ name: "in" type: "Input" {" ".join(f"top: {chr(34)}{n}{chr(34)}" for n in values)} '
                 f"input_param {{{shapes} }} }}\n")
    text += (f'layer {{ name: "under_test" type: "{type_name}" '
             + " ".join(f'bottom: "{n}"' for n in values) + " " + " ".join(f'top: "{t}"' for t in tops)
             + f" {body} }}\n")
    common.set_random_seed(3)
    net = caffe.Net(text_format.Parse(text, caffe_pb2.NetParameter()), caffe.TEST, dtype=np.float64)
    diffs = {t: rng.normal(size=net.blobs[t].shape) for t in tops}
    return net, values, diffs


def _run(net, values, diffs, times: int) -> tuple[dict, dict]:
    backward = any(net.layer_need_backward)
    grads: dict = {}
    for _ in range(times):
        outs = {k: np.array(v) for k, v in net.forward(**values).items()}
        if backward:
            grads = {k: np.array(v) for k, v in net.backward(**diffs).items()}
    return outs, grads


def test_the_table_covers_every_graph_safe_layer_type():
    assert sorted(set(_graph_safe_types()) - set(CASES) - {"Input"}) == []


@pytest.mark.parametrize("type_name", sorted(CASES))
def test_every_case_runs_on_the_cpu(type_name):
    net, values, diffs = _net(type_name)
    outs, grads = _run(net, values, diffs, 1)
    assert all(np.isfinite(v).all() for v in (*outs.values(), *grads.values())), type_name


@pytest.mark.gpu
@pytest.mark.parametrize("type_name", sorted(CASES))
def test_capture_and_replay_equal_eager_runs(type_name, gpu_mode):
    with caffe.using_config(cuda_graphs=False, share_diffs=False, share_data=False):
        eager, values, diffs = _net(type_name)
        want_outs, want_grads = _run(eager, values, diffs, 3)
    with caffe.using_config(share_diffs=False, share_data=False):
        graphed, values, diffs = _net(type_name)
        outs, grads = _run(graphed, values, diffs, 3)
    assert graphed.executor.captures > 0 and graphed.executor.replays > 0, type_name
    assert graphed.executor.fallbacks == [], graphed.executor.fallbacks
    for got, want in ((outs, want_outs), (grads, want_grads)):
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12, err_msg=f"{type_name}: {k}")
