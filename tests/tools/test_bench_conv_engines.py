"""benchmarks/conv_engines.py on the CPU: the zoo's convolution shapes (counts, merging, batch
change), the per-net sums and the targets' summary."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test reads the zoo's shapes: building every zoo net takes seconds

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "conv_engines.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_conv_engines", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # puts benchmarks/ on sys.path (ours, peer_torch, zoo)
    return mod


@pytest.fixture(scope="module")
def shapes(bench):
    return bench.zoo_conv_shapes(bench.ZOO_NETS.split(","))


def test_every_convolution_of_each_net(shapes):
    counts = {name: (sum(s.values()), len(s)) for name, s in shapes.items()}
    assert counts == {"resnet50": (53, 20), "vgg16": (13, 9), "googlenet": (57, 49), "mobilenet_v2": (52, 30),
                      "squeezenet1_1": (26, 18)}


def test_identical_shapes_merge_with_their_multiplicity(shapes):
    vgg = {(p.channels, p.height, p.num_output): n for (p, bias), n in shapes["vgg16"].items()}
    assert vgg == {(3, 224, 64): 1, (64, 224, 64): 1, (64, 112, 128): 1, (128, 112, 128): 1, (128, 56, 256): 1,
                   (256, 56, 256): 2, (256, 28, 512): 1, (512, 28, 512): 2, (512, 14, 512): 3}
    assert all(bias and p.num == 1 and p.kernel == (3, 3) for p, bias in shapes["vgg16"])
    resnet = shapes["resnet50"]
    conv1 = next(p for p, bias in resnet if p.kernel == (7, 7))
    assert (conv1.channels, conv1.stride, resnet[conv1, True]) == (3, (2, 2), 1)  # ResNet's conv1 has a bias
    assert sum(n for (p, bias), n in resnet.items() if not bias) == 52
    # res2b/res2c branch2a: 256 -> 64 1x1 at 56x56, twice (res2a's branch2a reads 64 channels)
    assert sum(n for (p, _), n in resnet.items() if (p.channels, p.num_output, p.height) == (256, 64, 56)) == 2
    depthwise = [(p, n) for (p, _), n in shapes["mobilenet_v2"].items() if p.group > 1]
    assert depthwise and all(p.group == p.channels == p.num_output for p, _ in depthwise)
    assert sum(n for _, n in depthwise) == 17


def test_batch_change_keeps_geometry_and_drops_plans(bench, shapes):
    prob = next(iter(shapes["vgg16"]))[0]
    prob.cache["plan"] = 1
    big = bench.at_batch(prob, 32)
    assert (big.num, big.channels, big.kernel, big.pad) == (32, prob.channels, prob.kernel, prob.pad)
    assert big.cache == {} and "n32 c3 224x224 k64 3x3 p1 +bias" == bench.label((big, True))


def test_sums_and_targets(bench, shapes):
    def ms(fwd, bwd):
        return {"fwd_ms": fwd, "bwd_ms": bwd}

    net = Counter({("a", False): 3, ("b", True): 1})
    times = {("a", False): {"default": ms(1.0, 2.0), "cudnn": ms(2.0, 2.0)},
             ("b", True): {"default": ms(4.0, 0.0), "cudnn": ms(1.0, 1.0)}}
    assert bench.net_sums(net, times) == {"ours_fwd": 7.0, "ours_bwd": 6.0, "cudnn_fwd": 7.0, "cudnn_bwd": 7.0}
    sums = {("resnet50", 32): bench.net_sums(net, times), ("vgg16", 32): bench.net_sums(net, times),
            ("resnet50", 1): dict.fromkeys(("ours_fwd", "cudnn_fwd"), 1.0)}
    lines = bench.summary(sums, tf32=False)  # MobileNet v2 missing: no batch-1 target
    assert len(lines) == 1 and "batch 32, fwd+bwd (fp32)" in lines[0] and "0.93x  target <= 1.0x  MET" in lines[0]
    assert "target <= 1.2x" in bench.summary(sums, tf32=True)[0]


def test_zoo_report(bench, shapes, monkeypatch, capsys):
    """The report's rows, per-net sums and targets, with made-up timings (ours half of cuDNN)."""
    def fake_measure(prob, bias, engines, backward, args):
        peer = {"fwd_ms": 2.0 * prob.num, "bwd_ms": 4.0 * prob.num if backward else 0.0}
        return {"cudnn": peer, "default": {k: v / 2 for k, v in peer.items()} | {"engines": "fwd gemm"}}

    monkeypatch.setattr(bench, "measure", fake_measure)
    args = bench.argparse.Namespace(batches="1,32", tf32=False, timing="device")
    nets = {n: shapes[n] for n in ("resnet50", "vgg16", "mobilenet_v2")}
    out = bench.run_zoo(args, [], nets)
    text = capsys.readouterr().out
    assert "SUM resnet50       batch  32: ours fwd  1696.00 bwd  3392.00 ms" in text  # 53 layers x 32 x 1, 2
    assert len(out["targets"]) == 2 and all("0.50x" in line and "MET" in line for line in out["targets"])
    assert len(out["shapes"]) == 2 * len(set(nets["resnet50"]) | set(nets["vgg16"]) | set(nets["mobilenet_v2"]))
