"""Process-wide state, as in Caffe's ``Caffe`` singleton: compute mode, device, random numbers."""

from __future__ import annotations

import enum

import numpy as np

from .errors import GPUUnavailableError
from .gpu import backend, blas


class Mode(enum.Enum):
    CPU = 0
    GPU = 1


# Phases, with the numbers of caffe.proto's Phase enum.
TRAIN = 0
TEST = 1


class _State:
    def __init__(self) -> None:
        self.mode = Mode.CPU
        self.device_id = 0
        self.seed: int | None = None
        self.rng = np.random.default_rng()
        # Bumped on every set_random_seed so device-side generators re-seed too.
        self.seed_generation = 0
        self.gpu_rng_counter = 0
        self.solver_count, self.solver_rank, self.multiprocess = 1, 0, False


_state = _State()


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
