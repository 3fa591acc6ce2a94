"""NMS with the pairwise suppression mask computed on the GPU (nms.cu), scanned on the host.

Boxes are sorted by score on the host, sent once, and one kernel writes for every box i a bit per
later box j (32 per word) telling whether IoU(i, j) exceeds the threshold; one copy brings the mask
back and a greedy scan over it picks the kept boxes (the CPU result, bit for bit, in float64).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .cpu_nms import score_order

KERNELS = Path(__file__).with_name("nms.cu")
BITS = 32


def gpu_nms(boxes, scores, threshold: float) -> np.ndarray:
    from pycaffe_lite.gpu import backend

    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    n = boxes.shape[0]
    if n == 0:
        return np.zeros(0, np.int64)
    order = score_order(scores)
    sorted_boxes = np.ascontiguousarray(boxes[order])
    words = -(-n // BITS)
    dev_boxes = backend.alloc(sorted_boxes.nbytes)
    dev_mask = backend.alloc(n * words * 4)
    backend.memcpy_htod(int(dev_boxes), sorted_boxes)
    k = backend.kernel(KERNELS, "nms_mask", np.float64)
    k(n * words, n, words, float(threshold), int(dev_boxes), int(dev_mask))
    mask = np.empty((n, words), np.uint32)
    backend.memcpy_dtoh(mask, int(dev_mask))
    removed = np.zeros(words, np.uint32)
    keep = []
    for i in range(n):
        if not (removed[i // BITS] >> np.uint32(i % BITS)) & np.uint32(1):
            keep.append(i)
            removed |= mask[i]
    return order[np.array(keep, dtype=np.int64)]
