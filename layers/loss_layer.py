"""LossLayer: what every loss shares (Caffe's LossLayer); each loss keeps only its own math.

- Loss weight: ``is_loss``, so ``top[0]`` gets loss_weight 1 unless the prototxt says otherwise; the
  top is a scalar (shape ``()``) and gradients are scaled by ``top[0].diff`` (the weight).
- Normalization (``loss_param``): FULL (outer·inner items), VALID (the non-ignored items),
  BATCH_SIZE (outer), NONE (1); the normalizer is at least 1. Precedence as in Caffe:
  ``normalization`` if set, else the legacy ``normalize`` (true: VALID, false: BATCH_SIZE), else
  the layer's ``default_normalization``. Losses with ``default_normalization = None`` ignore
  loss_param's normalization fields and divide by the batch size (Euclidean, Hinge, ...).
- Labels: bottoms in ``label_bottoms`` never take a gradient (``allow_force_backward`` is False, and
  ``backward`` raises if ``propagate_down`` asks for one). ``ignore_label`` is read for the losses
  that honour it (``uses_ignore_label``). On the CPU, :meth:`class_labels` truncates labels to int
  and raises on a label outside ``[0, self.classes)``.
- GPU: per-item losses are summed on the device and divided by a normalizer also computed there
  (the valid count for VALID with an ignore label), written into ``top[0]`` with no host read, so
  forward passes can be captured as CUDA graphs. Kernels that read class labels set a bad-label flag
  in device memory (:meth:`gpu_status`) and write NaN losses; :meth:`explain_nonfinite_loss`, which the
  loss read after the pass calls when the loss is NaN, raises naming the label when that flag is set.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.blob import Blob, math_dtype
from pycaffe_lite.errors import ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer
from pycaffe_lite.schema import caffe_pb2

KERNELS = Path(__file__).with_suffix(".cu")
REDUCE_THREADS = 256  # must match LOSS_REDUCE_THREADS in loss_layer.cuh
MAX_PARTIALS = 1024  # blocks of the first reduction stage (the second stage is one block)
Norm = caffe_pb2.LossParameter
LOG_THRESHOLD = float(np.float32(1e-20))  # Caffe's kLOG_THRESHOLD, a float for both dtypes


def reduce_blocks(n: int) -> int:
    """Blocks of a first-stage reduction over ``n`` items (one partial sum each)."""
    return max(1, min(MAX_PARTIALS, -(-n // REDUCE_THREADS)))


class LossLayer(Layer):
    """Base of the loss layers. Subclasses set ``self.outer``/``self.inner`` (normalizer sizes) and,
    when they read class labels, ``self.classes`` in ``reshape`` after calling ``super().reshape``."""

    exact_num_bottom_blobs: ClassVar[int | None] = 2
    exact_num_top_blobs: ClassVar[int | None] = 1
    is_loss = True
    auto_top_blobs = True  # Caffe's LossLayer: a missing top is created
    label_bottoms: ClassVar[tuple[int, ...]] = (1,)  # bottoms that never take a gradient
    default_normalization: ClassVar[int | None] = None  # None: always BATCH_SIZE, loss_param ignored
    accepts_normalize: ClassVar[bool] = True  # the legacy ``normalize`` (InfogainLoss rejects it)
    uses_ignore_label: ClassVar[bool] = False

    def layer_setup(self, bottom, top):
        lp = self.layer_param.loss_param
        self.has_ignore_label = self.uses_ignore_label and lp.HasField("ignore_label")
        self.ignore_label = int(lp.ignore_label)
        if self.default_normalization is None:
            self.normalization = Norm.BATCH_SIZE
        elif lp.HasField("normalize") and not self.accepts_normalize:
            raise self.error('loss_param.normalize is deprecated: use "normalization"')
        elif lp.HasField("normalization"):
            self.normalization = lp.normalization
        elif lp.HasField("normalize"):
            self.normalization = Norm.VALID if lp.normalize else Norm.BATCH_SIZE
        else:
            self.normalization = self.default_normalization
        self.classes = 0
        self._status = Blob((3,), self.dtype)  # GPU: [normalizer, bad-label flag, a bad label]

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index not in self.label_bottoms

    def reshape(self, bottom, top):
        """Caffe's LossLayer::Reshape: bottoms 0 and 1 share their first dimension; top[0] is ()."""
        a, b = bottom[0], bottom[1]
        if a.num_axes == 0 or b.num_axes == 0 or a.shape[0] != b.shape[0]:
            raise self.error(
                f"bottom 0 and bottom 1 should have the same first "
                f"dimension, got {a.shape} and {b.shape}", ShapeError
            )
        top[0].reshape(())
        self.outer, self.inner = a.shape[0], a.count // max(a.shape[0], 1)

    def backward(self, top: Sequence[Blob], propagate_down: Sequence[bool], bottom: Sequence[Blob]) -> None:
        for i in self.label_bottoms:
            if i < len(propagate_down) and propagate_down[i]:
                raise self.error(f"cannot backpropagate to label inputs (bottom {i})")
        super().backward(top, propagate_down, bottom)

    # -- normalization ----------------------------------------------------------------------
    def normalizer(self, valid_count: int = -1) -> float:
        """Caffe's get_normalizer: the divisor of the summed loss (at least 1); VALID with
        ``valid_count`` -1 counts every item."""
        mode = self.normalization
        if mode == Norm.FULL or (mode == Norm.VALID and valid_count == -1):
            n = self.outer * self.inner
        elif mode == Norm.VALID:
            n = valid_count
        elif mode == Norm.BATCH_SIZE:
            n = self.outer
        elif mode == Norm.NONE:
            n = 1
        else:
            raise self.error(f"unknown normalization mode {mode}")
        return max(1.0, float(n))

    def grad_scale(self, top: Sequence[Blob], valid_count: int = -1) -> float:
        """CPU gradient factor: the loss weight (``top[0].diff``) over the normalizer."""
        return float(top[0].cpu_diff()) / self.normalizer(valid_count)

    # -- labels (CPU) -----------------------------------------------------------------------
    def class_labels(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Labels truncated to int (0 where ignored) and the mask of items that count; raises on a
        counted label outside ``[0, self.classes)`` or one that is not a number (NaN, infinite)."""
        finite = np.isfinite(labels)
        if not finite.all():
            raise self.error(f"label {labels[~finite].ravel()[0]} is not a number: labels must be class indices "
                             f"in [0, {self.classes})")
        ints = labels.astype(np.int64)
        valid = ints != self.ignore_label if self.has_ignore_label else np.ones(ints.shape, bool)
        bad = valid & ((ints < 0) | (ints >= self.classes))
        if bad.any():
            raise self._bad_label(int(ints[bad][0]))
        return np.where(valid, ints, 0), valid

    def _bad_label(self, label: int) -> Exception:
        return self.error(f"label {label} out of range: labels must lie in [0, {self.classes})")

    # -- GPU ---------------------------------------------------------------------------------
    def gpu_status(self) -> int:
        """This pass's device status, zeroed: ``[normalizer, bad-label flag, a bad label]``. Label
        kernels set ``[1] = 1, [2] = label`` on a label outside ``[0, classes)``."""
        ptr = self._status.mutable_gpu_data()
        backend.memset_zero(ptr, 3 * self.dtype.itemsize)
        return ptr

    def gpu_norm(self) -> int:
        """Device pointer to the normalizer of the last forward (for the backward kernels)."""
        return self._status.gpu_data()

    def gpu_reduce(self, n: int, loss: int, top: Sequence[Blob], valid: int | None = None,
                   scale: float = 1.0) -> None:
        """``top[0] = scale · Σ loss[:n] / normalizer`` on the device; ``valid`` (0/1 per item, or None
        when every item counts) gives the VALID count. Also stores the normalizer for backward."""
        blocks = reduce_blocks(n)
        (partials,) = backend.workspace(2 * blocks * math_dtype(self.dtype).itemsize, slot="reduce")  # Mtype sums
        backend.kernel(KERNELS, "loss_partials", self.dtype)(
            n, loss, loss if valid is None else valid, int(valid is not None), partials,
            grid=blocks, block=REDUCE_THREADS,
        )
        self.gpu_finish(blocks, partials, top, counted=valid is not None, scale=scale)

    def gpu_finish(self, blocks: int, partials: int, top: Sequence[Blob], counted: bool = False,
                   scale: float = 1.0) -> None:
        """Second stage: ``partials`` holds ``blocks`` loss sums then (when ``counted``) ``blocks``
        valid counts; writes ``top[0]`` and the normalizer."""
        use_valid = counted and self.normalization == Norm.VALID
        backend.kernel(KERNELS, "loss_finish", self.dtype)(
            blocks, partials, int(use_valid), self.normalizer(), scale, top[0].mutable_gpu_data(),
            self._status.mutable_gpu_data(), grid=1, block=REDUCE_THREADS,
        )

    def explain_nonfinite_loss(self) -> None:
        """On the GPU a pass that met a bad label flagged it in the status blob and wrote a NaN
        loss: raise the CPU path's error, at the first host read after the pass."""
        if common.mode() is common.Mode.GPU and self.classes:
            status = self._status.cpu_data()
            if status[1]:
                if not np.isfinite(status[2]):
                    raise self.error(f"label {status[2]} is not a number: labels must be class indices "
                                     f"in [0, {self.classes})")
                raise self._bad_label(int(status[2]))
