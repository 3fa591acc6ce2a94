"""``pycaffe-lite device_query [--gpu N|all]``: show a GPU's name, memory and compute capability.

Reads the properties through PyCUDA; without PyCUDA, a driver or a device it says which is
missing and exits with status 1.
"""

from __future__ import annotations

import argparse

from ..errors import GPUUnavailableError
from . import flag

NAME = "device_query"
HELP = "show the properties of a CUDA GPU (needs PyCUDA)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flag(parser, "gpu", metavar="N", default="0", help="device id to query, or 'all' (default 0)")


def _driver():
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise GPUUnavailableError(
            f"no GPU to query: PyCUDA is not installed ({exc}); install pycaffe-lite[gpu] on a CUDA machine"
        ) from None
    try:
        cuda.init()
        count = cuda.Device.count()
    except Exception as exc:
        raise GPUUnavailableError(f"no GPU to query: the CUDA driver could not be initialised ({exc})") from None
    if count == 0:
        raise GPUUnavailableError("no GPU to query: the CUDA driver reports no device")
    return cuda, count


def describe(cuda, device_id: int) -> list[tuple[str, object]]:
    """(label, value) rows for one device, in the spirit of Caffe's DeviceQuery."""
    dev = cuda.Device(device_id)
    a = cuda.device_attribute
    attrs = dev.get_attributes()

    def get(name):
        return attrs.get(getattr(a, name, None), "n/a")

    major, minor = dev.compute_capability()
    mem = dev.total_memory()
    return [
        ("Device id", device_id),
        ("Name", dev.name()),
        ("Compute capability", f"{major}.{minor}"),
        ("Total global memory", f"{mem} bytes ({mem / 2**30:.2f} GiB)"),
        ("Number of multiprocessors", get("MULTIPROCESSOR_COUNT")),
        ("Clock rate (kHz)", get("CLOCK_RATE")),
        ("Shared memory per block", get("MAX_SHARED_MEMORY_PER_BLOCK")),
        ("Registers per block", get("MAX_REGISTERS_PER_BLOCK")),
        ("Warp size", get("WARP_SIZE")),
        ("Maximum threads per block", get("MAX_THREADS_PER_BLOCK")),
        ("Maximum dimension of block", f"{get('MAX_BLOCK_DIM_X')}, {get('MAX_BLOCK_DIM_Y')}, {get('MAX_BLOCK_DIM_Z')}"),
        ("Maximum dimension of grid", f"{get('MAX_GRID_DIM_X')}, {get('MAX_GRID_DIM_Y')}, {get('MAX_GRID_DIM_Z')}"),
        ("Total constant memory", get("TOTAL_CONSTANT_MEMORY")),
        ("Concurrent copy and execution", "Yes" if get("GPU_OVERLAP") == 1 else "No"),
        ("Kernel execution timeout", "Yes" if get("KERNEL_EXEC_TIMEOUT") == 1 else "No"),
    ]


def run(args: argparse.Namespace) -> int:
    cuda, count = _driver()
    value = str(args.gpu).strip()
    if value == "all":
        ids = list(range(count))
    else:
        try:
            ids = [int(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise GPUUnavailableError(f"--gpu {value}: expected device ids or 'all'") from None
    for device_id in ids:
        if not 0 <= device_id < count:
            raise GPUUnavailableError(f"--gpu {device_id}: no such device ({count} device(s) found)")
        print(f"Querying GPU {device_id}")
        for label, v in describe(cuda, device_id):
            print(f"{label}: {v}")
    return 0
