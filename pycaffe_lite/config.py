"""One configuration object, read once from the environment and overridable in a ``with`` block.

    import pycaffe_lite as caffe
    caffe.config.fusion                       # the value in force
    with caffe.using_config(fusion=False):    # this thread, this block
        net.forward()

Every setting, its environment variable (read when the package is imported) and its default:

| setting | variable | default | meaning |
| --- | --- | --- | --- |
| ``fusion`` | ``PYCAFFE_LITE_FUSION`` | on | fused layer runs (conv+ReLU, conv+BN+Scale) |
| ``cuda_graphs`` | ``PYCAFFE_LITE_CUDA_GRAPHS`` | on | capture and replay CUDA graphs |
| ``share_diffs`` | ``PYCAFFE_LITE_SHARE_DIFFS`` | on | training iterations share gradient buffers |
| ``share_data`` | ``PYCAFFE_LITE_SHARE_DATA`` | on | intermediate data shares memory (deploy nets; data only forwards read, in training iterations too) |
| ``pin_host`` | ``PYCAFFE_LITE_PIN_HOST`` | on | blobs' host copies of 1 MiB or more page-locked while a GPU is in use |
| ``autotune_cache`` | ``PYCAFFE_LITE_AUTOTUNE_CACHE`` | none | file of convolution engine choices |
| ``nvcc_flags`` | ``PYCAFFE_LITE_NVCC_FLAGS`` | none | extra flags for run-time kernel compilation |
| ``bucket_mb`` | ``PYCAFFE_LITE_BUCKET_MB`` | 32 | multi-GPU gradient bucket size (MiB) |
| ``nccl`` | ``PYCAFFE_LITE_NCCL`` | none | path of libnccl.so.2 (or its folder) |
| ``nccl_timeout`` | ``PYCAFFE_LITE_NCCL_TIMEOUT`` | 600 | seconds ranks wait for each other at start |
| ``action_interval`` | ``PYCAFFE_LITE_ACTION_INTERVAL`` | 10 | iterations between ranks' Ctrl-C/SIGHUP votes |
| ``data_workers`` | ``PYCAFFE_LITE_DATA_WORKERS`` | none | decode processes per Data/ImageData/WindowData layer (0: the prefetch thread; overrides the prototxt's ``workers``) |
| ``gpu_decode`` | ``PYCAFFE_LITE_GPU_DECODE`` | none | 1: Data layers with workers in GPU mode decode JPEG records on the device with nvJPEG, 0: on the host (overrides the prototxt's ``gpu_decode``; unset in both: the workers decode JPEG records while the forwards do not wait for them, nvJPEG once they do, where libnvjpeg loads) |

``PYCAFFE_LITE_THREADS`` (BLAS threads) is read by :mod:`pycaffe_lite.threads` before numpy's
BLAS starts, so it is no setting here. Overrides are per thread; the environment is read once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from .errors import CaffeError


def _flag(text: str) -> bool:
    return text != "0"


_PARSE: dict[str, Any] = {"bool": _flag, "int": int, "float": float, "str": str}


@dataclasses.dataclass(frozen=True)
class Config:
    fusion: bool = True
    cuda_graphs: bool = True
    share_diffs: bool = True
    share_data: bool = True
    pin_host: bool = True
    autotune_cache: str | None = None
    nvcc_flags: str | None = None
    bucket_mb: float = 32.0
    nccl: str | None = None
    nccl_timeout: float = 600.0
    action_interval: int = 10
    data_workers: int | None = None
    gpu_decode: bool | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Config:
        """The defaults, with every ``PYCAFFE_LITE_<SETTING>`` variable of ``env`` applied."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            var = f"PYCAFFE_LITE_{f.name.upper()}"
            text = env.get(var)
            if text is None or text == "":
                continue
            kind = str(f.type).split(" |")[0]  # "bool", "int", "float", "str"
            try:
                values[f.name] = _PARSE[kind](text)
            except ValueError:
                raise CaffeError(f"${var}={text!r}: expected {kind}") from None
        return cls(**values)


_base = Config.from_env()
_local = threading.local()


class _Current:
    """``pycaffe_lite.config``: reads the setting in force (the innermost ``using_config``)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(getattr(_local, "config", _base), name)

    def __repr__(self) -> str:
        return repr(getattr(_local, "config", _base))


config: Any = _Current()


@contextlib.contextmanager
def using_config(**changes: Any) -> Iterator[Config]:
    """Settings changed for this thread inside the block (``using_config(fusion=False)``)."""
    before = getattr(_local, "config", _base)
    unknown = set(changes) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
        raise CaffeError(f"using_config: unknown settings {sorted(unknown)} "
                         f"(known: {[f.name for f in dataclasses.fields(Config)]})")
    _local.config = dataclasses.replace(before, **changes)
    try:
        yield _local.config
    finally:
        _local.config = before


def reload_from_env() -> None:
    """Read the environment again (for code that changes ``os.environ`` after import, e.g. tests)."""
    global _base
    _base = Config.from_env()
