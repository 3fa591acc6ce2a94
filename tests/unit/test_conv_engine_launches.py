"""Every registered convolution engine's host code, run without a GPU: a fake backend checks each kernel
launch against its ``__global__`` signature in the engine's ``.cu`` (argument count, kinds, int ranges,
non-null pointers) and records it; a second call of a pass (from the launch plans kept in the problem's
cache) launches exactly what the first did. The kernels' results are the GPU suite's
(tests/gpu/test_conv_*.py); this catches host-side slips in code that only runs on a device."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv import registry
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.gpu import backend, blas, signatures
from pycaffe_lite.gpu import math_functions as gm


@functools.cache
def _signatures(path: str) -> dict:
    return signatures.parse_signatures(Path(path).read_text())


class FakeKernel:
    def __init__(self, log: list, path, name: str) -> None:
        self.log, self.name = log, name
        self.sig = _signatures(str(path))[name]

    def check_args(self, *args) -> None:
        signatures.check_args(self.sig, args, self.name)

    def launch(self, grid, block, *args, shared=0) -> None:
        self.check_args(*args)
        self.log.append((self.name, grid, block, shared, args))

    def __call__(self, *args, **kw) -> None:
        self.check_args(*args)
        self.log.append((self.name, args, sorted(kw.items())))

    def resident_blocks(self, threads, shared=0) -> int:
        return 2

    def allow_shared(self, nbytes) -> None:
        pass


@pytest.fixture
def launches(monkeypatch, fake_hopper):
    log: list = []
    monkeypatch.setattr(backend, "kernel", lambda path, name, dtype, arch=None: FakeKernel(log, path, name))
    monkeypatch.setattr(backend, "multiprocessor_count", lambda: 132)
    tables: dict = {}  # fake device tables stay out of the real cache
    monkeypatch.setattr(backend, "device_cache", lambda name: tables)
    monkeypatch.setattr(backend, "alloc", lambda n: 1 << 24)
    monkeypatch.setattr(backend, "memcpy_htod", lambda dst, src, pinned=False: None)
    monkeypatch.setattr(backend, "elementwise", lambda *a: lambda *b: log.append(("elementwise", a[0], b)))
    monkeypatch.setattr(backend, "workspace", lambda *sizes: [(i + 1) << 30 for i in range(len(sizes))])
    monkeypatch.setattr(backend, "memset_zero", lambda ptr, nbytes: log.append(("memset_zero", ptr, nbytes)))
    monkeypatch.setattr(blas, "gemm_strided_batched", lambda *a: log.append(("gemm_strided_batched", a)))
    monkeypatch.setattr(blas, "gemv", lambda *a: log.append(("gemv", a)))
    monkeypatch.setattr(blas, "gemm", lambda *a, **k: log.append(("gemm", a, sorted(k.items()))))
    monkeypatch.setattr(blas, "tf32_allowed", lambda: True)  # the tensor-core engines too
    monkeypatch.setattr(gm, "channel_sum", lambda *a, **k: log.append(("channel_sum", a)))
    monkeypatch.setattr(gm, "add_channel_bias", lambda *a: log.append(("add_channel_bias", a)))
    monkeypatch.setattr(gm, "ones_vector", lambda n, dtype: 1 << 25)
    return log


PROBLEMS = [  # channel-sliced and gathering tensor-core paths, dilation, depthwise, 1x1, small batch, float64
    ConvProblem(4, 64, 14, 14, 64, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f4"),
    ConvProblem(2, 24, 9, 9, 40, 1, (3, 3), (1, 1), (1, 1), (2, 2), "<f4"),
    ConvProblem(2, 8, 8, 8, 8, 8, (3, 3), (1, 1), (2, 2), (1, 1), "<f4"),
    ConvProblem(3, 16, 12, 12, 32, 1, (1, 1), (0, 0), (1, 1), (1, 1), "<f8"),
    # BVLC's truncating output size: (1 - 2) / 2 + 1 = 1 and (2 - 3) / 2 + 1 = 1, windows overhanging
    ConvProblem(4, 8, 1, 1, 16, 1, (2, 2), (0, 0), (2, 2), (1, 1), "<f4"),
    ConvProblem(2, 8, 2, 2, 8, 8, (3, 3), (0, 0), (2, 2), (1, 1), "<f4"),
    # half storage: float16 and bfloat16 (uint16 bit patterns), the fp16/bf16 tensor-core engines
    ConvProblem(4, 64, 14, 14, 64, 1, (3, 3), (1, 1), (1, 1), (1, 1), "<f2"),
    ConvProblem(2, 24, 9, 9, 40, 2, (3, 3), (1, 1), (2, 2), (2, 2), "<u2"),
    ConvProblem(2, 8, 8, 8, 8, 8, (3, 3), (1, 1), (2, 2), (1, 1), "<u2"),
    # the NHWC-staged engines at stride 2 (a data gradient of four phases) and with M % 8 != 0 (delegated)
    ConvProblem(2, 16, 9, 8, 24, 1, (3, 3), (1, 1), (2, 2), (1, 1), "<u2"),
    ConvProblem(3, 32, 7, 7, 20, 1, (1, 1), (0, 0), (1, 1), (1, 1), "<f2"),
    # 1x1 with M % 8 == 0: tensorcore16-nhwc-cublas's weight gradient; at stride 2, subsampled staging
    ConvProblem(3, 32, 7, 7, 24, 1, (1, 1), (0, 0), (1, 1), (1, 1), "<f2"),
    ConvProblem(2, 16, 9, 9, 40, 1, (1, 1), (0, 0), (2, 2), (1, 1), "<u2"),
    # an RGB stem: the input staged with its channels padded to 8
    ConvProblem(2, 3, 17, 17, 16, 1, (7, 7), (3, 3), (2, 2), (1, 1), "<f2"),
]


@pytest.mark.parametrize("prob", PROBLEMS, ids=lambda p: f"k{p.kernel[0]}g{p.group}d{p.dilation[0]}h{p.height}{p.dtype}")
def test_every_engine_launches_what_its_kernels_declare(launches, prob):
    ran = set()
    for name, engine in registry.ENGINES.items():
        if not engine.supports(prob):
            continue
        choice = conv_engines.Choice(*(name if p in engine.passes else "gemm" for p in registry.PASSES))
        for bias in (None, 7 << 12):
            calls = {"forward": (1 << 12, 2 << 12, bias, 3 << 12), "backward_data": (2 << 12, 4 << 12, 5 << 12),
                     "backward_weight": (1 << 12, 4 << 12, 6 << 12, bias and 8 << 12)}
            for pass_, args in calls.items():
                for relu in ((False, True) if pass_ == "forward" else (False,)):
                    kw = {"relu": relu} if relu else {}
                    first = len(launches)
                    conv_engines.run(prob, choice, pass_, *args, **kw)
                    middle = len(launches)
                    conv_engines.run(prob, choice, pass_, *args, **kw)
                    assert middle > first, (name, pass_)
                    once, again = launches[first:middle], launches[middle:]
                    assert once == again, (name, pass_)
        ran.add(name)
    assert "gemm" in ran and any(n.startswith("implicit") for n in ran)
    assert any(n.startswith("tensorcore-") for n in ran) == (prob.dtype == "<f4")
    assert any(n.startswith("tensorcore16-") for n in ran) == (prob.dtype in ("<f2", "<u2"))
    if prob.dtype in ("<f2", "<u2") and prob.dilation == (1, 1) and prob.cg % 32 == 0:  # the sliced kernels too
        assert any(str(entry[0]).startswith("t16s_forward_") for entry in launches)
    if prob.dtype in ("<f2", "<u2") and prob.group == 1 and prob.dilation == (1, 1) and prob.channels % 8 == 0:
        assert {f"tensorcore16-nhwc-{t}" for t in ("128x128", "64x64")} <= ran  # the NHWC-staged engines
        assert any(str(entry[0]).startswith("t16n_conv_") for entry in launches)
        assert {f"tensorcore16-wgmma-{t}" for t in ("128x256", "64x128")} <= ran  # on the fake 9.0 device
        assert any(str(entry[0]).startswith("t16w_conv_") for entry in launches)
    if prob.dtype in ("<f2", "<u2") and prob.group == 1 and prob.dilation == (1, 1):  # any C: padded staging
        assert "tensorcore16-nhwc-64x64" in ran
        if prob.channels % 8:
            assert any(str(entry[0]) == "t16n_to_nhwc_narrow" for entry in launches)
    if prob.dtype in ("<f2", "<u2") and prob.kernel == (1, 1) and prob.channels % 8 == 0 and prob.num_output % 8 == 0:
        assert "tensorcore16-nhwc-cublas" in ran
        gemms = [(entry[1][:6], entry[2]) for entry in launches if entry[0] == "gemm"]
        t = prob.num * prob.out_plane  # fp32 dy^T x, then added onto dw once
        assert ((True, False, prob.num_output, prob.channels, t, 1.0), [("c_float", True)]) in gemms
        assert any(str(entry[0]) == "t16_reduce_weight" for entry in launches)


def test_nhwc_data_gradient_launches_one_gemm_per_stride_phase(launches):
    """tensorcore16-nhwc's data gradient at stride (2, 2): dy staged once, then per phase its weights
    and its GEMM; a 1x1 kernel's three phases without taps launch nothing: dx is zeroed first."""
    for prob, gemms in ((ConvProblem(2, 16, 9, 8, 24, 1, (3, 3), (1, 1), (2, 2), (1, 1), "<u2"), 4),
                        (ConvProblem(2, 16, 9, 8, 24, 1, (1, 1), (0, 0), (2, 2), (1, 1), "<f2"), 1)):
        choice = conv_engines.Choice("gemm", "tensorcore16-nhwc-64x64", "gemm")
        first = len(launches)
        conv_engines.run(prob, choice, "backward_data", 2 << 12, 4 << 12, 5 << 12)
        names = [str(entry[0]) for entry in launches[first:]]
        assert names.count("t16n_to_nhwc") == 1
        assert names.count("t16n_conv_64x64") == names.count("t16n_permute_weights") == gemms
        zeroed = [entry for entry in launches[first:] if entry[0] == "memset_zero"]
        assert zeroed == ([] if gemms == 4 else [("memset_zero", 5 << 12, 2 * 16 * 9 * 8 * 2)])
