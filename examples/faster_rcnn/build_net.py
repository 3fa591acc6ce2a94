"""Build a small ZF-style Faster R-CNN (deploy and end-to-end training nets) with net_spec.

The nets follow py-faster-rcnn's prototxt layout and layer names: a convolutional trunk of stride
16, the RPN (``rpn_conv/3x3``, ``rpn_cls_score``, ``rpn_bbox_pred``, the reshape/softmax/reshape of
the scores), the ``Python`` proposal layer (``rpn.proposal_layer.ProposalLayer``), ``ROIPooling``,
two fully connected layers, ``cls_prob`` and ``bbox_pred``. Training adds ``RoIDataLayer``,
``AnchorTargetLayer``, ``ProposalTargetLayer`` and the ``SoftmaxWithLoss`` / ``SmoothL1Loss`` losses.
The trunk is much smaller than ZF so that it runs in seconds on a CPU.

    python examples/faster_rcnn/build_net.py --out DIR      # writes deploy.prototxt, train.prototxt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pycaffe_lite as caffe
from pycaffe_lite import layers as L
from pycaffe_lite import params as P

HERE = Path(__file__).resolve().parent
LIB = HERE / "lib"
NUM_ANCHORS = 9
FEAT_STRIDE = 16
# Anchor sizes for the small pictures of the examples (py-faster-rcnn: scales 8, 16, 32 for 600-pixel
# images); ratios 0.5, 1, 2 as there.
ANCHOR_SCALES = (2, 4, 8)
RPN_PARAMS = f"'feat_stride': {FEAT_STRIDE}, 'scales': {ANCHOR_SCALES}"


def add_lib_path() -> None:
    """The ported layers live in lib/ (modules ``rpn``, ``roi_data_layer``, ``fast_rcnn``, ``nms``)."""
    if str(LIB) not in sys.path:
        sys.path.insert(0, str(LIB))


def _conv(bottom, num, kernel, stride=1, pad=0):
    return L.Convolution(bottom, num_output=num, kernel_size=kernel, stride=stride, pad=pad,
                         weight_filler=dict(type="gaussian", std=0.01), bias_filler=dict(type="constant", value=0),
                         param=[dict(lr_mult=1), dict(lr_mult=2)])


def _trunk(n, width):
    n.conv1 = _conv(n.data, width, 7, stride=2, pad=3)
    n.relu1 = L.ReLU(n.conv1, in_place=True)
    n.pool1 = L.Pooling(n.relu1, pool=P.Pooling.MAX, kernel_size=3, stride=2, pad=1)
    n.conv2 = _conv(n.pool1, 2 * width, 5, stride=2, pad=2)
    n.relu2 = L.ReLU(n.conv2, in_place=True)
    n.pool2 = L.Pooling(n.relu2, pool=P.Pooling.MAX, kernel_size=3, stride=2, pad=1)
    n.conv3 = _conv(n.pool2, 4 * width, 3, pad=1)
    n.relu3 = L.ReLU(n.conv3, in_place=True)
    return n.relu3


def _rpn(n, feat, width):
    n["rpn_conv/3x3"] = _conv(feat, width, 3, pad=1)
    n["rpn_relu/3x3"] = L.ReLU(n["rpn_conv/3x3"], in_place=True)
    n.rpn_cls_score = _conv(n["rpn_relu/3x3"], 2 * NUM_ANCHORS, 1)
    n.rpn_bbox_pred = _conv(n["rpn_relu/3x3"], 4 * NUM_ANCHORS, 1)
    n.rpn_cls_score_reshape = L.Reshape(n.rpn_cls_score, shape=dict(dim=[0, 2, -1, 0]))
    return n.rpn_cls_score_reshape


def _proposals(n, phase_train: bool):
    n.rpn_cls_prob = L.Softmax(n.rpn_cls_score_reshape)
    n.rpn_cls_prob_reshape = L.Reshape(n.rpn_cls_prob, shape=dict(dim=[0, 2 * NUM_ANCHORS, -1, 0]))
    name = "rpn_rois" if phase_train else "rois"
    n[name] = L.Python(n.rpn_cls_prob_reshape, n.rpn_bbox_pred, n.im_info,
                       python_param=dict(module="rpn.proposal_layer", layer="ProposalLayer",
                                         param_str=RPN_PARAMS))
    return n[name]


def _head(n, rois, feat, num_classes, fc):
    n.roi_pool5 = L.ROIPooling(feat, rois, pooled_w=6, pooled_h=6, spatial_scale=1.0 / FEAT_STRIDE)
    n.fc6 = L.InnerProduct(n.roi_pool5, num_output=fc, weight_filler=dict(type="gaussian", std=0.01),
                           bias_filler=dict(type="constant", value=0))
    n.relu6 = L.ReLU(n.fc6, in_place=True)
    n.fc7 = L.InnerProduct(n.relu6, num_output=fc, weight_filler=dict(type="gaussian", std=0.01),
                           bias_filler=dict(type="constant", value=0))
    n.relu7 = L.ReLU(n.fc7, in_place=True)
    n.cls_score = L.InnerProduct(n.relu7, num_output=num_classes, weight_filler=dict(type="gaussian", std=0.01),
                                 bias_filler=dict(type="constant", value=0))
    n.bbox_pred = L.InnerProduct(n.relu7, num_output=4 * num_classes,
                                 weight_filler=dict(type="gaussian", std=0.001),
                                 bias_filler=dict(type="constant", value=0))


def deploy_net(num_classes: int = 21, width: int = 16, fc: int = 64, size=(224, 224)):
    """The test net: inputs ``data`` (1, 3, H, W) and ``im_info`` (1, 3); outputs ``cls_prob``,
    ``bbox_pred`` and the ``rois`` they belong to."""
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, *size]))
    n.im_info = L.Input(shape=dict(dim=[1, 3]))
    feat = _trunk(n, width)
    _rpn(n, feat, width)
    rois = _proposals(n, phase_train=False)
    _head(n, rois, feat, num_classes, fc)
    n.cls_prob = L.Softmax(n.cls_score)
    proto = n.to_proto()
    proto.name = "faster_rcnn_small_deploy"
    return proto


def train_net(num_classes: int = 21, width: int = 16, fc: int = 64):
    """End-to-end training net (py-faster-rcnn's ``faster_rcnn_end2end`` layout)."""
    n = caffe.NetSpec()
    n.data, n.im_info, n.gt_boxes = L.Python(
        python_param=dict(module="roi_data_layer.layer", layer="RoIDataLayer",
                          param_str=f"'num_classes': {num_classes}"), ntop=3, name="input-data")
    feat = _trunk(n, width)
    _rpn(n, feat, width)
    n.rpn_labels, n.rpn_bbox_targets, n.rpn_bbox_inside_weights, n.rpn_bbox_outside_weights = L.Python(
        n.rpn_cls_score, n.gt_boxes, n.im_info, n.data, name="rpn-data", ntop=4,
        python_param=dict(module="rpn.anchor_target_layer", layer="AnchorTargetLayer",
                          param_str=RPN_PARAMS))
    n.rpn_loss_cls = L.SoftmaxWithLoss(n.rpn_cls_score_reshape, n.rpn_labels, propagate_down=[True, False],
                                       loss_param=dict(ignore_label=-1, normalize=True), loss_weight=1)
    n.rpn_loss_bbox = L.SmoothL1Loss(n.rpn_bbox_pred, n.rpn_bbox_targets, n.rpn_bbox_inside_weights,
                                     n.rpn_bbox_outside_weights, sigma=3.0, loss_weight=1)
    rpn_rois = _proposals(n, phase_train=True)
    n.rois, n.labels, n.bbox_targets, n.bbox_inside_weights, n.bbox_outside_weights = L.Python(
        rpn_rois, n.gt_boxes, name="roi-data", ntop=5,
        python_param=dict(module="rpn.proposal_target_layer", layer="ProposalTargetLayer",
                          param_str=f"'num_classes': {num_classes}"))
    _head(n, n.rois, feat, num_classes, fc)
    n.loss_cls = L.SoftmaxWithLoss(n.cls_score, n.labels, propagate_down=[True, False], loss_weight=1)
    n.loss_bbox = L.SmoothL1Loss(n.bbox_pred, n.bbox_targets, n.bbox_inside_weights, n.bbox_outside_weights,
                                 loss_weight=1)
    proto = n.to_proto()
    proto.name = "faster_rcnn_small_train"
    return proto


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE), help="folder for deploy.prototxt and train.prototxt")
    parser.add_argument("--classes", type=int, default=21)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "deploy.prototxt").write_text(str(deploy_net(args.classes)))
    (out / "train.prototxt").write_text(str(train_net(args.classes)))
    print(f"wrote {out / 'deploy.prototxt'} and {out / 'train.prototxt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
