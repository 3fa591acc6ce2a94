"""SSD deploy (and training) nets written with pycaffe-lite's net_spec, in the SSD fork's layout.

``ssd300_vgg16()``: VGG-16 through conv5_3, pool5 3x3/1, fc6 as a 3x3 convolution of dilation 6,
fc7 1x1, four extra blocks (conv6..conv9), six source maps (conv4_3 after an L2 Normalize with
scale 20, fc7, conv6_2, conv7_2, conv8_2, conv9_2) each with a 3x3 location head, a 3x3
confidence head and a PriorBox; heads are permuted to NHWC, flattened and concatenated; the
deploy net ends in Reshape -> Softmax over classes -> Flatten -> DetectionOutput.

``ssdlite_mobilenet()``: MobileNet v1 (depthwise-separable blocks, batch norm folded into the
convolutions as deploy nets ship them) with sources at the stride-16 and stride-32 maps and four
extra blocks, SSDLite heads (a 3x3 depthwise convolution, then a 1x1 one).

``width`` scales every channel count (tests use small widths so a forward takes milliseconds);
``train=True`` reads an AnnotatedData LMDB (``source``) and replaces the deploy tail with MultiBoxLoss
over its ``label`` top; ``evaluate=True`` (with ``train=True``) keeps the detection tail and adds
DetectionEvaluate, the fork's test net for ``eval_type: "detection"``.

    python examples/ssd/ssd_nets.py --out examples/ssd   # writes both deploy prototxts
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from pycaffe_lite import layers as L
from pycaffe_lite import params as P
from pycaffe_lite.net_spec import NetSpec
from pycaffe_lite.schema import caffe_pb2

MSRA = dict(type="msra")
ZERO = dict(type="constant", value=0)


def _ch(c: int, width: float) -> int:
    return max(1, int(round(c * width)))


def _conv(bottom, num_output, kernel, stride=1, pad=None, dilation=1, group=1, relu=True):
    pad = (kernel // 2) * dilation if pad is None else pad
    kw = dict(num_output=num_output, kernel_size=kernel, stride=stride, pad=pad, weight_filler=MSRA,
              bias_filler=ZERO)
    if dilation > 1:
        kw["dilation"] = dilation
    if group > 1:
        kw["group"] = group
    conv = L.Convolution(bottom, **kw)
    return conv, (L.ReLU(conv, in_place=True) if relu else None)


def scales(num_maps: int, min_ratio: int, max_ratio: int, image: int, first: float) -> tuple[list, list]:
    """min/max prior sizes in pixels: the SSD paper's linear schedule between min_ratio and
    max_ratio percent of the image, with a smaller first map (``first`` of the image)."""
    step = int(math.floor((max_ratio - min_ratio) / (num_maps - 2)))
    mins, maxs = [image * first], [image * min_ratio / 100.0]
    for ratio in range(min_ratio, max_ratio + 1, step):
        mins.append(image * ratio / 100.0)
        maxs.append(image * (ratio + step) / 100.0)
    return mins[:num_maps], maxs[:num_maps]


def _heads(n: NetSpec, sources, num_classes, image, mins, maxs, ratios, steps, width, lite):
    locs, confs, priors = [], [], []
    for k, (name, blob, channels) in enumerate(sources):
        num_priors = 2 + 2 * len(ratios[k])  # min square, sqrt(min*max) square, each ratio flipped
        for kind, per in (("loc", 4), ("conf", num_classes)):
            out = num_priors * per
            if lite:
                dw, _ = _conv(blob, channels, 3, group=channels)
                setattr(n, f"{name}_mbox_{kind}_dw", dw)
                head, _ = _conv(dw, out, 1, relu=False)
            else:
                head, _ = _conv(blob, out, 3, relu=False)
            setattr(n, f"{name}_mbox_{kind}", head)
            perm = L.Permute(head, order=[0, 2, 3, 1])
            setattr(n, f"{name}_mbox_{kind}_perm", perm)
            flat = L.Flatten(perm, axis=1)
            setattr(n, f"{name}_mbox_{kind}_flat", flat)
            (locs if kind == "loc" else confs).append(flat)
        step = dict(step=steps[k]) if steps else {}  # else: image size / feature map size
        prior = L.PriorBox(blob, n.data, min_size=mins[k], max_size=maxs[k], aspect_ratio=ratios[k], flip=True,
                           clip=False, variance=[0.1, 0.1, 0.2, 0.2], offset=0.5, **step)
        setattr(n, f"{name}_mbox_priorbox", prior)
        priors.append(prior)
    n.mbox_loc = L.Concat(*locs, axis=1)
    n.mbox_conf = L.Concat(*confs, axis=1)
    n.mbox_priorbox = L.Concat(*priors, axis=2)


def _tail(n: NetSpec, num_classes: int, train: bool, evaluate: bool = False) -> None:
    if train and not evaluate:
        n.mbox_loss = L.MultiBoxLoss(
            n.mbox_loc, n.mbox_conf, n.mbox_priorbox, n.label,
            multibox_loss_param=dict(loc_loss_type=P.MultiBoxLoss.SMOOTH_L1, conf_loss_type=P.MultiBoxLoss.SOFTMAX,
                                     loc_weight=1.0, num_classes=num_classes, share_location=True,
                                     match_type=P.MultiBoxLoss.PER_PREDICTION, overlap_threshold=0.5,
                                     use_prior_for_matching=True, background_label_id=0, use_difficult_gt=True,
                                     neg_pos_ratio=3.0, neg_overlap=0.5, code_type=P.PriorBox.CENTER_SIZE,
                                     mining_type=P.MultiBoxLoss.MAX_NEGATIVE),
            loss_param=dict(normalization=P.Loss.VALID), propagate_down=[True, True, False, False])
        return
    n.mbox_conf_reshape = L.Reshape(n.mbox_conf, shape=dict(dim=[0, -1, num_classes]))
    n.mbox_conf_softmax = L.Softmax(n.mbox_conf_reshape, axis=2)
    n.mbox_conf_flatten = L.Flatten(n.mbox_conf_softmax, axis=1)
    n.detection_out = L.DetectionOutput(
        n.mbox_loc, n.mbox_conf_flatten, n.mbox_priorbox,
        detection_output_param=dict(num_classes=num_classes, share_location=True, background_label_id=0,
                                    nms_param=dict(nms_threshold=0.45, top_k=400), code_type=P.PriorBox.CENTER_SIZE,
                                    keep_top_k=200, confidence_threshold=0.01))
    if evaluate:
        n.detection_eval = L.DetectionEvaluate(n.detection_out, n.label, detection_evaluate_param=dict(
            num_classes=num_classes, background_label_id=0, overlap_threshold=0.5, evaluate_difficult_gt=False))


def _input(n: NetSpec, size: int, train: bool, batch: int, source: str | None,
           mean=(104, 117, 123), scale: float = 1.0) -> None:
    if train:
        n.data, n.label = L.AnnotatedData(
            ntop=2, data_param=dict(source=source or "train_lmdb", batch_size=batch, backend=P.Data.LMDB),
            transform_param=dict(mean_value=list(mean), scale=scale,
                                 resize_param=dict(prob=1, resize_mode=caffe_pb2.ResizeParameter.WARP, height=size,
                                                   width=size, interp_mode=[caffe_pb2.ResizeParameter.LINEAR]),
                                 emit_constraint=dict(emit_type=caffe_pb2.EmitConstraint.CENTER)),
            annotated_data_param=dict(batch_sampler=[dict(max_sample=1, max_trials=1)]))
    else:
        n.data = L.Input(shape=dict(dim=[batch, 3, size, size]))


def ssd300_vgg16(num_classes: int = 21, size: int = 300, width: float = 1.0, train: bool = False,
                 batch: int = 1, source: str | None = None, evaluate: bool = False) -> caffe_pb2.NetParameter:
    n = NetSpec()
    _input(n, size, train, batch, source)
    x = n.data
    for block, (reps, ch) in enumerate([(2, 64), (2, 128), (3, 256), (3, 512), (3, 512)], start=1):
        for r in range(1, reps + 1):
            conv, relu = _conv(x, _ch(ch, width), 3)
            setattr(n, f"conv{block}_{r}", conv)
            setattr(n, f"relu{block}_{r}", relu)
            x = relu
        if block == 4:
            conv4_3 = x
        if block < 5:
            x = L.Pooling(x, pool=P.Pooling.MAX, kernel_size=2, stride=2)
        else:
            x = L.Pooling(x, pool=P.Pooling.MAX, kernel_size=3, stride=1, pad=1)
        setattr(n, f"pool{block}", x)
    n.fc6, n.relu6 = _conv(x, _ch(1024, width), 3, dilation=6)
    n.fc7, n.relu7 = _conv(n.relu6, _ch(1024, width), 1)
    n.conv4_3_norm = L.Normalize(conv4_3, norm_param=dict(across_spatial=False, channel_shared=False,
                                                          scale_filler=dict(type="constant", value=20)))
    sources = [("conv4_3_norm", n.conv4_3_norm, _ch(512, width)), ("fc7", n.relu7, _ch(1024, width))]
    x = n.relu7
    for k, (mid, out, stride, pad) in enumerate([(256, 512, 2, 1), (128, 256, 2, 1), (128, 256, 1, 0),
                                                 (128, 256, 1, 0)], start=6):
        c1, r1 = _conv(x, _ch(mid, width), 1)
        setattr(n, f"conv{k}_1", c1)
        setattr(n, f"conv{k}_1_relu", r1)
        c2, r2 = _conv(r1, _ch(out, width), 3, stride=stride, pad=pad)
        setattr(n, f"conv{k}_2", c2)
        setattr(n, f"conv{k}_2_relu", r2)
        sources.append((f"conv{k}_2", r2, _ch(out, width)))
        x = r2
    mins, maxs = scales(6, 20, 90, size, 0.10)
    ratios = [[2], [2, 3], [2, 3], [2, 3], [2], [2]]
    steps = [8, 16, 32, 64, 100, 300] if size == 300 else None
    _heads(n, sources, num_classes, size, mins, maxs, ratios, steps, width, lite=False)
    _tail(n, num_classes, train, evaluate)
    net = n.to_proto()
    net.name = "SSD_300x300_VGG16" + ("_test" if evaluate else "_train" if train else "_deploy")
    return net


def ssdlite_mobilenet(num_classes: int = 21, size: int = 300, width: float = 1.0, train: bool = False,
                      batch: int = 1, source: str | None = None, evaluate: bool = False) -> caffe_pb2.NetParameter:
    n = NetSpec()
    _input(n, size, train, batch, source, mean=(127.5, 127.5, 127.5), scale=0.007843)  # MobileNet's input range
    n.conv0, n.conv0_relu = _conv(n.data, _ch(32, width), 3, stride=2)
    x, ch = n.conv0_relu, _ch(32, width)
    plan = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1), (512, 1),
            (512, 1), (1024, 2), (1024, 1)]
    sources = []
    for k, (out, stride) in enumerate(plan, start=1):
        dw, dw_relu = _conv(x, ch, 3, stride=stride, group=ch)
        setattr(n, f"conv{k}_dw", dw)
        setattr(n, f"conv{k}_dw_relu", dw_relu)
        pw, pw_relu = _conv(dw_relu, _ch(out, width), 1)
        setattr(n, f"conv{k}", pw)
        setattr(n, f"conv{k}_relu", pw_relu)
        x, ch = pw_relu, _ch(out, width)
        if k in (11, 13):
            sources.append((f"conv{k}", x, ch))
    for k, (mid, out) in enumerate([(256, 512), (128, 256), (128, 256), (64, 128)], start=14):
        c1, r1 = _conv(x, _ch(mid, width), 1)
        setattr(n, f"conv{k}_1", c1)
        setattr(n, f"conv{k}_1_relu", r1)
        dw, dw_relu = _conv(r1, _ch(mid, width), 3, stride=2, group=_ch(mid, width))
        setattr(n, f"conv{k}_2_dw", dw)
        setattr(n, f"conv{k}_2_dw_relu", dw_relu)
        c2, r2 = _conv(dw_relu, _ch(out, width), 1)
        setattr(n, f"conv{k}_2", c2)
        setattr(n, f"conv{k}_2_relu", r2)
        x, ch = r2, _ch(out, width)
        sources.append((f"conv{k}_2", x, ch))
    mins, maxs = scales(6, 20, 95, size, 0.10)
    ratios = [[2], [2, 3], [2, 3], [2, 3], [2, 3], [2, 3]]
    steps = [16, 32, 64, 100, 150, 300] if size == 300 else None
    _heads(n, sources, num_classes, size, mins, maxs, ratios, steps, width, lite=True)
    _tail(n, num_classes, train, evaluate)
    net = n.to_proto()
    net.name = "SSDLite_MobileNet" + ("_test" if evaluate else "_train" if train else "_deploy")
    return net


NETS = {"ssd300": ssd300_vgg16, "ssdlite": ssdlite_mobilenet}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write the SSD deploy prototxts built by this module.")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    ap.add_argument("--num-classes", type=int, default=21)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, fn in NETS.items():
        path = args.out / f"{name}_deploy.prototxt"
        path.write_text(str(fn(args.num_classes)))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
