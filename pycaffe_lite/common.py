"""Process-wide state in one object, as Caffe's ``Caffe`` singleton: :class:`Context`.

``context()`` is what the process runs with (compute mode, device, random state, TF32, the
multi-GPU ranks) and the counters that tell recorded work it is stale; the device's own state
(CUDA context, stream, memory pool, workspace, per-device caches: cuBLAS handle, tables) is
``context().device`` (:func:`pycaffe_lite.gpu.backend.state`). The functions below are pycaffe's
names for its fields (``set_mode_gpu``, ``set_random_seed``, ...). Configuration that a user sets
per block is :mod:`pycaffe_lite.config`, read through ``config``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from .errors import GPUUnavailableError
from .gpu import backend, blas


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
    generators), the multi-GPU ``solver_count`` / ``solver_rank`` / ``multiprocess``, and the
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


_state = Context()


def context() -> Context:
    """The process's :class:`Context`."""
    return _state


def mode() -> Mode:
    """The current compute mode."""
    return _state.mode


def set_mode_cpu() -> None:
    """Run layers on the CPU (numpy)."""
    _state.mode = Mode.CPU


def set_mode_gpu() -> None:
    """Run layers on the GPU; raises GPUUnavailableError naming what is missing."""
    backend.init_device(_state.device_id)  # importing backend needs no GPU; this call does
    _state.mode = Mode.GPU


def set_device(device_id: int) -> None:
    """Choose the GPU used by GPU mode (takes effect now if GPU mode is on)."""
    if int(device_id) < 0:
        raise GPUUnavailableError(f"set_device: device id must be >= 0, got {device_id}")
    _state.device_id = int(device_id)
    if _state.mode is Mode.GPU:
        backend.init_device(_state.device_id)
    else:
        backend.select_device(_state.device_id)


def device_id() -> int:
    return _state.device_id


def set_random_seed(seed: int) -> None:
    """Seed every random generator (fillers, dropout on both devices, data shuffling)."""
    _state.seed = int(seed)
    _state.rng = np.random.default_rng(int(seed))
    _state.seed_generation += 1
    _state.gpu_rng_counter = 0


def rng() -> np.random.Generator:
    """The process-wide numpy generator."""
    return _state.rng


def seed_generation() -> int:
    """How many times set_random_seed has run: device generators re-seed when it changes."""
    return _state.seed_generation


def next_gpu_seed() -> tuple[int, int]:
    """A (seed, counter) pair for a counter-based device generator; each call gives a new stream."""
    seed = _state.seed if _state.seed is not None else 0x5EED
    _state.gpu_rng_counter += 1
    return seed & 0xFFFFFFFF, _state.gpu_rng_counter & 0xFFFFFFFF


def set_allow_tf32(allow: bool) -> None:
    """Let float32 GEMMs on the GPU use TF32 tensor cores (faster, 10-bit mantissa inputs).

    Off by default, as results then differ from float32 arithmetic; needs GPU mode.
    """
    if _state.mode is not Mode.GPU:
        raise GPUUnavailableError("set_allow_tf32 needs GPU mode (call set_mode_gpu() first)")
    blas.set_allow_tf32(bool(allow))


def tf32_allowed() -> bool:
    """Whether :func:`set_allow_tf32` last allowed TF32 (convolution engine choices and captured
    graphs are keyed on it)."""
    return blas.tf32_allowed()


# -- multi-GPU training (Caffe's solver_count / solver_rank / multiprocess) -----------------------
def solver_count() -> int:
    """How many solvers (ranks, one per GPU) train together; 1 without multi-GPU training."""
    return _state.solver_count


def set_solver_count(count: int) -> None:
    if int(count) < 1:
        raise ValueError(f"set_solver_count: expected >= 1, got {count}")
    _state.solver_count = int(count)


def solver_rank() -> int:
    """This process's rank among :func:`solver_count` solvers (0: the root, which logs, tests, snapshots)."""
    return _state.solver_rank


def set_solver_rank(rank: int) -> None:
    if int(rank) < 0:
        raise ValueError(f"set_solver_rank: expected >= 0, got {rank}")
    _state.solver_rank = int(rank)


def root_solver() -> bool:
    return _state.solver_rank == 0


def multiprocess() -> bool:
    return _state.multiprocess


def set_multiprocess(value: bool) -> None:
    """Mark this process as one of several training processes (pycaffe's set_multiprocess)."""
    _state.multiprocess = bool(value)
