"""The fork converters (ops_fork.py) against the REAL fork layers in ``layers/``: small nets with
ReLU6, Permute, Normalize, ShuffleChannel, ROIPooling, Interp (every size mode and the crop),
Upsample, PriorBox and DetectionOutput, exported and proven by the built-in check (ONNX Runtime
against pycaffe-lite's forward, every blob within 1e-5 of its range)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx_testing import export_and_check, make_net

from pycaffe_lite.onnx import ExportError, export_net

RNG = np.random.default_rng(5)


def inputs(*named) -> str:
    tops = " ".join(f'top: "{n}"' for n, _ in named)
    shapes = " ".join("shape { " + " ".join(f"dim: {d}" for d in s) + " }" for _, s in named)
    return f'name: "t"\nlayer {{ name: "in" type: "Input" {tops} input_param {{ {shapes} }} }}\n'


def check_with(net, feeds: dict, **kwargs):
    feeds = {k: np.asarray(v, np.float32) for k, v in feeds.items()}
    report = export_net(net, None, check_inputs=[feeds], random_check=False, **kwargs)
    onnx.checker.check_model(report.exported.model, full_check=True)
    assert report.checks[0].ok, report.checks[0].table()
    assert all(r.verdict.startswith("ok") for r in report.checks[0].rows), report.checks[0].table()
    return report


def test_relu6_permute_normalize_shuffle():
    net = make_net(inputs(("data", (2, 6, 3, 4))) + '''
    layer { name: "scale_up" type: "Power" bottom: "data" top: "big" power_param { scale: 5 } }
    layer { name: "r6" type: "ReLU6" bottom: "big" top: "r6" }
    layer { name: "sh" type: "ShuffleChannel" bottom: "big" top: "sh" shuffle_channel_param { group: 3 } }
    layer { name: "n1" type: "Normalize" bottom: "sh" top: "n1"
            norm_param { across_spatial: false channel_shared: false scale_filler { type: "constant" value: 20 } } }
    layer { name: "n2" type: "Normalize" bottom: "big" top: "n2" norm_param { eps: 1e-3 } }
    layer { name: "p1" type: "Permute" bottom: "n1" top: "p1" permute_param { order: 0 order: 2 order: 3 order: 1 } }
    layer { name: "p2" type: "Permute" bottom: "n2" top: "p2" permute_param { order: 0 order: 3 } }
    ''')
    report = export_and_check(net)
    compared = [r for r in report.checks[0].rows if r.verdict == "ok"]
    assert {r.row.type for r in compared} >= {"ReLU6", "ShuffleChannel", "Normalize", "Permute"}


def test_roi_pooling():
    net = make_net(inputs(("feat", (2, 3, 9, 11)), ("rois", (4, 5))) + '''
    layer { name: "roi" type: "ROIPooling" bottom: "feat" bottom: "rois" top: "pool"
            roi_pooling_param { pooled_h: 3 pooled_w: 2 spatial_scale: 0.25 } }''')
    rois = np.array([[0, 0, 0, 40, 30], [1, 6, 5, 21, 33], [1, 10, 10, 11, 11], [0, -8, 3, 60, 50]], np.float32)
    check_with(net, {"feat": RNG.standard_normal((2, 3, 9, 11)), "rois": rois})


INTERP = {
    "zoom": "zoom_factor: 3",
    "shrink": "shrink_factor: 2",
    "size": "height: 7 width: 4",
    "both": "shrink_factor: 2 zoom_factor: 3",
    "crop_zoom": "zoom_factor: 2 pad_beg: -1 pad_end: -2",
    "one_row": "height: 1 width: 6",
}


@pytest.mark.parametrize("mode", sorted(INTERP))
def test_interp(mode):
    net = make_net(inputs(("data", (2, 3, 5, 6))) +
                   f'layer {{ name: "interp" type: "Interp" bottom: "data" top: "y" interp_param {{ {INTERP[mode]} }} }}')
    export_and_check(net)


def test_interp_dynamic_batch():
    net = make_net(inputs(("data", (2, 3, 5, 6))) +
                   'layer { name: "interp" type: "Interp" bottom: "data" top: "y" interp_param { zoom_factor: 2 } }')
    export_and_check(net, dynamic_batch=True)


def test_upsample_one_bottom():
    net = make_net(inputs(("data", (1, 2, 3, 4))) + '''
    layer { name: "up" type: "Upsample" bottom: "data" top: "up" upsample_param { scale: 2 } }
    layer { name: "up1" type: "Upsample" bottom: "up" top: "up1" }''')
    export_and_check(net)


def ssd_head(code: str = "CENTER_SIZE", extra: str = "", keep: int = 5, classes: int = 4, loc_classes: int = 1,
             bg: int = 0, nms: str = "nms_threshold: 0.45 top_k: 8", batch: int = 1) -> str:
    """A one-map SSD: loc and conf convolutions, PriorBox, Permute / Flatten, softmax, DetectionOutput."""
    a = 4  # priors per cell: min, max, ratio 2 and 1/2
    return inputs(("data", (batch, 3, 6, 6))) + f'''
    layer {{ name: "feat" type: "Convolution" bottom: "data" top: "feat" convolution_param {{ num_output: 4 kernel_size: 3 stride: 2 pad: 1 }} }}
    layer {{ name: "loc" type: "Convolution" bottom: "feat" top: "loc" convolution_param {{ num_output: {4 * a * loc_classes} kernel_size: 1 }} }}
    layer {{ name: "loc_perm" type: "Permute" bottom: "loc" top: "loc_perm" permute_param {{ order: 0 order: 2 order: 3 order: 1 }} }}
    layer {{ name: "loc_flat" type: "Flatten" bottom: "loc_perm" top: "loc_flat" }}
    layer {{ name: "conf" type: "Convolution" bottom: "feat" top: "conf" convolution_param {{ num_output: {classes * a} kernel_size: 1 }} }}
    layer {{ name: "conf_perm" type: "Permute" bottom: "conf" top: "conf_perm" permute_param {{ order: 0 order: 2 order: 3 order: 1 }} }}
    layer {{ name: "conf_flat" type: "Flatten" bottom: "conf_perm" top: "conf_flat" }}
    layer {{ name: "conf_rs" type: "Reshape" bottom: "conf_flat" top: "conf_rs" reshape_param {{ shape {{ dim: 0 dim: -1 dim: {classes} }} }} }}
    layer {{ name: "conf_sm" type: "Softmax" bottom: "conf_rs" top: "conf_sm" softmax_param {{ axis: 2 }} }}
    layer {{ name: "conf_out" type: "Flatten" bottom: "conf_sm" top: "conf_out" }}
    layer {{ name: "prior" type: "PriorBox" bottom: "feat" bottom: "data" top: "prior"
            prior_box_param {{ min_size: 2 max_size: 4 aspect_ratio: 2 flip: true clip: true
                               variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 }} }}
    layer {{ name: "det" type: "DetectionOutput" bottom: "loc_flat" bottom: "conf_out" bottom: "prior" top: "det"
            detection_output_param {{ num_classes: {classes} background_label_id: {bg} code_type: {code}
              keep_top_k: {keep} nms_param {{ {nms} }} {extra} }} }}
    '''


@pytest.mark.parametrize("variant", ["center", "corner", "threshold", "no_keep", "none_pass", "no_background"])
def test_ssd_detection_output(variant):
    code, extra, keep = {
        "center": ("CENTER_SIZE", "", 5),
        "corner": ("CORNER", "", 6),
        "threshold": ("CENTER_SIZE", "confidence_threshold: 0.3", 4),
        "no_keep": ("CENTER_SIZE", "confidence_threshold: 0.01", -1),
        "none_pass": ("CENTER_SIZE", "confidence_threshold: 1.0", 5),
        "no_background": ("CENTER_SIZE", "confidence_threshold: 0.2", 7),
    }[variant]
    more = dict(bg=-1, nms="nms_threshold: 0.3") if variant == "no_background" else {}  # no top_k: every prior
    net = make_net(ssd_head(code, extra, keep, **more), seed=3)
    if variant == "corner":  # small offsets keep the decoded corners ordered
        net.params["loc"][0].data[...] *= 0.05
        net.params["loc"][1].data[...] *= 0.05
    for blob in net.params["conf"]:  # spread the scores
        blob.data[...] *= 4
    report = export_and_check(net)
    det = [r for r in report.checks[0].rows if r.row.layer == "det"][0]
    assert det.verdict == "ok"
    rows = net.blobs["det"].shape[2]
    if variant == "none_pass":
        assert rows == 1 and net.blobs["det"].data[0, 0, 0, 1] == -1
    else:
        assert rows > 1
    out = report.exported.model.graph.output
    assert [o.name for o in out] == ["det"] and out[0].type.tensor_type.shape.dim[2].dim_param == "detections"


def test_detection_output_errors():
    net = make_net(ssd_head(extra="share_location: false", loc_classes=4))
    with pytest.raises(ExportError, match=r"layer 'det' \(DetectionOutput\).*share_location"):
        export_and_check(net)
    net = make_net(ssd_head(nms="nms_threshold: 0.45 top_k: 8 eta: 0.9"))
    with pytest.raises(ExportError, match=r"layer 'det' \(DetectionOutput\).*eta"):
        export_and_check(net, dynamic_batch=True)
