"""Errors name the layer once: ``layer 'name' (Type): message``, never the prefix twice."""

from __future__ import annotations

import pytest

from pycaffe_lite import TEST, Net
from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.proto.protoio import parse_text
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.testing.layer_testing import make_layer


def net_with(layer: str) -> Net:
    text = ('layer { name: "data" type: "Input" top: "x" top: "y" '
            "input_param { shape { dim: 4 dim: 3 } shape { dim: 3 } } } " + layer)
    return Net(parse_text(text, caffe_pb2.NetParameter()), TEST)


@pytest.mark.parametrize("layer,prefix", [
    # the layer's own check (its message already names it)
    ('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "y" top: "l" }',
     "layer 'loss' (SoftmaxWithLoss): "),
    # a Blob method's ShapeError (axis out of range), named by Layer.setup
    ('layer { name: "ip" type: "InnerProduct" bottom: "x" top: "z" inner_product_param { num_output: 2 axis: 5 } }',
     "layer 'ip' (InnerProduct): "),
])
def test_shape_errors_in_a_net_carry_the_prefix_once(layer, prefix):
    with pytest.raises(ShapeError) as info:
        net_with(layer)
    msg = str(info.value)
    assert msg.startswith(prefix) and msg.count("layer '") == 1, msg


def test_layer_error_adds_the_prefix_once():
    layer = make_layer('name: "r" type: "ReLU"')
    err = layer.error("bad thing")
    assert isinstance(err, NetError) and str(err) == "layer 'r' (ReLU): bad thing"
    again = layer.error(str(err), ShapeError)
    assert isinstance(again, ShapeError) and str(again) == "layer 'r' (ReLU): bad thing"
