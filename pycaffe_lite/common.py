"""Caffe's ``Caffe`` singleton as one object: :class:`Context`.

``context()`` is what this thread runs with: compute mode, device, random state, TF32, the
multi-GPU ranks, and the counters that tell recorded work it is stale. A thread shares the
process's context unless it enters :func:`thread_context` (a copy of its own, as BVLC's threads
copy their parent's state). The device's own state (CUDA context, stream, memory pool, workspace,
per-device caches: cuBLAS handle, tables) is ``context().device``
(:func:`pycaffe_lite.gpu.backend.state`), one device per process. The functions below are
pycaffe's names for the context's fields (``set_mode_gpu``, ``set_random_seed``, ...).
Configuration that a user sets per block is :mod:`pycaffe_lite.config`, read through ``config``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .errors import GPUUnavailableError
from .gpu import backend, blas
from .precision import check_precision_name


class Mode(enum.Enum):
    CPU = 0
    GPU = 1


# Phases, with the numbers of caffe.proto's Phase enum.
TRAIN = 0
TEST = 1


@dataclass
class Context:
    """The process's Caffe state. Fields: ``mode``, ``device_id`` (the GPU that GPU mode uses),
    ``seed`` / ``rng`` (numpy Generator) / ``gpu_rng_counter`` (the streams handed to device
    generators), the multi-GPU ``solver_count`` / ``solver_rank`` / ``multiprocess``, the precision
    switch ``precision`` (:func:`set_precision`: the nets built on this thread), and the
    generation counters: ``seed_generation`` (bumped by every set_random_seed: device generators
    recorded in graphs re-seed) and ``shape_generation`` (bumped whenever a blob changes shape:
    work recorded for the old shapes is stale)."""

    mode: Mode = Mode.CPU
    device_id: int = 0
    seed: int | None = None
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    seed_generation: int = 0
    gpu_rng_counter: int = 0
    shape_generation: int = 0
    solver_count: int = 1
    solver_rank: int = 0
    multiprocess: bool = False
    precision: str | None = None  # set_precision: fp32, tf32, fp16, bf16; None: each file decides

    @property
    def device(self) -> backend.DeviceState:
        """The current device's state (starts it): stream, pool, workspace, per-device caches."""
        return backend.state()

    @property
    def tf32(self) -> bool:
        """Whether float32 GEMMs and convolutions may use TF32 tensor cores (:func:`set_allow_tf32`)."""
        return blas.tf32_allowed()

    def generation(self) -> tuple:
        """What recorded GPU work (a captured graph) depends on besides its own inputs: the device's
        allocation generation (pointers), the blobs' shapes, the random seed and TF32."""
        alloc = backend.state().alloc_generation if self.mode is Mode.GPU else 0
        return (alloc, self.shape_generation, self.seed_generation, self.tf32)


_process = Context()
_threads = threading.local()  # .context: a thread's own Context (thread_context)


def context() -> Context:
    """This thread's :class:`Context`: its own inside :func:`thread_context`, else the process's."""
    return getattr(_threads, "context", None) or _process


@contextlib.contextmanager
def thread_context(**changes) -> Iterator[Context]:
    """Give this thread a Context of its own for the block, as BVLC's threads get their own Caffe
    state copied from the thread that starts them: a copy of the current one (mode, device, seed,
    ranks) with ``changes`` applied, and a random generator of its own seeded from the current one's
    stream, so ``set_mode_*``, ``set_random_seed`` and ``rng()`` inside touch no other thread. The
    device state stays the process's (one device per process, Caffe's multi-GPU way): a device id
    other than the one already started is refused."""
    current = context()
    own = dataclasses.replace(current, rng=np.random.default_rng(current.rng.integers(2**63)), **changes)
    if own.device_id != current.device_id and backend.started() and own.mode is Mode.GPU:
        raise GPUUnavailableError(f"thread_context: device {own.device_id} differs from the process's device "
                                  f"{current.device_id}; use one process per GPU (pycaffe-lite train --gpu 0,1)")
    outer = getattr(_threads, "context", None)
    _threads.context = own
    try:
        yield own
    finally:
        _threads.context = outer


def mode() -> Mode:
    """The current compute mode."""
    return context().mode


def set_mode_cpu() -> None:
    """Run layers on the CPU (numpy)."""
    context().mode = Mode.CPU


def set_mode_gpu() -> None:
    """Run layers on the GPU; raises GPUUnavailableError naming what is missing."""
    backend.init_device(context().device_id)  # importing backend needs no GPU; this call does
    context().mode = Mode.GPU


def set_device(device_id: int) -> None:
    """Choose the GPU used by GPU mode (takes effect now if GPU mode is on)."""
    if int(device_id) < 0:
        raise GPUUnavailableError(f"set_device: device id must be >= 0, got {device_id}")
    ctx = context()
    ctx.device_id = int(device_id)
    if ctx.mode is Mode.GPU:
        backend.init_device(ctx.device_id)
    else:
        backend.select_device(ctx.device_id)


def device_id() -> int:
    return context().device_id


def set_random_seed(seed: int) -> None:
    """Seed every random generator (fillers, dropout on both devices, data shuffling)."""
    ctx = context()
    ctx.seed = int(seed)
    ctx.rng = np.random.default_rng(int(seed))
    ctx.seed_generation += 1
    ctx.gpu_rng_counter = 0


def rng() -> np.random.Generator:
    """This thread's context's numpy generator (the process's, outside :func:`thread_context`)."""
    return context().rng


def seed_generation() -> int:
    """How many times set_random_seed has run: device generators re-seed when it changes."""
    return context().seed_generation


def next_gpu_seed() -> tuple[int, int]:
    """A (seed, counter) pair for a counter-based device generator; each call gives a new stream."""
    ctx = context()
    seed = ctx.seed if ctx.seed is not None else 0x5EED
    ctx.gpu_rng_counter += 1
    return seed & 0xFFFFFFFF, ctx.gpu_rng_counter & 0xFFFFFFFF


def set_allow_tf32(allow: bool) -> None:
    """Let float32 GEMMs on the GPU use TF32 tensor cores (faster, 10-bit mantissa inputs).

    Off by default, as results then differ from float32 arithmetic; needs GPU mode.
    """
    if context().mode is not Mode.GPU:
        raise GPUUnavailableError("set_allow_tf32 needs GPU mode (call set_mode_gpu() first)")
    blas.set_allow_tf32(bool(allow))


def set_precision(name: str | None) -> None:
    """The precision of the nets this thread builds from now on (``--precision`` on the command
    line): ``fp32`` (exact float32: TF32 off), ``tf32`` (float32 with TF32 tensor cores allowed,
    :func:`set_allow_tf32`; needs GPU mode), ``fp16`` / ``bf16`` (a file without type fields is
    built as if it said ``default_forward_type``/``default_backward_type`` FLOAT16 / BFLOAT16 with
    FLOAT math; fp16 also scales the loss adaptively; weights loaded into it are rounded once), or
    None (the default: each file's own fields decide, TF32 as :func:`set_allow_tf32` left it).
    A file whose own type fields contradict the name is an error naming it when the net is built
    (:func:`pycaffe_lite.precision.apply_precision`). Nets already built keep their types. TF32 is
    a setting of the process's cuBLAS handle and engine choice, so ``fp32``/``tf32`` change it for
    every thread. An unknown name is a ValueError listing the four."""
    checked = check_precision_name(name)
    if checked == "tf32":
        if context().mode is not Mode.GPU:
            raise GPUUnavailableError("set_precision('tf32') needs GPU mode: TF32 is a mode of the GPU's tensor "
                                      "cores (call set_mode_gpu() first; on the CPU float32 is exact anyway: 'fp32')")
        blas.set_allow_tf32(True)
    elif checked == "fp32" and blas.tf32_allowed():
        blas.set_allow_tf32(False)
    context().precision = checked


def get_precision() -> str | None:
    """The name :func:`set_precision` last set on this thread (None: the files decide). For
    ``fp32``/``tf32`` it reports TF32 as it is now, so a later ``set_allow_tf32`` shows."""
    name = context().precision
    if name in ("fp32", "tf32"):
        return "tf32" if blas.tf32_allowed() else "fp32"
    return name


def tf32_allowed() -> bool:
    """Whether :func:`set_allow_tf32` last allowed TF32 (convolution engine choices and captured
    graphs are keyed on it)."""
    return blas.tf32_allowed()


# -- multi-GPU training (Caffe's solver_count / solver_rank / multiprocess) -----------------------
def solver_count() -> int:
    """How many solvers (ranks, one per GPU) train together; 1 without multi-GPU training."""
    return context().solver_count


def set_solver_count(count: int) -> None:
    if int(count) < 1:
        raise ValueError(f"set_solver_count: expected >= 1, got {count}")
    context().solver_count = int(count)


def solver_rank() -> int:
    """This process's rank among :func:`solver_count` solvers (0: the root, which logs, tests, snapshots)."""
    return context().solver_rank


def set_solver_rank(rank: int) -> None:
    if int(rank) < 0:
        raise ValueError(f"set_solver_rank: expected >= 0, got {rank}")
    context().solver_rank = int(rank)


def root_solver() -> bool:
    return context().solver_rank == 0


def multiprocess() -> bool:
    return context().multiprocess


def set_multiprocess(value: bool) -> None:
    """Mark this process as one of several training processes (pycaffe's set_multiprocess)."""
    context().multiprocess = bool(value)
