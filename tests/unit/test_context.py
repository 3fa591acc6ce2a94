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


def test_a_thread_context_is_a_copy_of_its_own():
    """Inside thread_context a thread's mode, seed and generator are its own; the process's and the
    other threads' are untouched (but for the one draw that seeds the thread's generator, as BVLC's
    threads take their seed from their parent's generator), and the block's end gives the thread the
    process's back."""
    import threading

    ctx = common.context()
    common.set_random_seed(11)
    replica = np.random.default_rng(11)
    replica.integers(2**63)
    before = (ctx.seed, ctx.seed_generation, replica.bit_generator.state)
    seen = {}

    def work():
        with common.thread_context() as own:
            assert own is common.context() and own is not ctx and own.seed == 11
            common.set_random_seed(5)
            seen["draw"] = float(common.rng().random())
            seen["seed"] = common.context().seed
        seen["after"] = common.context() is ctx

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["seed"] == 5 and seen["after"]
    assert (ctx.seed, ctx.seed_generation, ctx.rng.bit_generator.state) == before
    assert common.context() is ctx and common.rng() is ctx.rng
    common.set_random_seed(5)
    assert float(common.rng().random()) == seen["draw"]  # the thread's seed 5 drew the same stream


def test_a_thread_context_takes_changes_and_nests():
    with common.thread_context(solver_rank=3) as outer:
        assert common.solver_rank() == 3 and not common.root_solver()
        with common.thread_context(solver_rank=0) as inner:
            assert common.context() is inner and common.root_solver()
        assert common.context() is outer
    assert common.solver_rank() == 0
