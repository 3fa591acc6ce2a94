"""Kernels built from Python strings compute in Mtype, so they compile for half storage.

Every ``backend.elementwise`` source that computes (math_functions' element-wise family, the 16
neuron layers' statements through NeuronLayer, Pooling's fused ReLU mask, Eltwise's PROD gradient,
BatchNorm's convolution fold, conv/nd's ReLU) is collected here without a GPU (the backend's compile
step is replaced by a recorder) and compiled by nvcc for float, double, __half and __nv_bfloat16
behind the backend's own prelude. ``math_statements.in_math`` (the neuron rewrite) is checked as text.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from pycaffe_lite import common
from pycaffe_lite.gpu import backend
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.gpu.math_statements import in_math
from pycaffe_lite.testing.layer_testing import blobs, make_layer

# (layer text, has a backward): every neuron type with a GPU statement, Power's constant pair too
NEURONS = [
    ("type: 'ReLU' relu_param { negative_slope: 0.1 }", True),
    ("type: 'Sigmoid'", True),
    ("type: 'TanH'", True),
    ("type: 'AbsVal'", True),
    ("type: 'BNLL'", True),
    ("type: 'BReLU'", True),
    ("type: 'Clip' clip_param { min: -0.5 max: 0.7 }", True),
    ("type: 'ELU' elu_param { alpha: 0.5 }", True),
    ("type: 'Exp' exp_param { base: 2 scale: 0.5 shift: 1 }", True),
    ("type: 'Log' log_param { base: 10 scale: 2 shift: 0.5 }", True),
    ("type: 'Power' power_param { power: 2 scale: 0.5 shift: 1.5 }", True),
    ("type: 'Power' power_param { power: 0 scale: 3 shift: 2 }", True),
    ("type: 'Swish' swish_param { beta: 2.5 }", True),
    ("type: 'Threshold' threshold_param { threshold: 0.3 }", False),
    ("type: 'PReLU'", True),
    ("type: 'ReLU6'", True),
    ("type: 'Dropout'", True),
]
STORAGE = {"float": np.float32, "double": np.float64, "half": np.float16, "bfloat16": np.uint16}


class _Recorder:
    """Stands in for the backend's compile cache: records each elementwise source, launches nothing."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}  # source -> kernel name

    def compiled(self, key, make):
        assert key[0] == "elementwise", key
        name = re.search(r"__global__ void (\w+)\(", key[1]).group(1)
        self.sources.setdefault(key[1], name)
        return self

    def get(self, name):
        return lambda *args, **kw: None


def _neuron_statements(layer) -> dict[str, str]:
    return {k: getattr(layer, k) for k in dir(layer)
            if k.startswith("gpu_") and isinstance(getattr(layer, k, None), str) and getattr(layer, k)}


def collect_sources(monkeypatch) -> dict[str, str]:
    """source -> kernel name of every computing string kernel (sources do not depend on the dtype)."""
    from pycaffe_lite.layers.batch_norm import fold_kernels
    from pycaffe_lite.layers.eltwise import PROD_GRAD_KERNEL
    from pycaffe_lite.layers.pooling import RELU_MASK_KERNEL

    from pycaffe_lite.conv.nd import RELU_KERNEL

    rec = _Recorder()
    monkeypatch.setattr(backend, "_compiled", rec.compiled)
    dt = np.float32
    gm.set(4, 1.5, 1, dt)
    gm.add_scalar(4, 1.5, 1, dt)
    for fn in (gm.add, gm.sub, gm.mul, gm.div):
        fn(4, 1, 2, 3, dt)
    gm.scale(4, 0.5, 1, 2, dt)
    gm.axpby(4, 0.5, 1, 0.25, 2, dt)
    gm.powx(4, 1, 0.5, 2, dt)
    for fn in (gm.exp, gm.log, gm.abs, gm.sqrt, gm.sign):
        fn(4, 1, 2, dt)
    assert len(rec.sources) == 14
    common.set_mode_cpu()
    x = np.random.default_rng(0).uniform(0.1, 1, (2, 3, 4, 5))
    arrays = {name: 1 for name in ("x", "y", "dy", "dx", "s", "slope", "terms", "mask")}
    for text, _ in NEURONS:
        layer = make_layer(text, dt)
        layer.setup(blobs([x], dt), blobs([x], dt))
        for tag, body in _neuron_statements(layer).items():
            layer.launch(tag[4:], body, 4, **arrays)
    for name, (params, body) in (("pool_relu_mask", RELU_MASK_KERNEL), ("eltwise_prod_grad", PROD_GRAD_KERNEL),
                                 ("conv_nd_relu", RELU_KERNEL)):
        backend.elementwise(name, params, body, dt)
    for has_scale in (False, True):
        for name, params, body in fold_kernels(has_scale):
            backend.elementwise(name, params, body, dt)
    return rec.sources


def test_every_string_kernel_is_collected(monkeypatch):
    sources = collect_sources(monkeypatch)
    names = set(sources.values())
    assert {"relu_forward", "relu_backward", "prelu_slope_terms", "swish_forward", "dropout_backward_train",
            "power_forward", "sigmoid_backward", "pool_relu_mask", "fold_conv_bias", "powx_kernel"} <= names
    assert len(sources) >= 14 + 30 + 3 + 4


def test_string_kernels_compute_in_mtype(monkeypatch):
    """No arithmetic on stored values: every array element is read through to_m and every store goes
    through from_m (the rule that makes half storage compile and float/double unchanged)."""
    for source, name in collect_sources(monkeypatch).items():
        body = source.split("CUDA_KERNEL_LOOP(i, n) {", 1)[1]
        assert "Dtype" not in body, f"{name}: Dtype in its body: {body}"
        params = re.search(r"\(const int n, ?(.*?)\) \{", source).group(1)
        for array in re.findall(r"Dtype\* (\w+)", params):
            reads = re.findall(rf"(?<![\w(]){array}\[[^\]]*\](?!\s*=[^=])", body)
            assert not reads, f"{name}: {array} read without to_m: {body}"
            for store in re.finditer(rf"\b{array}\[[^\]]*\]\s*=(?!=)\s*(\S+)", body):
                assert store.group(1).startswith("from_m("), f"{name}: store to {array} without from_m: {body}"


def test_in_math_rewrites_loads_stores_and_literals():
    assert in_math("y[i] = x[i] > 0 ? x[i] : x[i] * slope", ["x", "y"]) == \
        "y[i] = from_m(to_m(x[i]) > 0 ? to_m(x[i]) : to_m(x[i]) * slope)"
    assert in_math("const Dtype e = exp(x[i]); dx[i] = dy[i] * e / (e + Dtype(1))", ["x", "dy", "dx"]) == \
        "const Mtype e = exp(to_m(x[i])); dx[i] = from_m(to_m(dy[i]) * e / (e + Mtype(1)))"
    assert in_math("y[i] += w[(i / d) % c]", ["y", "w"]) == "y[i] = from_m(to_m(y[i]) + (to_m(w[(i / d) % c])))"
    assert in_math("t[i] == Dtype(0)", ["t"]) == "to_m(t[i]) == Mtype(0)"  # a comparison is no store


def _unique(source: str, k: int) -> str:
    return re.sub(r"(__global__\s+void\s+)(\w+)", rf"\g<1>\g<2>__{k}", source)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None,
                    reason="nvcc not on PATH: compiling the string kernels for half and bfloat16 needs the CUDA toolkit")
@pytest.mark.parametrize("ctype", list(STORAGE))
def test_string_kernels_compile_for_every_storage_type(monkeypatch, tmp_path, ctype):
    sources = collect_sources(monkeypatch)
    names = list(sources.values())
    body = "\n".join(_unique(s, k) for k, s in enumerate(sources))
    src = tmp_path / f"strings_{ctype}.cu"
    src.write_text('extern "C" {\n' + backend.prelude(STORAGE[ctype]) + body + "\n}\n")
    proc = subprocess.run(["nvcc", "-ptx", "-arch=sm_90", "-O3", "-o", str(tmp_path / "out.ptx"), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"string kernels ({', '.join(names)}) fail for {ctype}:\n{proc.stderr[-4000:]}"
    ptx = (tmp_path / "out.ptx").read_text()
    assert all(f"{name}__{k}" in ptx for k, name in enumerate(names))
