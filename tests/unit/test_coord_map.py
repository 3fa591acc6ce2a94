"""caffe.coord_map (FCN's cropping helper): maps through convolution, pooling, deconvolution and
element-wise layers derived by hand, crop offsets checked by running the built net, and the errors."""

import numpy as np
import pytest
from caffe.coord_map import (
    AxisMismatchException,
    UndefinedMapException,
    compose,
    coord_map,
    coord_map_from_to,
    crop,
    inverse,
)

import caffe
from caffe import layers as L
from caffe import params as P


def _net(ks=3, stride=1, pad=0, pool=2, up=2, uppad=0, size=40):
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, size, size]))
    n.conv = L.Convolution(n.data, num_output=2, kernel_size=ks, stride=stride, pad=pad)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=pool, stride=pool)
    n.up = L.Deconvolution(n.pool, convolution_param=dict(num_output=2, kernel_size=2 * up, stride=up, pad=uppad))
    return n


def test_single_layer_maps():
    # conv k=5, s=1, p=0: output x sits on input x + 2  -> input->output map x -> x - 2
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 8, 8]))
    n.c = L.Convolution(n.data, num_output=1, kernel_size=5)
    ax, a, b = coord_map(n.c.fn)
    assert ax == 1 and a == 1 and b == -2
    # stride 2, pad 1, k 3: x -> x/2 + (1 - 1)/2 = x/2
    n.d = L.Convolution(n.data, num_output=1, kernel_size=3, stride=2, pad=1)
    assert coord_map(n.d.fn)[1:] == (0.5, 0.0)
    # dilation 2 makes k=3 span 5
    n.e = L.Convolution(n.data, num_output=1, kernel_size=3, dilation=2)
    assert coord_map(n.e.fn)[2] == -2
    # deconvolution k=4, s=2, p=1: x -> 2x + 3/2 - 1
    n.f = L.Deconvolution(n.data, convolution_param=dict(num_output=1, kernel_size=4, stride=2, pad=1))
    assert coord_map(n.f.fn)[1:] == (2, 0.5)
    n.r = L.ReLU(n.data)
    assert coord_map(n.r.fn) == (None, 1, 0)
    n.ip = L.InnerProduct(n.data, num_output=3)
    with pytest.raises(UndefinedMapException):
        coord_map(n.ip.fn)


def test_compose_and_inverse():
    m = (1, 0.5, -1.0)
    assert compose((None, 1, 0), m) == m
    assert compose(m, (None, 1, 0)) == m
    ax, a, b = compose(m, inverse(m))
    assert ax == 1 and a == 1 and b == 0
    assert compose((1, 2, 3), (1, 4, 5)) == (1, 8, 2 * 5 + 3)
    with pytest.raises(AxisMismatchException):
        compose((1, 1, 0), (2, 1, 0))


def test_round_trips_through_conv_pool_deconv():
    # sizes: data 40 -> conv k3 -> 38 -> pool 2 -> 19 -> deconv k4 s2 -> 40: aligned, no offset
    n = _net()
    assert coord_map_from_to(n.up, n.data) == (1, 1, 0)
    # conv k3 pad 1: 40 -> 40 -> 20 -> 42: the upsampled blob reaches one pixel further on each side
    n = _net(ks=3, pad=1)
    assert coord_map_from_to(n.up, n.data) == (1, 1, -1)
    # 4x pooling and 4x upsampling (k8 s4): 40 -> 40 -> 10 -> 44: two pixels each side
    n = _net(ks=3, pad=1, pool=4, up=4)
    assert coord_map_from_to(n.up, n.data) == (1, 1, -2)
    # and the other direction is the inverse map
    assert coord_map_from_to(n.data, n.up) == (1, 1, 2)
    net = caffe.Net(n.to_proto(), caffe.TEST)
    assert net.blobs["up"].shape[2] == net.blobs["data"].shape[2] + 4


def test_pass_through_layers_do_not_change_the_map():
    n = _net()
    base = coord_map_from_to(n.up, n.data)
    n.relu = L.ReLU(n.up, in_place=True)
    n.scale = L.Scale(n.relu)
    assert coord_map_from_to(n.scale, n.data) == base


def test_rectangular_kernels():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 20, 20]))
    n.c = L.Convolution(n.data, num_output=1, kernel_size=[3, 5])
    ax, a, b = coord_map_from_to(n.c, n.data)
    assert ax == 1 and (a == 1).all() and list(b) == [1, 2]  # half-widths 1 and 2
    n.bad = L.Convolution(n.data, num_output=1, kernel_h=3, kernel_w=5)
    with pytest.raises(AssertionError, match="legacy"):
        coord_map_from_to(n.bad, n.data)


def test_crop_builds_a_layer_that_aligns_the_blobs():
    # data 12x12 -> conv k5 (8x8); crop(data, conv) must cut data[2:10, 2:10]
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 12, 12]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=5, weight_filler=dict(type="constant", value=0))
    n.cropped = crop(n.data, n.conv)
    proto = n.to_proto()
    layer = proto.layer[-1]
    assert layer.type == "Crop" and layer.crop_param.axis == 2 and list(layer.crop_param.offset) == [2]
    net = caffe.Net(proto, caffe.TEST)
    x = np.arange(144, dtype=np.float32).reshape(1, 1, 12, 12)
    out = net.forward(data=x)
    np.testing.assert_array_equal(out["cropped"], x[:, :, 2:10, 2:10])


def test_crop_of_an_upsampled_score_fcn_style():
    # FCN: score at 1/2 resolution upsampled by 2 with k4 s2 is larger than the input by 2 each side
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 16, 16]))
    n.pool = L.Pooling(n.data, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.score = L.Convolution(n.pool, num_output=1, kernel_size=1)
    n.up = L.Deconvolution(n.score, convolution_param=dict(num_output=1, kernel_size=4, stride=2, bias_term=False))
    n.out = crop(n.up, n.data)
    layer = n.to_proto().layer[-1]
    assert list(layer.crop_param.offset) == [1]
    net = caffe.Net(n.to_proto(), caffe.TEST)
    assert net.blobs["up"].shape[2:] == (18, 18) and net.blobs["out"].shape[2:] == (16, 16)


def test_crop_errors():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 12, 12]))
    n.other = L.Input(shape=dict(dim=[1, 1, 12, 12]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=5)
    n.half = L.Convolution(n.data, num_output=1, kernel_size=1, stride=2)
    n.ip = L.InnerProduct(n.data, num_output=2)
    with pytest.raises(RuntimeError, match="Could not compute map"):
        coord_map_from_to(n.conv, n.other)
    with pytest.raises(RuntimeError, match="Could not compute map"):
        coord_map_from_to(n.ip, n.data)
    with pytest.raises(AssertionError, match="scale mismatch"):
        crop(n.data, n.half)
    with pytest.raises(AssertionError, match="negative offset"):
        crop(n.conv, n.data)  # conv is smaller than data: nothing to cut
