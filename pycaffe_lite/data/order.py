"""A shuffled order that a snapshot records as the generator state it was drawn from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import common


class Order:
    """An order of ``n`` items: ``order`` is ``arange(n)`` until ``shuffle()`` draws a permutation
    from ``common.rng()``; ``drawn_from`` is the generator state it was drawn from (None: not
    shuffled), which ``redraw`` turns into the same permutation again."""

    def __init__(self, n: int) -> None:
        self.order = np.arange(n)
        self.drawn_from: Mapping[str, Any] | None = None

    def shuffle(self) -> None:
        gen = common.rng()
        self.drawn_from = gen.bit_generator.state
        self.order = gen.permutation(len(self.order))

    def redraw(self, drawn_from: Mapping[str, Any] | None) -> None:
        """The order ``shuffle`` drew from the generator state ``drawn_from`` (ValueError if that
        is no state of this numpy's generator)."""
        if drawn_from is None:
            self.order = np.arange(len(self.order))
        else:
            bits = type(common.rng().bit_generator)()
            bits.state = drawn_from
            self.order = np.random.Generator(bits).permutation(len(self.order))
        self.drawn_from = drawn_from
