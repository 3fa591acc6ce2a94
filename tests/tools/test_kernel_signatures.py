"""Kernel signatures read from CUDA source (pure Python: runs without a GPU)."""

from pathlib import Path

import pytest

from pycaffe_lite.gpu.signatures import SignatureError, check_args, parse_signatures

ROOT = Path(__file__).resolve().parents[2]


def test_plain_and_macro_generated_kernels():
    src = """
    // a comment with __global__ void fake(int x)
    #define PARAMS const int a, \\
        const Dtype* b
    #define MAKE(NAME, T) \\
      __global__ void __launch_bounds__(256) NAME(const T* x, PARAMS, Dtype* y) { }
    __global__ void plain(const int n, const float* __restrict__ x, unsigned int seed, long long big,
                          const Dtype alpha, double d) {}
    MAKE(made_float, float)
    template <int B> __global__ void templ(const int n) {}
    """
    sigs = parse_signatures(src)
    assert set(sigs) == {"plain", "made_float"}
    assert [(p.name, p.kind) for p in sigs["plain"].params] == [
        ("n", "int"), ("x", "ptr"), ("seed", "uint"), ("big", "int64"), ("alpha", "scalar"), ("d", "double")]
    assert sigs["plain"].struct_codes("f") == "iPIqfd"
    assert sigs["plain"].counts_items
    assert [p.kind for p in sigs["made_float"].params] == ["ptr", "int", "ptr", "ptr"]
    assert not sigs["made_float"].counts_items


def test_mtype_parameters_have_their_own_kind():
    sig = parse_signatures("__global__ void k(const int n, const Dtype a, const Mtype b, Mtype* part) {}")["k"]
    assert [p.kind for p in sig.params] == ["int", "scalar", "mscalar", "ptr"]
    assert sig.struct_codes("f") == "iffP"  # float and double: Mtype is Dtype
    assert sig.struct_codes("d") == "iddP"
    assert sig.struct_codes("e", "f") == "iefP"  # float16: Dtype a half, Mtype a float
    check_args(sig, (3, 0.5, 0.25, 1234))
    with pytest.raises(TypeError, match="argument 2 'b' \\(Mtype scalar\\) got str"):
        check_args(sig, (3, 0.5, "x", 1234))


def test_struct_by_value_is_refused():
    with pytest.raises(SignatureError, match="'t' has type 'int4'"):
        parse_signatures("__global__ void k(const int n, int4 t) {}")


def test_check_args_names_kernel_and_argument():
    sig = parse_signatures("__global__ void relu(const int n, const Dtype* x, Dtype* y, Dtype slope) {}")["relu"]
    check_args(sig, (10, 1234, 5678, 0.5))
    with pytest.raises(TypeError, match=r"kernel relu \(f.cu\): takes 4 arguments \(n, x, y, slope\), got 3"):
        check_args(sig, (10, 1, 2), "f.cu")
    with pytest.raises(ValueError, match="argument 2 'y' .* null device pointer"):
        check_args(sig, (10, 1, 0, 0.5))
    with pytest.raises(ValueError, match="argument 0 'n' .* does not fit"):
        check_args(sig, (2**31, 1, 2, 0.5))
    with pytest.raises(TypeError, match="argument 3 'slope' .* expected a number"):
        check_args(sig, (10, 1, 2, "x"))
    with pytest.raises(TypeError, match="argument 0 'n' .* non-integer"):
        check_args(sig, (1.5, 1, 2, 0.5))


@pytest.mark.slow
def test_every_cu_file_parses():
    files = [p for p in ROOT.rglob("*.cu") if ".venv" not in p.parts and ".device" not in p.parts]
    assert files
    total = 0
    for path in files:
        sigs = parse_signatures(path.read_text())
        assert sigs, f"{path}: no __global__ kernels found"
        total += len(sigs)
    assert total > 50  # (elementwise kernels generated from layer statements live in no .cu file)
