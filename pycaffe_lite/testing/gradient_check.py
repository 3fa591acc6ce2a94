"""Numeric gradient checking for layers, in the style of Caffe's GradientChecker.

The objective is ``L = sum_k <top_k, W_k>`` with fixed random weights ``W_k``: the analytic
gradient comes from one backward pass with ``top_k.diff = W_k``; the numeric one from central
differences of ``L`` around every bottom and param element. An element passes when
``|analytic - numeric| <= threshold * max(|analytic|, |numeric|, 1)``. Elements whose input lies
within ``kink_range`` of ``kink`` (e.g. ReLU at 0) are skipped, as Caffe does. Use float64 layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from .. import common
from ..blob import Blob
from ..layer import Layer


class GradientCheckError(AssertionError):
    """Analytic and numeric gradients disagree."""


class GradientChecker:
    def __init__(
        self,
        stepsize: float = 1e-3,
        threshold: float = 1e-4,
        seed: int = 1701,
        kink: float = 0.0,
        kink_range: float = -1.0,
    ) -> None:
        self.stepsize = stepsize
        self.threshold = threshold
        self.seed = seed
        self.kink = kink
        self.kink_range = kink_range

    def _objective(self, layer: Layer, bottom, top, weights) -> float:
        common.set_random_seed(self.seed)  # layers with randomness repeat their draws
        layer.forward(bottom, top)
        return float(sum(np.vdot(t.cpu_data().astype(np.float64), w) for t, w in zip(top, weights)))

    def check(
        self,
        layer: Layer,
        bottom: Sequence[Blob],
        top: Sequence[Blob],
        check_bottom: Sequence[int] | None = None,
        check_params: bool = True,
        top_filter: Callable[[int], bool] | None = None,
    ) -> int:
        """Set up ``layer`` on the blobs and compare gradients; returns the elements checked.

        ``check_bottom``: bottom indices to check (default all). ``top_filter(k)``: which tops enter
        the objective (default all). Raises GradientCheckError with the first mismatches.
        """
        layer.setup(bottom, top)
        common.set_random_seed(self.seed)
        layer.forward(bottom, top)
        rng = np.random.default_rng(self.seed)
        weights = []
        for k, t in enumerate(top):
            use = top_filter(k) if top_filter is not None else True
            weights.append(rng.uniform(-1, 1, t.shape) if use else np.zeros(t.shape))
        check_bottom = list(range(len(bottom))) if check_bottom is None else list(check_bottom)

        # analytic
        for p in layer.blobs:
            p.mutable_cpu_diff()[...] = 0
        common.set_random_seed(self.seed)
        layer.forward(bottom, top)
        for t, w in zip(top, weights):
            t.mutable_cpu_diff()[...] = w
        propagate = [i in check_bottom for i in range(len(bottom))]
        layer.backward(top, propagate, bottom)
        targets: list[tuple[str, Blob, np.ndarray]] = []
        for i in check_bottom:
            targets.append((f"bottom {i}", bottom[i], bottom[i].cpu_diff().astype(np.float64).copy()))
        if check_params:
            for j, p in enumerate(layer.blobs):
                if j < len(layer.param_propagate_down) and not layer.param_propagate_down[j]:
                    continue
                targets.append((f"param {j}", p, p.cpu_diff().astype(np.float64).copy()))

        failures = []
        checked = 0
        for label, blob, analytic in targets:
            flat_analytic = analytic.ravel()
            for idx in range(blob.count):
                value = float(blob.cpu_data().ravel()[idx])
                if self.kink_range >= 0 and abs(value - self.kink) <= self.kink_range:
                    continue
                data = blob.mutable_cpu_data().reshape(-1)
                data[idx] = value + self.stepsize
                plus = self._objective(layer, bottom, top, weights)
                data = blob.mutable_cpu_data().reshape(-1)
                data[idx] = value - self.stepsize
                minus = self._objective(layer, bottom, top, weights)
                blob.mutable_cpu_data().reshape(-1)[idx] = value
                numeric = (plus - minus) / (2 * self.stepsize)
                computed = flat_analytic[idx]
                scale = max(abs(computed), abs(numeric), 1.0)
                checked += 1
                if abs(computed - numeric) > self.threshold * scale:
                    failures.append(f"{label}[{idx}]: analytic {computed:.6g} vs numeric {numeric:.6g}")
        if failures:
            shown = "; ".join(failures[:8])
            raise GradientCheckError(
                f"{layer!r}: {len(failures)} of {checked} gradient elements disagree: {shown}"
            )
        return checked


# -- half storage against a float64 reference (docs/precision.md) -----------------------------------
#: Unit roundoff (half an ulp at 1) of each storage type.
UNIT_ROUNDOFF = {np.dtype(np.float16): 2.0 ** -11, np.dtype(np.uint16): 2.0 ** -8, np.dtype(np.float32): 2.0 ** -24}


class HalfReferenceCheck:
    """A layer stored in float16 or bfloat16 (``storage``: ``caffe_pb2.FLOAT16`` / ``BFLOAT16``)
    against the same layer in float64, on the same values: inputs, params and top gradients
    representable in the half type, so the two differ only by what half storage does (the
    rounding of the half layer's outputs and of values it stores between passes) and by float32
    math. Compared: tops, bottom diffs and param diffs, each within ``factor · u · max|reference|``
    (u: the format's unit roundoff; a norm-wise bound, as one rounding per stored value gives u
    relative to each value). The float64 layer is first checked numerically by
    :class:`GradientChecker` (``reference_check``), so the reference is right."""

    def __init__(self, factor: float = 2.0, seed: int = 1701, reference_check: GradientChecker | None = None) -> None:
        self.factor, self.seed = factor, seed
        self.reference_check = reference_check

    def check(self, text: str, arrays: Sequence[np.ndarray], storage: int, ntop: int = 1,
              propagate: Sequence[bool] | None = None) -> dict[str, float]:
        """Run both layers; returns each compared array's error over its bound (all <= 1), and
        raises GradientCheckError naming the first array past it."""
        from ..precision import layer_precision, storage_dtype
        from ..schema import caffe_pb2
        from .layer_testing import blobs, empty_blobs, make_layer

        half_dtype = storage_dtype(storage)
        u = UNIT_ROUNDOFF[half_dtype]

        def representable(a: np.ndarray) -> np.ndarray:
            probe = Blob(np.shape(a), half_dtype)
            probe.set_math_data(np.asarray(a, np.float32))
            return probe.math_data().astype(np.float64)

        inputs = [representable(a) for a in arrays]
        ref = make_layer(text, np.float64)
        prop = (list(propagate) if propagate is not None else
                [ref.allow_force_backward(i) for i in range(len(inputs))])
        if self.reference_check is not None:
            self.reference_check.check(ref, blobs(inputs), empty_blobs(ntop),
                                       check_bottom=[i for i, p in enumerate(prop) if p])
        net = caffe_pb2.NetParameter()
        net.default_forward_type = net.default_backward_type = cast("caffe_pb2.Type", storage)
        half = make_layer(text, np.float32)
        prec = layer_precision(net, half.layer_param)
        from ..layer import create_layer
        half = create_layer(half.layer_param, np.float32, prec)
        ref = make_layer(text, np.float64)
        if not half.stores_half:
            raise GradientCheckError(f"{half!r} does not store half (traits.half is False)")
        hb = []
        for a in inputs:
            b = Blob(a.shape, half_dtype if a.dtype.kind == "f" else np.float32)
            b.set_math_data(a.astype(np.float32))
            hb.append(b)
        # labels: bottoms the layer never differentiates stay float32, as data layers' tops do
        for i, a in enumerate(inputs):
            if not half.allow_force_backward(i):
                hb[i] = Blob(a.shape, np.float32)
                hb[i].mutable_cpu_data()[...] = a
        ht = [Blob((), half.top_dtype, half.top_diff_dtype) for _ in range(ntop)]
        rb, rt = blobs(inputs), empty_blobs(ntop)
        common.set_random_seed(self.seed)
        half.setup(hb, ht)
        common.set_random_seed(self.seed)
        ref.setup(rb, rt)
        for hp, rp in zip(half.blobs, ref.blobs):  # the same (half-representable) params
            rp.mutable_cpu_data()[...] = hp.math_data()
        common.set_random_seed(self.seed)
        half.forward(hb, ht)
        common.set_random_seed(self.seed)
        ref.forward(rb, rt)
        rng = np.random.default_rng(self.seed)
        for h, r, k in zip(ht, rt, range(ntop)):
            w = representable(rng.uniform(-1, 1, r.shape))
            if half.loss(k):
                w = np.full(r.shape, half.loss(k))
            h.set_math_diff(w.astype(np.float32))
            r.mutable_cpu_diff()[...] = w
        for p in (*half.blobs, *ref.blobs):
            p.set_math_diff(np.zeros(p.shape, np.float32))
        half.backward(ht, prop, hb)
        ref.backward(rt, prop, rb)
        compared = [(f"top {k}", h.math_data(), r.cpu_data()) for k, (h, r) in enumerate(zip(ht, rt))]
        compared += [(f"bottom {i} diff", h.math_diff(), r.cpu_diff())
                     for i, (h, r, p) in enumerate(zip(hb, rb, prop)) if p]
        compared += [(f"param {j} diff", h.math_diff(), r.cpu_diff())
                     for j, (h, r) in enumerate(zip(half.blobs, ref.blobs))
                     if j >= len(half.param_propagate_down) or half.param_propagate_down[j]]
        ratios: dict[str, float] = {}
        for label, got, want in compared:
            bound = self.factor * u * max(float(np.abs(want).max(initial=0.0)), float(np.finfo(np.float32).tiny))
            err = float(np.abs(got.astype(np.float64) - want).max(initial=0.0))
            ratios[label] = err / bound
            if not np.isfinite(err) or err > bound:
                raise GradientCheckError(f"{half!r} in {half_dtype.name if half_dtype != np.uint16 else 'bfloat16'}: "
                                         f"{label} differs from float64 by {err:.3g} > {bound:.3g} "
                                         f"({self.factor:g} u max|ref|, u = {u:.3g})")
        return ratios
