"""benchmarks/conv_passes.py on the CPU: its shape table and argument checks (the timing needs a GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "conv_passes.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_conv_passes", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_named_shapes_are_the_layers_the_docs_quote(bench):
    prob, bias = bench.problem("vgg1_2")
    assert (prob.num, prob.channels, prob.height, prob.out_hw, prob.num_output, bias) == (32, 64, 224, (224, 224), 64, True)
    prob, bias = bench.problem("1x1_7")
    assert prob.kernel == (1, 1) and prob.out_hw == (7, 7) and not bias
    from pycaffe_lite.conv import engines as conv_engines

    assert set(bench.ENGINES.split(",")) <= set(conv_engines.ENGINES)


@pytest.mark.parametrize("argv, message", [(["--shapes", "vgg9"], "unknown shape(s) vgg9"),
                                           (["--engines", "cudnn"], "unknown engine(s) cudnn")])
def test_unknown_names_are_refused_before_any_gpu_work(bench, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err
