"""Semantic segmentation with a small DeepLab / PSPNet-style net built by net_spec: a strided trunk
with PSPNet's ``BN`` (frozen statistics) and dilated convolutions, a 1x1 classifier at 1/8 of the
input size, the ``Interp`` layer back to the input size (aligned-corner bilinear, as DeepLab v2 and
PSPNet upsample their scores), and an ``ArgMax`` over the classes. Writes the label map as a
palette PNG (one colour per class) of the input picture's size.

    python examples/segmentation/segment.py [--image IMG] [--out labels.png] [--gpu N]
                                            [--weights W.caffemodel] [--classes 21] [--size 224]

Without ``--weights`` the weights are random (seeded), so the map shows that the net runs, not
what is in the picture. ``--prototxt FILE`` writes the deploy net instead of running it.
``--arch segnet`` builds a SegNet-style encoder-decoder instead (pooling masks, SegNet's ``BN`` in
INFERENCE mode, ``Upsample`` with the mask as second bottom).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import pycaffe_lite as caffe
from pycaffe_lite import layers as L
from pycaffe_lite import params as P


def _conv_bn_relu(n, name, bottom, num, kernel=3, stride=1, dilation=1):
    pad = dilation * (kernel // 2)
    n[name] = L.Convolution(bottom, num_output=num, kernel_size=kernel, stride=stride, pad=pad, dilation=dilation,
                            bias_term=False, weight_filler=dict(type="msra"))
    n[name + "/bn"] = L.BN(n[name], in_place=True, slope_filler=dict(type="constant", value=1),
                           bias_filler=dict(type="constant", value=0), frozen=True, momentum=0.95)
    n[name + "/relu"] = L.ReLU(n[name], in_place=True)
    return n[name]


def deploy_net(num_classes: int = 21, size: tuple[int, int] = (224, 224), width: int = 16):
    """Input ``data`` (1, 3, H, W); outputs ``prob`` (1, K, H, W) and ``label`` (1, 1, H, W)."""
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, *size]))
    x = _conv_bn_relu(n, "conv1", n.data, width, stride=2)
    n.pool1 = L.Pooling(x, pool=P.Pooling.MAX, kernel_size=3, stride=2, pad=1)
    x = _conv_bn_relu(n, "conv2", n.pool1, 2 * width, stride=2)
    x = _conv_bn_relu(n, "conv3", x, 2 * width, dilation=2)
    x = _conv_bn_relu(n, "conv4", x, 4 * width, dilation=4)
    n.score = L.Convolution(x, num_output=num_classes, kernel_size=1, weight_filler=dict(type="gaussian", std=0.1),
                            bias_filler=dict(type="constant", value=0))
    n.score_interp = L.Interp(n.score, height=size[0], width=size[1])
    n.prob = L.Softmax(n.score_interp)
    n.label = L.ArgMax(n.prob, axis=1)
    proto = n.to_proto()
    proto.name = "segmentation_small_deploy"
    return proto


def segnet_net(num_classes: int = 12, size: tuple[int, int] = (96, 128), width: int = 16):
    """A SegNet-style encoder-decoder: MAX pooling with its mask top, SegNet's ``BN``
    (``bn_mode: INFERENCE``: scale and shift) and ``Upsample`` with the mask as second bottom
    (``scale: 2``, or ``upsample_h``/``upsample_w`` where the pooled size was odd)."""
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, *size]))
    x, hw, skips = n.data, list(size), []
    for i, ch in enumerate((width, 2 * width, 4 * width), 1):
        n[f"conv{i}"] = L.Convolution(x, num_output=ch, kernel_size=3, pad=1, weight_filler=dict(type="msra"))
        n[f"conv{i}_bn"] = L.BN(n[f"conv{i}"], in_place=True, bn_mode=P.BN.INFERENCE,
                                scale_filler=dict(type="constant", value=1.0),
                                shift_filler=dict(type="constant", value=0.001))
        n[f"relu{i}"] = L.ReLU(n[f"conv{i}"], in_place=True)
        n[f"pool{i}"], n[f"pool{i}_mask"] = L.Pooling(n[f"conv{i}"], pool=P.Pooling.MAX, kernel_size=2, stride=2,
                                                      ntop=2)
        skips.append((f"pool{i}_mask", tuple(hw)))
        hw = [-(-d // 2) for d in hw]
        x = n[f"pool{i}"]
    for i, ch in zip((3, 2, 1), (2 * width, width, width)):
        mask, (h, w) = skips[i - 1]
        up = dict(scale=2) if h % 2 == 0 and w % 2 == 0 else dict(upsample_h=h, upsample_w=w)
        n[f"upsample{i}"] = L.Upsample(x, n[mask], **up)
        n[f"conv{i}_D"] = L.Convolution(n[f"upsample{i}"], num_output=ch, kernel_size=3, pad=1,
                                        weight_filler=dict(type="msra"))
        n[f"relu{i}_D"] = L.ReLU(n[f"conv{i}_D"], in_place=True)
        x = n[f"conv{i}_D"]
    n.score = L.Convolution(x, num_output=num_classes, kernel_size=1, weight_filler=dict(type="msra"))
    n.prob = L.Softmax(n.score)
    n.label = L.ArgMax(n.prob, axis=1)
    proto = n.to_proto()
    proto.name = "segnet_small_deploy"
    return proto


def palette(num_classes: int) -> np.ndarray:
    """PASCAL VOC's colour scheme: class bits spread over the high bits of R, G and B."""
    pal = np.zeros((256, 3), np.uint8)
    for c in range(256):
        v, r, g, b = c, 0, 0, 0
        for shift in range(7, -1, -1):
            r |= ((v >> 0) & 1) << shift
            g |= ((v >> 1) & 1) << shift
            b |= ((v >> 2) & 1) << shift
            v >>= 3
        pal[c] = (r, g, b)
    return pal


def segment(net, image_rgb: np.ndarray) -> np.ndarray:
    """Label map (H, W) of an RGB float image in [0, 1], at the image's size."""
    h, w = net.blobs["data"].shape[2:]
    im = caffe.io.resize(image_rgb, h, w) * 255.0 - np.array([123.68, 116.78, 103.94])  # RGB means
    data = im[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32)  # BGR, as Caffe nets expect
    out = net.forward(data=data)
    label = out["label"][0, 0]
    # Back to the picture's size by nearest neighbour (labels are not interpolated).
    rows = (np.arange(image_rgb.shape[0]) * h // image_rgb.shape[0]).astype(int)
    cols = (np.arange(image_rgb.shape[1]) * w // image_rgb.shape[1]).astype(int)
    return label[rows][:, cols].astype(np.uint8)


def synthetic_image(h=180, w=240) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    im = np.stack([xx / w, yy / h, 0.5 + 0.5 * np.sin(xx / 9.0) * np.cos(yy / 13.0)], axis=2)
    return im.astype(np.float32)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="an image file (default: a synthetic picture)")
    parser.add_argument("--out", default="labels.png")
    parser.add_argument("--weights")
    parser.add_argument("--classes", type=int, default=21)
    parser.add_argument("--size", type=int, default=224, help="network input side")
    parser.add_argument("--gpu", type=int, default=-1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--prototxt", help="write the deploy net here and exit")
    parser.add_argument("--arch", choices=("deeplab", "segnet"), default="deeplab",
                        help="deeplab: BN + dilated convolutions + Interp; segnet: pooling masks + Upsample")
    args = parser.parse_args(argv)
    build = deploy_net if args.arch == "deeplab" else segnet_net
    proto = build(args.classes, (args.size, args.size))
    if args.prototxt:
        Path(args.prototxt).write_text(str(proto))
        print(f"wrote {args.prototxt}")
        return 0
    if args.gpu >= 0:
        caffe.set_mode_gpu()
        caffe.set_device(args.gpu)
    caffe.set_random_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deploy.prototxt"
        path.write_text(str(proto))
        net = caffe.Net(str(path), caffe.TEST, weights=args.weights)
    image = caffe.io.load_image(args.image) if args.image else synthetic_image()
    labels = segment(net, image)
    from PIL import Image

    out = Image.fromarray(labels, mode="P")
    out.putpalette(palette(args.classes).ravel().tolist())
    out.save(args.out)
    found = np.bincount(labels.ravel(), minlength=args.classes)
    print(f"label map {labels.shape[1]}x{labels.shape[0]}: classes present "
          + ", ".join(f"{c} ({k} px)" for c, k in enumerate(found) if k))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
