"""Non-maximum suppression for the Faster R-CNN example, with no Cython or CUDA build step.

``nms(boxes, scores, threshold)``: boxes (N, 4) as x1, y1, x2, y2 in pixels (a box is x2 - x1 + 1
wide, Fast R-CNN's convention), scores (N,), returns the kept indices in descending score order
(ties in index order). A box is dropped when its IoU with a kept, higher-scored box exceeds
``threshold``. :func:`cpu_nms` is numpy; :func:`gpu_nms` computes the pairwise suppression bitmask on
the GPU through pycaffe_lite's backend and scans it on the host; both give the same indices.
"""

from .cpu_nms import cpu_nms
from .gpu_nms import gpu_nms

__all__ = ["cpu_nms", "gpu_nms", "nms"]


def nms(boxes, scores, threshold, force_cpu=False):
    """GPU NMS when pycaffe_lite is in GPU mode (and ``force_cpu`` is false), else CPU NMS."""
    import pycaffe_lite as caffe

    if not force_cpu and caffe.common.mode() is caffe.common.Mode.GPU:
        return gpu_nms(boxes, scores, threshold)
    return cpu_nms(boxes, scores, threshold)
