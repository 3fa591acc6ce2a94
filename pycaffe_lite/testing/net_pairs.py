"""A net built twice, with the runtime's fusions and without, and the check that both leave the same
values: how the fusion tests prove a fused pass equals the layers it replaces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .. import common
from ..config import using_config

N = TypeVar("N")


def fused_and_plain(build: Callable[[], N], seed: int) -> tuple[N, N]:
    """``build()`` (a net) with fusions and without (``config.fusion``), each after
    ``set_random_seed(seed)``, so both have the same filled weights."""
    nets = []
    for fuse in (True, False):
        common.set_random_seed(seed)
        with using_config(fusion=fuse):  # fusions are found when the net is built
            nets.append(build())
    return nets[0], nets[1]


def assert_nets_match(a: Any, b: Any, rtol: float = 0.0, atol: float = 0.0, params_data: bool = False) -> None:
    """Every blob's data and diff and every param's diff (and data, ``params_data``) of net ``a``
    equal net ``b``'s within ``rtol``/``atol`` (0: exactly); the failure names the blob or param."""
    for name in b.blobs:
        np.testing.assert_allclose(a.blobs[name].data, b.blobs[name].data, rtol=rtol, atol=atol,
                                   err_msg=f"data of blob {name}")
        np.testing.assert_allclose(a.blobs[name].diff, b.blobs[name].diff, rtol=rtol, atol=atol,
                                   err_msg=f"diff of blob {name}")
    for name in b.params:
        for j, (p, q) in enumerate(zip(a.params[name], b.params[name])):
            if params_data:
                np.testing.assert_allclose(p.data, q.data, rtol=rtol, atol=atol, err_msg=f"{name}[{j}] data")
            np.testing.assert_allclose(p.diff, q.diff, rtol=rtol, atol=atol, err_msg=f"{name}[{j}] diff")
