"""Numeric gradient checking for layers, in the style of Caffe's GradientChecker.

The objective is ``L = sum_k <top_k, W_k>`` with fixed random weights ``W_k``: the analytic
gradient comes from one backward pass with ``top_k.diff = W_k``; the numeric one from central
differences of ``L`` around every bottom and param element. An element passes when
``|analytic - numeric| <= threshold * max(|analytic|, |numeric|, 1)``. Elements whose input lies
within ``kink_range`` of ``kink`` (e.g. ReLU at 0) are skipped, as Caffe does. Use float64 layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
