"""The process's Caffe state is one object (common.context()); pycaffe's functions are views of it."""

from __future__ import annotations

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.blob import Blob, shape_generation


def test_pycaffe_functions_read_and_write_the_context():
    ctx = common.context()
    assert ctx is common.context() and common.mode() is ctx.mode is common.Mode.CPU
    before = ctx.seed_generation
    common.set_random_seed(7)
    assert (ctx.seed, ctx.seed_generation, ctx.gpu_rng_counter) == (7, before + 1, 0)
    assert common.rng() is ctx.rng and common.seed_generation() == ctx.seed_generation
    assert common.next_gpu_seed() == (7, 1) and ctx.gpu_rng_counter == 1
    common.set_solver_rank(0)
    assert common.root_solver() and ctx.solver_rank == 0


def test_a_reshape_moves_the_shape_generation_and_the_graph_key():
    ctx = common.context()
    key = ctx.generation()
    b = Blob((2, 3), np.float32)
    start = shape_generation()
    b.reshape((2, 3))  # same shape: nothing recorded goes stale
    assert shape_generation() == start == ctx.shape_generation
    b.reshape((4, 3))
    assert shape_generation() == start + 1 and ctx.generation() != key
    common.set_random_seed(3)
    assert ctx.generation()[2] == ctx.seed_generation
