"""Net: graph construction (filtering, splits, in place, loss weights, backward needs, shared params),
the pycaffe surface, and error messages. Small nets from prototxt strings written to tmp_path."""

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.errors import NetError, PrototxtError, ShapeError, UnknownLayerError, WeightsError

F64 = np.float64


def make_net(tmp_path, text, phase=caffe.TRAIN, name="net.prototxt", **kwargs):
    path = tmp_path / name
    path.write_text(text)
    kwargs.setdefault("dtype", F64)
    return caffe.Net(str(path), phase, **kwargs)


def _input(name="x", dims=(2, 3)):
    dim = " ".join(f"dim: {d}" for d in dims)
    return f'layer {{ name: "input" type: "Input" top: "{name}" input_param {{ shape {{ {dim} }} }} }}\n'


def _ip(name, bottom, top, n, extra="", layer_extra=""):
    return (
        f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{top}" {layer_extra}\n'
        f"  inner_product_param {{ num_output: {n} weight_filler {{ type: 'gaussian' std: 1 }}\n"
        f"    bias_filler {{ type: 'gaussian' std: 1 }} {extra} }} }}\n"
    )


def _fill_inputs(net, seed=0):
    rng = np.random.default_rng(seed)
    for name in net.inputs:
        net.blobs[name].data[...] = rng.standard_normal(net.blobs[name].shape)


# -- phase / level / stage filtering ---------------------------------------------------------
FILTER_NET = (
    _input()
    + 'layer { name: "train_only" type: "ReLU" bottom: "x" top: "a" include { phase: TRAIN } }\n'
    + 'layer { name: "not_test" type: "ReLU" bottom: "x" top: "b" exclude { phase: TEST } }\n'
    + 'layer { name: "test_only" type: "ReLU" bottom: "x" top: "c" include { phase: TEST } }\n'
    + 'layer { name: "deploy" type: "ReLU" bottom: "x" top: "d" include { stage: "deploy" } }\n'
    + 'layer { name: "level2" type: "ReLU" bottom: "x" top: "e" include { min_level: 2 } }\n'
    + 'layer { name: "low_level" type: "ReLU" bottom: "x" top: "f" include { max_level: 0 } }\n'
    + 'layer { name: "no_deploy" type: "ReLU" bottom: "x" top: "g" include { not_stage: "deploy" } }\n'
    + 'layer { name: "either" type: "ReLU" bottom: "x" top: "h" include { phase: TEST stage: "a" }\n'
    + '        include { phase: TRAIN stage: "b" } }\n'
)


@pytest.mark.parametrize(
    "phase,level,stages,kept",
    [
        (caffe.TRAIN, 0, None, ["train_only", "not_test", "low_level", "no_deploy"]),
        (caffe.TEST, 0, None, ["test_only", "low_level", "no_deploy"]),
        (caffe.TEST, 2, ["deploy"], ["test_only", "deploy", "level2"]),
        (caffe.TEST, 0, ["a"], ["test_only", "low_level", "no_deploy", "either"]),
        (caffe.TRAIN, 1, ["a", "b"], ["train_only", "not_test", "no_deploy", "either"]),
    ],
)
def test_phase_level_stage_filtering(tmp_path, phase, level, stages, kept):
    net = make_net(tmp_path, FILTER_NET, phase, level=level, stages=stages)
    names = [n for n in net._layer_names if n != "input" and not n.endswith("_split")]
    assert names == kept
    assert net.phase == phase


def test_include_and_exclude_together_is_an_error(tmp_path):
    text = _input() + 'layer { name: "r" type: "ReLU" bottom: "x" top: "y" include { phase: TRAIN } exclude { phase: TEST } }'
    with pytest.raises(NetError, match="'r'.*include or exclude"):
        make_net(tmp_path, text)


def test_phase_in_prototxt_state_and_default(tmp_path):
    text = 'state { phase: TRAIN }\n' + _input() + 'layer { name: "t" type: "ReLU" bottom: "x" top: "y" include { phase: TRAIN } }'
    path = tmp_path / "s.prototxt"
    path.write_text(text)
    assert "t" in caffe.Net(str(path))._layer_names  # state from the file
    path.write_text(_input() + 'layer { name: "t" type: "ReLU" bottom: "x" top: "y" include { phase: TRAIN } }')
    net = caffe.Net(str(path))
    assert net.phase == caffe.TEST and "t" not in net._layer_names  # default phase is TEST


# -- split insertion ---------------------------------------------------------------------------
SPLIT_NET = (
    "force_backward: true\n"
    + _input("x", (2, 3))
    + _ip("ip1", "x", "y1", 2, layer_extra="loss_weight: 1")
    + _ip("ip2", "x", "y2", 2, layer_extra="loss_weight: 2")
)


def test_split_inserted_and_gradients_summed(tmp_path):
    net = make_net(tmp_path, SPLIT_NET)
    split = [n for n in net._layer_names if n.endswith("_split")]
    assert split == ["x_input_0_split"]
    assert net.layers[net._layer_names.index(split[0])].type == "Split"
    assert net.bottom_names["ip1"] == ["x_input_0_split_0"]
    assert net.bottom_names["ip2"] == ["x_input_0_split_1"]
    _fill_inputs(net)
    x = net.blobs["x"].data.copy()
    w1, b1 = (p.data.copy() for p in net.params["ip1"])
    w2, b2 = (p.data.copy() for p in net.params["ip2"])
    loss = net.forward_backward()
    expected_loss = (x @ w1.T + b1).sum() + 2 * (x @ w2.T + b2).sum()
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    ones = np.ones((2, 2))
    np.testing.assert_allclose(net.blobs["x"].diff, ones @ w1 + 2 * ones @ w2, rtol=1e-12)
    np.testing.assert_allclose(net.params["ip1"][0].diff, ones.T @ x, rtol=1e-12)
    np.testing.assert_allclose(net.params["ip2"][0].diff, 2 * ones.T @ x, rtol=1e-12)
    np.testing.assert_allclose(net.params["ip2"][1].diff, [4.0, 4.0])
    # the split tops share the input's data
    assert net.blobs["x_input_0_split_0"].data_memory is net.blobs["x"].data_memory


def test_split_for_blob_with_loss_weight_and_consumer(tmp_path):
    # h carries a loss and also feeds ip2: the loss moves to an extra split top.
    text = (
        "force_backward: true\n" + _input("x", (2, 3))
        + _ip("ip1", "x", "h", 2, layer_extra="loss_weight: 0.5")
        + _ip("ip2", "h", "y", 1, layer_extra="loss_weight: 1")
    )
    net = make_net(tmp_path, text)
    assert "h_ip1_0_split" in net._layer_names
    _fill_inputs(net, 1)
    x = net.blobs["x"].data.copy()
    w1, b1 = (p.data for p in net.params["ip1"])
    w2, b2 = (p.data for p in net.params["ip2"])
    loss = net.forward_backward()
    h = x @ w1.T + b1
    assert loss == pytest.approx(0.5 * h.sum() + (h @ w2.T + b2).sum(), rel=1e-12)
    dh = 0.5 * np.ones((2, 2)) + np.ones((2, 1)) @ w2
    np.testing.assert_allclose(net.blobs["x"].diff, dh @ w1, rtol=1e-12)


# -- in place, loss weights, backward needs --------------------------------------------------
def test_in_place_relu(tmp_path):
    text = (
        "force_backward: true\n" + _input("x", (3, 4))
        + _ip("ip", "x", "h", 3)
        + 'layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }\n'
        + _ip("out", "h", "y", 1, layer_extra="loss_weight: 1")
    )
    net = make_net(tmp_path, text)
    assert list(net.blobs) == ["x", "h", "y"]
    assert net.top_names["relu"] == ["h"] and net.bottom_names["relu"] == ["h"]
    _fill_inputs(net, 2)
    x = net.blobs["x"].data.copy()
    w1, b1 = (p.data for p in net.params["ip"])
    w2 = net.params["out"][0].data
    net.forward_backward()
    pre = x @ w1.T + b1
    np.testing.assert_allclose(net.blobs["h"].data, np.maximum(pre, 0), rtol=1e-12)
    dh = np.ones((3, 1)) @ w2 * (pre > 0)
    np.testing.assert_allclose(net.params["ip"][0].diff, dh.T @ x, rtol=1e-12)
    np.testing.assert_allclose(net.blobs["x"].diff, dh @ w1, rtol=1e-12)


def test_loss_weight_on_non_loss_layer(tmp_path):
    text = _input("x", (2, 3)) + _ip("ip", "x", "y", 2, layer_extra="loss_weight: 3")
    net = make_net(tmp_path, text)
    assert net.blob_loss_weights["y"] == 3.0 and net.blob_loss_weights["x"] == 0.0
    _fill_inputs(net)
    loss = net.forward_prefilled()
    assert loss == pytest.approx(3 * net.blobs["y"].data.sum(), rel=1e-12)
    net.backward()
    np.testing.assert_allclose(net.params["ip"][1].diff, [6.0, 6.0])  # 3 per row, 2 rows


def test_no_loss_no_backward_and_too_many_loss_weights(tmp_path):
    net = make_net(tmp_path, _input() + _ip("ip", "x", "y", 2))
    assert net.layer_need_backward == [False, False]
    text = _input() + _ip("ip", "x", "y", 2, layer_extra="loss_weight: 1 loss_weight: 1")
    with pytest.raises(NetError, match="loss_weight"):
        make_net(tmp_path, text)


@pytest.mark.parametrize("force", [False, True])
def test_force_backward(tmp_path, force):
    text = ("force_backward: true\n" if force else "") + _input() + _ip("ip", "x", "y", 2, layer_extra="loss_weight: 1")
    net = make_net(tmp_path, text)
    _fill_inputs(net)
    net.blobs["x"].diff[...] = 0
    net.forward_backward()
    w = net.params["ip"][0].data
    assert net.bottom_need_backward[1] == [force]
    if force:
        np.testing.assert_allclose(net.blobs["x"].diff, np.ones((2, 2)) @ w)
    else:
        np.testing.assert_array_equal(net.blobs["x"].diff, 0)
    assert np.abs(net.params["ip"][0].diff).sum() > 0  # params learn either way


def test_propagate_down_false(tmp_path):
    text = (
        _input() + _ip("ip1", "x", "h", 2)
        + _ip("ip2", "h", "y", 1, layer_extra="loss_weight: 1 propagate_down: false")
    )
    net = make_net(tmp_path, text)
    assert net.bottom_need_backward[2] == [False]
    assert net.layer_need_backward[1] is False  # nothing below ip2 receives a gradient
    _fill_inputs(net)
    net.blobs["h"].diff[...] = 42
    net.forward_backward()
    np.testing.assert_array_equal(net.blobs["h"].diff, 42)
    np.testing.assert_array_equal(net.params["ip1"][0].diff, 0)
    assert np.abs(net.params["ip2"][0].diff).sum() > 0
    bad = _input() + _ip("ip", "x", "y", 1, layer_extra="propagate_down: false propagate_down: true")
    with pytest.raises(NetError, match="propagate_down"):
        make_net(tmp_path, bad)


# -- parameters: sharing and multipliers -------------------------------------------------------
SHARED_NET = (
    "force_backward: true\n" + _input("x", (2, 3))
    + _ip("ip1", "x", "y1", 2, layer_extra='loss_weight: 1 param { name: "w" } param { name: "b" }')
    + _ip("ip2", "x", "y2", 2, layer_extra='loss_weight: 1 param { name: "w" } param { name: "b" }')
)


def test_shared_params_memory_and_accumulated_diffs(tmp_path):
    net = make_net(tmp_path, SHARED_NET)
    w1, w2 = net.params["ip1"][0], net.params["ip2"][0]
    assert w1.data_memory is w2.data_memory and w1.diff_memory is w2.diff_memory
    assert net.param_owners == [-1, -1, 0, 1]
    assert len(net.learnable_params) == 2
    _fill_inputs(net)
    x = net.blobs["x"].data.copy()
    net.params["ip1"][0].data[...] = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(net.params["ip2"][0].data, np.arange(6.0).reshape(2, 3))
    net.forward_backward()
    np.testing.assert_allclose(net.blobs["y1"].data, net.blobs["y2"].data)
    np.testing.assert_allclose(w1.diff, 2 * np.ones((2, 2)).T @ x, rtol=1e-12)  # both uses add up
    np.testing.assert_allclose(net.params["ip1"][1].diff, [4.0, 4.0])


def test_shared_param_shape_mismatch_and_permissive(tmp_path):
    strict = (
        _input("x", (2, 6)) + _input("z", (2, 4)).replace('"input"', '"input2"')
        + _ip("ip1", "x", "y1", 2, "bias_term: false", 'param { name: "w" }')
        + _ip("ip2", "z", "y2", 3, "bias_term: false", 'param { name: "w" }')
    )
    with pytest.raises(ShapeError, match=r"'ip2'.*'w'.*\(3, 4\).*\(2, 6\).*PERMISSIVE"):
        make_net(tmp_path, strict)
    permissive = strict.replace(
        'ip2" type: "InnerProduct" bottom: "z" top: "y2" param { name: "w" }',
        'ip2" type: "InnerProduct" bottom: "z" top: "y2" param { name: "w" share_mode: PERMISSIVE }',
    )
    assert permissive != strict
    net = make_net(tmp_path, permissive)
    assert net.params["ip2"][0].shape == (3, 4)
    assert net.params["ip2"][0].data_memory is net.params["ip1"][0].data_memory
    count_mismatch = permissive.replace("num_output: 3", "num_output: 5")  # (5, 4): 20 vs 12 elements
    with pytest.raises(ShapeError, match="elements"):
        make_net(tmp_path, count_mismatch)


def test_lr_and_decay_mult_recorded(tmp_path):
    text = (
        _input("x", (2, 3))
        + _ip("ip1", "x", "h", 2, layer_extra="param { lr_mult: 2 decay_mult: 0 } param { lr_mult: 0.5 }")
        + _ip("ip2", "h", "y", 1, layer_extra="loss_weight: 1 param { lr_mult: 0 } param { decay_mult: 3 }")
    )
    net = make_net(tmp_path, text)
    assert net.params_lr == [2.0, 0.5, 0.0, 1.0]
    assert net.params_weight_decay == [0.0, 1.0, 1.0, 3.0]
    assert net.layers[2].param_propagate_down == [False, True]
    _fill_inputs(net)
    net.forward_backward()
    np.testing.assert_array_equal(net.params["ip2"][0].diff, 0)  # lr_mult 0: no gradient
    assert np.abs(net.params["ip2"][1].diff).sum() > 0


def _shared_three(specs):
    text = "force_backward: true\n" + _input("x", (2, 3))
    for i, spec in enumerate(specs):
        text += _ip(f"ip{i}", "x", f"y{i}", 2, "bias_term: false", f'loss_weight: 1 param {{ name: "w" {spec} }}')
    return text


def test_shared_param_multipliers(tmp_path):
    net = make_net(tmp_path, _shared_three(["", "lr_mult: 3", "decay_mult: 0.5"]))
    assert net.params_lr == [3.0] and net.params_weight_decay == [0.5]  # one learnable param
    with pytest.raises(NetError, match="'w'.*mismatched lr_mult"):
        make_net(tmp_path, _shared_three(["lr_mult: 2", "lr_mult: 3"]))
    with pytest.raises(NetError, match="'w'.*mismatched decay_mult"):
        make_net(tmp_path, _shared_three(["decay_mult: 2", "decay_mult: 3"]))


def test_shared_param_decay_set_by_sharer_then_mismatched(tmp_path):
    with pytest.raises(NetError, match="mismatched decay_mult"):
        make_net(tmp_path, _shared_three(["", "decay_mult: 2", "decay_mult: 3"]))


def test_too_many_param_specs(tmp_path):
    text = _input() + _ip("ip", "x", "y", 2, "bias_term: false", "param { } param { }")
    with pytest.raises(NetError, match="2 param specs.*1 param blobs"):
        make_net(tmp_path, text)


# -- legacy net-level inputs -------------------------------------------------------------------
@pytest.mark.parametrize(
    "header,shapes",
    [
        ('input: "data" input_shape { dim: 2 dim: 3 }', {"data": (2, 3)}),
        ('input: "data" input_dim: 2 input_dim: 3 input_dim: 4 input_dim: 5', {"data": (2, 3, 4, 5)}),
        ('input: "a" input: "b" input_shape { dim: 1 } input_shape { dim: 2 dim: 2 }', {"a": (1,), "b": (2, 2)}),
        ('input: "a" input: "b" input_dim: 1 input_dim: 1 input_dim: 1 input_dim: 3 '
         'input_dim: 2 input_dim: 1 input_dim: 1 input_dim: 1', {"a": (1, 1, 1, 3), "b": (2, 1, 1, 1)}),
    ],
)
def test_legacy_net_inputs(tmp_path, header, shapes):
    net = make_net(tmp_path, header + '\nlayer { name: "s" type: "Silence" ' + " ".join(f'bottom: "{n}"' for n in shapes) + " }")
    assert net.inputs == list(shapes)
    for name, shape in shapes.items():
        assert net.blobs[name].shape == shape


def test_legacy_input_without_shape_is_an_error(tmp_path):
    with pytest.raises(NetError, match="input_shape or input_dim"):
        make_net(tmp_path, 'input: "data"\nlayer { name: "s" type: "Silence" bottom: "data" }')
    with pytest.raises(NetError, match="4 values per input"):
        make_net(tmp_path, 'input: "data" input_dim: 2 input_dim: 3\nlayer { name: "s" type: "Silence" bottom: "data" }')


# -- pycaffe surface ---------------------------------------------------------------------------
CHAIN = (
    _input("x", (2, 3))
    + _ip("ip1", "x", "h", 4)
    + 'layer { name: "relu" type: "ReLU" bottom: "h" top: "r" }\n'
    + _ip("ip2", "r", "y", 2)
)


def test_pycaffe_attributes(tmp_path):
    net = make_net(tmp_path, CHAIN)
    assert net._layer_names == ["input", "ip1", "relu", "ip2"]
    assert [layer.type for layer in net.layers] == ["Input", "InnerProduct", "ReLU", "InnerProduct"]
    assert list(net.blobs) == ["x", "h", "r", "y"]
    assert net.blobs["h"].shape == (2, 4) and net.blobs["y"].shape == (2, 2)
    assert list(net.params) == ["ip1", "ip2"]
    assert [p.shape for p in net.params["ip1"]] == [(4, 3), (4,)]
    assert net.params["ip1"][0] is net.layers[1].blobs[0]
    assert net.inputs == ["x"] and net.outputs == ["y"]
    assert list(net.layer_dict) == net._layer_names
    assert net.top_names["ip1"] == ["h"] and net.bottom_names["ip2"] == ["r"]


def _chain_reference(net, x):
    w1, b1 = (p.data for p in net.params["ip1"])
    w2, b2 = (p.data for p in net.params["ip2"])
    h = x @ w1.T + b1
    r = np.maximum(h, 0)
    return h, r, r @ w2.T + b2


def test_forward_with_inputs_and_ranges(tmp_path):
    net = make_net(tmp_path, CHAIN)
    x = np.random.default_rng(3).standard_normal((2, 3))
    h, r, y = _chain_reference(net, x)
    out = net.forward(x=x)
    assert list(out) == ["y"]
    np.testing.assert_allclose(out["y"], y, rtol=1e-12)
    out = net.forward(end="ip1", x=2 * x)
    assert list(out) == ["h"]
    np.testing.assert_allclose(out["h"], _chain_reference(net, 2 * x)[0], rtol=1e-12)
    net.blobs["r"].data[...] = 1.0
    out = net.forward(start="ip2")  # only ip2 runs, on the r we set
    np.testing.assert_allclose(out["y"], np.ones((2, 4)) @ net.params["ip2"][0].data.T + net.params["ip2"][1].data)
    out = net.forward(blobs=["h", "r"], x=x)
    assert set(out) == {"h", "r", "y"}
    np.testing.assert_allclose(out["r"], r, rtol=1e-12)
    out = net.forward(start=1, end=1)
    assert list(out) == ["h"]


def test_forward_input_errors(tmp_path):
    net = make_net(tmp_path, CHAIN)
    with pytest.raises(ShapeError, match="'x'.*\\(3, 3\\)"):
        net.forward(x=np.zeros((3, 3)))
    with pytest.raises(NetError, match="'h' is not an input"):
        net.forward(h=np.zeros((2, 4)))
    with pytest.raises(NetError, match="no layer named 'nope'"):
        net.forward(end="nope")
    with pytest.raises(NetError, match="out of range"):
        net.forward(start=9)


def test_backward_with_diffs_and_ranges(tmp_path):
    net = make_net(tmp_path, "force_backward: true\n" + CHAIN)
    x = np.random.default_rng(4).standard_normal((2, 3))
    h, r, y = _chain_reference(net, x)
    net.forward(x=x)
    dy = np.random.default_rng(5).standard_normal((2, 2))
    w1 = net.params["ip1"][0].data
    w2 = net.params["ip2"][0].data
    out = net.backward(y=dy)
    assert list(out) == ["x"]
    dr = dy @ w2
    np.testing.assert_allclose(out["x"], (dr * (h > 0)) @ w1, rtol=1e-12)
    # a partial range: start at relu with a diff on r, stop at ip1; returns ip1's bottom diffs
    dr2 = np.ones((2, 4))
    out = net.backward(start="relu", end="ip1", r=dr2)
    assert list(out) == ["x"]
    np.testing.assert_allclose(out["x"], (dr2 * (h > 0)) @ w1, rtol=1e-12)
    out = net.backward(diffs=["h"], start="relu", end="relu", r=dr2)
    assert set(out) == {"h"}
    np.testing.assert_allclose(out["h"], dr2 * (h > 0))
    with pytest.raises(NetError, match="no blob named 'q'"):
        net.backward(q=dy)
    with pytest.raises(ShapeError, match="'y'"):
        net.backward(y=np.zeros(3))


def test_reshape_propagates_input_shape(tmp_path):
    net = make_net(tmp_path, CHAIN)
    net.blobs["x"].reshape(5, 3)
    net.reshape()
    assert net.blobs["y"].shape == (5, 2)
    out = net.forward(x=np.ones((5, 3)))
    assert out["y"].shape == (5, 2)


def test_net_from_net_parameter_and_dtype(tmp_path):
    from pycaffe_lite.proto import protoio
    from pycaffe_lite.schema import caffe_pb2

    param = protoio.parse_text(CHAIN, caffe_pb2.NetParameter())
    net = caffe.Net(param, caffe.TEST)
    assert net.blobs["y"].data.dtype == np.float32
    assert net.source is None


# -- errors ------------------------------------------------------------------------------------
def test_unknown_layer_type_lists_known(tmp_path):
    with pytest.raises(UnknownLayerError) as exc:
        make_net(tmp_path, _input() + 'layer { name: "b" type: "Bogus" bottom: "x" top: "y" }')
    msg = str(exc.value)
    assert "'b'" in msg and "'Bogus'" in msg and "InnerProduct" in msg and "ReLU" in msg


def test_missing_bottom(tmp_path):
    with pytest.raises(NetError, match="'r'.*unknown bottom blob 'nothing'"):
        make_net(tmp_path, _input() + 'layer { name: "r" type: "ReLU" bottom: "nothing" top: "y" }')


def test_duplicate_top(tmp_path):
    text = (
        _input() + 'layer { name: "r1" type: "ReLU" bottom: "x" top: "y" }\n'
        + 'layer { name: "r2" type: "ReLU" bottom: "x" top: "y" }\n'
    )
    with pytest.raises(NetError, match="'r2'.*'y'.*already produced"):
        make_net(tmp_path, text)


def test_duplicate_layer_name_is_accepted_as_in_bvlc(tmp_path):
    text = (
        _input() + 'layer { name: "r" type: "ReLU" bottom: "x" top: "y" }\n'
        + 'layer { name: "r" type: "ReLU" bottom: "y" top: "z" }\n'
    )
    net = make_net(tmp_path, text)
    assert net._layer_names.count("r") == 2
    assert list(net.layer_dict) == ["input", "r"]
    assert net.layer_dict["r"] is net.layers[-1]  # pycaffe's dict: the last layer of a name


@pytest.mark.parametrize(
    "layer,match",
    [
        ('layer { name: "r" type: "ReLU" bottom: "x" bottom: "x" top: "y" }', "'r'.*exactly 1 bottom.*got 2"),
        ('layer { name: "r" type: "ReLU" bottom: "x" top: "y" top: "z" }', "'r'.*exactly 1 top.*got 2"),
        ('layer { name: "c" type: "Eltwise" bottom: "x" top: "y" }', "'c'.*at least 2 bottom.*got 1"),
        ('layer { name: "s" type: "Silence" bottom: "x" top: "y" }', "'s'.*exactly 0 top"),
    ],
)
def test_wrong_blob_counts(tmp_path, layer, match):
    with pytest.raises(NetError, match=match):
        make_net(tmp_path, _input() + layer)


def test_layer_shape_error_names_layer(tmp_path):
    text = (
        _input("x", (2, 3)) + _input("z", (2, 4)).replace('"input"', '"input2"')
        + 'layer { name: "cat" type: "Concat" bottom: "x" bottom: "z" top: "y" concat_param { axis: 0 } }'
    )
    with pytest.raises(ShapeError, match="'cat'"):
        make_net(tmp_path, text)


def test_malformed_prototxt_reports_file_line_column(tmp_path):
    text = _input() + 'layer {\n  name: "r"\n  type: "ReLU"\n  bottom: "x"\n  top "y"\n}\n'
    with pytest.raises(PrototxtError) as exc:
        make_net(tmp_path, text, name="broken.prototxt")
    msg = str(exc.value)
    assert "broken.prototxt:6:" in msg  # the line of 'top "y"' (the Input layer takes one line)
    col = msg.split("broken.prototxt:6:")[1].split(":")[0]
    assert col.isdigit()


def test_unknown_field_reports_line(tmp_path):
    with pytest.raises(PrototxtError, match=r"bad\.prototxt:2:\d+.*no_such_field"):
        make_net(tmp_path, 'name: "n"\nno_such_field: 1\n', name="bad.prototxt")


def test_unreadable_file(tmp_path):
    missing = tmp_path / "missing.prototxt"
    with pytest.raises(PrototxtError, match="missing.prototxt.*cannot read"):
        caffe.Net(str(missing), caffe.TEST)
    binary = tmp_path / "binary.prototxt"
    binary.write_bytes(b"\xff\xfe\x00\x81garbage")
    with pytest.raises(PrototxtError, match="binary.prototxt"):
        caffe.Net(str(binary), caffe.TEST)


# -- GPU ---------------------------------------------------------------------------------------
GPU_NET = (
    "force_backward: true\n" + _input("x", (3, 4))
    + _ip("ip1", "x", "y1", 2, layer_extra="loss_weight: 1")
    + _ip("ip2", "x", "h", 5)
    + 'layer { name: "relu" type: "ReLU" bottom: "h" top: "h" relu_param { negative_slope: 0.1 } }\n'
    + _ip("ip3", "h", "y3", 3, layer_extra="loss_weight: 0.5")
)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_net_cpu_gpu_agree(tmp_path, dtype):
    results = []
    x = np.random.default_rng(9).standard_normal((3, 4))
    for dev in ("cpu", "gpu"):
        caffe.set_mode_gpu() if dev == "gpu" else caffe.set_mode_cpu()
        try:
            caffe.set_random_seed(11)
            net = make_net(tmp_path, GPU_NET, dtype=dtype)
            net.blobs["x"].data[...] = x
            loss = net.forward_backward()
            outs = [np.array(loss), net.blobs["y3"].data.copy(), net.blobs["x"].diff.copy()]
            results.append(outs + [p.diff.copy() for p in net.learnable_params])
        finally:
            caffe.set_mode_cpu()
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for c, g in zip(*results):
        np.testing.assert_allclose(c, g, rtol=tol, atol=tol)


def test_duplicate_names_with_params_follow_bvlc(tmp_path):
    """Two InnerProduct layers named "ip": a .caffemodel fills the first one of the net for every
    source layer of that name (BVLC's CopyTrainedLayersFrom searches from the start), an HDF5 file
    the last one (layer_names_index_); forward(start=...) starts at the first; share_with shares the
    first."""
    text = _input(dims=(2, 3)) + _ip("ip", "x", "h", 3) + _ip("ip", "h", "y", 3)
    caffe.set_random_seed(1)
    src = make_net(tmp_path, text)
    a, b = (layer.blobs[0].data.copy() for layer in src.layers[1:])
    path = tmp_path / "w.caffemodel"
    src.save(path)
    caffe.set_random_seed(2)
    dst = make_net(tmp_path, text, name="dst.prototxt")
    second = dst.layers[2].blobs[0].data.copy()
    missing = dst.copy_from(path)
    np.testing.assert_array_equal(dst.layers[1].blobs[0].data, b)  # the second source layer wrote last
    np.testing.assert_array_equal(dst.layers[2].blobs[0].data, second)  # never a target
    assert missing == ["ip"]
    with pytest.raises(WeightsError, match="holds no weights for layer ip"):
        dst.copy_from(path, allow_missing=False)
    assert not np.array_equal(a, b)
    assert dst._layer_index("ip", 0) == 1
    other = make_net(tmp_path, text, name="other.prototxt")
    other.share_with(src)
    np.testing.assert_array_equal(other.layers[1].blobs[0].data, b)


def test_duplicate_names_hdf5_fill_the_last(tmp_path):
    pytest.importorskip("h5py")
    import h5py

    text = _input(dims=(2, 3)) + _ip("ip", "x", "h", 3) + _ip("ip", "h", "y", 3)
    net = make_net(tmp_path, text)
    path = tmp_path / "w.h5"
    with h5py.File(path, "w") as f:
        f["data/ip/0"] = np.full((3, 3), 5.0)
        f["data/ip/1"] = np.full(3, 6.0)
    first = net.layers[1].blobs[0].data.copy()
    assert net.copy_from(path) == ["ip"]
    np.testing.assert_array_equal(net.layers[2].blobs[0].data, np.full((3, 3), 5.0))
    np.testing.assert_array_equal(net.layers[1].blobs[0].data, first)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_debug_info_names_the_first_layer_with_nonfinite_values(tmp_path, caplog):
    import logging

    text = _input(dims=(2, 3)) + _ip("ip1", "x", "h", 3) + _ip("ip2", "h", "y", 2)
    net = make_net(tmp_path, text, phase=caffe.TEST)
    net.blobs["x"].data[...] = 1.0
    net.forward()  # off: nothing checked
    net.params["ip2"][0].data[1, 2] = np.nan
    net.forward()
    net.debug_info = True
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        with pytest.raises(NetError, match=r"layer 'ip2' \(InnerProduct\) gave 2 non-finite value\(s\) .* of 4 in top "
                                           r"'y': its param 0 holds NaN/Inf"):
            net.forward()
    assert "[Forward] Layer ip1, top blob h data: " in caplog.text
    net.params["ip2"][0].data[1, 2] = 0
    net.blobs["x"].data[0, 0] = np.inf
    with pytest.raises(NetError, match=r"layer 'ip1' \(InnerProduct\) gave .* in top 'h': its bottom 'x' was "
                                       r"already non-finite"):
        net.forward(start="ip1")
    net.debug_info = False
    net.forward(start="ip1")
    # from the prototxt field
    text2 = "debug_info: true\n" + text
    net2 = make_net(tmp_path, text2, phase=caffe.TEST, name="n2.prototxt")
    assert net2.debug_info
