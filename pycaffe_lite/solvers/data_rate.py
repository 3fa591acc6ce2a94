"""The data layers' rate in the training log: one line per data layer at each ``display``.

Data layers that count what they serve (``data_stats()``: batches, images and seconds their
forward waited for the prefetch queue or the workers) are read at each display; the line gives
the images delivered per second of wall time and the wait per iteration over the display
interval, from those host counters only (no device synchronization):

    data layer 'data': 12,345 img/s, waited 3.2 ms/iter (4%)
"""

from __future__ import annotations

from collections.abc import Sequence

Stats = tuple[int, int, float]


def data_layers(layers: Sequence, names: Sequence[str]) -> list[tuple[str, object]]:
    """``(name, layer)`` of the layers that count what they serve (``data_stats()``)."""
    return [(name, layer) for name, layer in zip(names, layers) if callable(getattr(layer, "data_stats", None))]


def rate_line(name: str, before: Stats, after: Stats, seconds: float) -> str | None:
    """The log line of one data layer between two ``data_stats()`` readings ``seconds`` apart (the
    wait per iteration is per batch served: one per forward); None when it served nothing or no
    time passed."""
    batches, images, waited = (a - b for a, b in zip(after, before))
    if batches <= 0 or images <= 0 or seconds <= 0:
        return None
    per_iter = waited / batches * 1e3
    share = 100.0 * waited / seconds
    return (f"data layer '{name}': {images / seconds:,.0f} img/s, waited {per_iter:.3g} ms/iter "
            f"({share:.0f}%)")


class DataRate:
    """The counters of a net's data layers at the last display; :meth:`lines` gives the lines
    since then and starts the next interval."""

    def __init__(self, layers: Sequence, names: Sequence[str]) -> None:
        self.layers = data_layers(layers, names)
        self.last: list[Stats] = []
        self.start()

    def start(self) -> None:
        """Start an interval now (the solver's display timer starts with it)."""
        self.last = [tuple(layer.data_stats()) for _, layer in self.layers]  # type: ignore[attr-defined]

    def lines(self, seconds: float) -> list[str]:
        """One line per data layer that served batches in the last ``seconds``; the next interval
        starts."""
        out = []
        now = [tuple(layer.data_stats()) for _, layer in self.layers]  # type: ignore[attr-defined]
        for (name, _), before, after in zip(self.layers, self.last, now):
            line = rate_line(name, before, after, seconds)
            if line is not None:
                out.append(line)
        self.last = now
        return out
