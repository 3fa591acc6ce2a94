"""The precision rule (pycaffe_lite/precision.py): each layer's storage and math types from the
net's defaults and its own fields, NVCaffe's way; data layers and BatchNorm statistics in FLOAT;
the Type <-> numpy dtype mapping and host conversions."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite import precision as P
from pycaffe_lite.errors import NetError
from pycaffe_lite.proto import caffe_pb2
from pycaffe_lite.proto.protoio import parse_text

D, F, H, B = caffe_pb2.DOUBLE, caffe_pb2.FLOAT, caffe_pb2.FLOAT16, caffe_pb2.BFLOAT16


def _rule(net_fields: str, layer: str, fallback: int = F) -> P.LayerPrecision:
    net = parse_text(f'name: "n" {net_fields} layer {{ {layer} }}', caffe_pb2.NetParameter())
    return P.layer_precision(net, net.layer[0], fallback)


def _types(p: P.LayerPrecision) -> tuple[int, int, int, int]:
    return p.forward_type, p.backward_type, p.forward_math, p.backward_math


CONV = 'name: "conv" type: "Convolution"'


@pytest.mark.parametrize(("net_fields", "layer_fields", "expected"), [
    # nothing in the file: the fallback everywhere
    ("", "", (F, F, F, F)),
    # net storage defaults only: the math follows the storage
    ("default_forward_type: FLOAT16 default_backward_type: FLOAT16", "", (H, H, H, H)),
    ("default_forward_type: BFLOAT16", "", (B, F, B, F)),
    # NVCaffe's "pseudo fp32": half storage, float math
    ("default_forward_type: FLOAT16 default_backward_type: FLOAT16 default_forward_math: FLOAT "
     "default_backward_math: FLOAT", "", (H, H, F, F)),
    # a net math default alone
    ("default_forward_math: FLOAT16", "", (F, F, H, F)),
    # the layer's own storage type beats the net's math default for the layer's math
    ("default_forward_type: FLOAT16 default_forward_math: FLOAT16 default_backward_type: FLOAT16",
     "forward_type: FLOAT", (F, H, F, H)),
    ("default_forward_math: FLOAT default_backward_math: FLOAT", "forward_type: FLOAT16 backward_type: BFLOAT16",
     (H, B, H, B)),
    # the layer's own math beats everything
    ("default_forward_type: FLOAT16 default_forward_math: FLOAT16", "forward_math: DOUBLE", (H, F, D, F)),
    ("", "forward_type: FLOAT16 forward_math: FLOAT backward_math: FLOAT16", (H, F, F, H)),
    # forward and backward are independent
    ("default_backward_type: FLOAT16", "forward_type: BFLOAT16", (B, H, B, H)),
])
def test_nvcaffe_defaulting(net_fields: str, layer_fields: str, expected) -> None:
    p = _rule(net_fields, f"{CONV} {layer_fields}")
    assert _types(p) == expected
    assert p.statistics_type is None and p.note is None
    assert p.is_half == bool({H, B} & set(expected))


def test_fallback_is_used_only_where_the_file_is_silent() -> None:
    assert _types(_rule("", CONV, fallback=D)) == (D, D, D, D)
    assert _types(_rule("default_forward_type: FLOAT16", CONV, fallback=D)) == (H, D, H, D)
    assert _types(_rule("", f"{CONV} backward_math: FLOAT", fallback=D)) == (D, D, D, F)


@pytest.mark.parametrize("layer", [
    'name: "d" type: "Data"', 'name: "i" type: "Input"', 'name: "y" type: "DummyData"',
    'name: "h" type: "HDF5Data"', 'name: "a" type: "AnnotatedData"',
    'name: "py" type: "Python" transform_param { scale: 0.5 }',  # NVCaffe's test: a transform_param
])
def test_data_layers_stay_float(layer: str) -> None:
    half = "default_forward_type: FLOAT16 default_backward_type: BFLOAT16 default_forward_math: FLOAT16"
    p = _rule(half, layer)
    assert _types(p) == (F, F, F, F) and p.note is None
    p = _rule(half, f"{layer} forward_type: FLOAT16 backward_math: BFLOAT16")
    assert _types(p) == (F, F, F, F)
    assert p.note is not None and "data layers stay in FLOAT" in p.note and "forward_type, backward_math" in p.note
    assert _types(_rule("", layer, fallback=D)) == (D, D, D, D)  # a float64 net keeps float64 data


def test_a_python_layer_without_transform_param_follows_the_net() -> None:
    assert _types(_rule("default_forward_type: FLOAT16", 'name: "py" type: "Python"')) == (H, F, H, F)


@pytest.mark.parametrize(("net_fields", "fallback", "types", "statistics"), [
    ("default_forward_type: FLOAT16 default_backward_type: FLOAT16", F, (H, H, H, H), F),
    ("default_forward_type: BFLOAT16 default_forward_math: FLOAT", F, (B, F, F, F), F),
    ("", F, (F, F, F, F), F),
    ("", D, (D, D, D, D), D),
])
@pytest.mark.parametrize("layer_type", ["BatchNorm", "BN"])
def test_batch_norm_statistics_stay_float(net_fields, fallback, types, statistics, layer_type) -> None:
    p = _rule(net_fields, f'name: "bn" type: "{layer_type}"', fallback)
    assert _types(p) == types and p.statistics_type == statistics


def test_the_rule_changes_neither_message() -> None:
    net = parse_text('default_forward_type: FLOAT16 layer { name: "c" type: "Convolution" }', caffe_pb2.NetParameter())
    before = net.SerializeToString()
    P.layer_precision(net, net.layer[0])
    assert net.SerializeToString() == before and not net.layer[0].HasField("forward_math")


@pytest.mark.parametrize(("net_fields", "layer_fields", "message"), [
    ("", "forward_type: INT", r"layer 'conv' \(Convolution\): forward_type INT is not a float type"),
    ("", "backward_math: BOOL", r"layer 'conv' \(Convolution\): backward_math BOOL is not a float type"),
    ("default_backward_type: UINT", "", "net 'n': default_backward_type UINT is not a float type"),
])
def test_non_float_types_are_errors(net_fields: str, layer_fields: str, message: str) -> None:
    with pytest.raises(NetError, match=message):
        _rule(net_fields, f"{CONV} {layer_fields}")


def test_kernel_math_type() -> None:
    assert [P.kernel_math_type(t) for t in (D, F, H, B)] == [D, F, F, F]
    with pytest.raises(NetError, match="INT is not a float type"):
        P.kernel_math_type(caffe_pb2.INT)


def test_dtype_mapping() -> None:
    expected = {D: np.float64, F: np.float32, H: np.float16, B: np.uint16}
    for t, dtype in expected.items():
        assert P.storage_dtype(t) == np.dtype(dtype)
        assert P.type_of_dtype(dtype) == t
    with pytest.raises(ValueError, match="no float storage for BOOL"):
        P.storage_dtype(caffe_pb2.BOOL)
    with pytest.raises(ValueError, match="no Type stores int32"):
        P.type_of_dtype(np.int32)


@pytest.mark.parametrize(("t", "eps"), [(D, 0.0), (F, 2.0 ** -24), (H, 2.0 ** -11), (B, 2.0 ** -8)])
def test_host_conversions(t: int, eps: float) -> None:
    x = np.random.default_rng(5).normal(size=(3, 7)).astype(np.float32)
    stored = P.from_float32(x, t)
    assert stored.dtype == P.storage_dtype(t) and stored.shape == x.shape
    back = P.to_float32(stored, t)
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, x, rtol=eps, atol=0)
    if t != D:
        assert P.from_float32(back, t).tobytes() == stored.tobytes()  # a stored value is kept exactly
