"""benchmarks/zoo.py on the CPU: our side of a tiny run end to end (parent + worker subprocess),
the training variant of the deploy nets, argument handling and the table cells."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pycaffe_lite.schema import caffe_pb2

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo.py"


@pytest.fixture(scope="module")
def zoo():
    spec = importlib.util.spec_from_file_location("bench_zoo", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # puts benchmarks/ on sys.path (ours, peer_torch, timing)
    return mod


def test_every_net_has_its_prototxt(zoo):
    for name, net in zoo.NETS.items():
        assert (zoo.ZOO / net.prototxt).is_file(), name
    assert set(zoo.DEFAULT_NETS.split(",")) <= set(zoo.NETS)


def test_train_variant(zoo):
    import ours

    p = ours.zoo_param(zoo.ZOO / "resnet50_deploy.prototxt", 8, train=True)
    first, last = p.layer[0], p.layer[-1]
    assert first.type == "Input" and list(first.top) == ["data", "label"]
    assert [list(s.dim) for s in first.input_param.shape] == [[8, 3, 224, 224], [8]]
    assert last.type == "SoftmaxWithLoss" and list(last.bottom) == ["fc1000", "label"]
    assert not any(lp.type == "Softmax" for lp in p.layer)
    bns = [lp for lp in p.layer if lp.type == "BatchNorm"]
    assert bns and not any(lp.batch_norm_param.HasField("use_global_stats") for lp in bns)
    assert p.force_backward
    sq = ours.zoo_param(zoo.ZOO / "squeezenet_v1_1_deploy.prototxt", 2, train=True)
    assert list(sq.layer[-1].bottom) == ["pool10", "label"]
    test = ours.zoo_param(zoo.ZOO / "mobilenet_v2_deploy.prototxt", 1, train=False)
    assert list(test.layer[0].input_param.shape[0].dim) == [1, 3, 224, 224]
    assert test.layer[-1].type == "Softmax" and not test.force_backward
    assert isinstance(test, caffe_pb2.NetParameter)


def test_args(zoo):
    a = zoo.parse_args(["--quick"])
    assert (a.batch, a.iters, a.warmup) == (4, 2, 1) and a.net_list == zoo.DEFAULT_NETS.split(",")
    with pytest.raises(SystemExit):
        zoo.parse_args(["--nets", "resnet50,nope"])


def test_precision_and_forward_only_args(zoo):
    """--precision (AMP-style comparison) and --forward-only: what each worker times, the worker
    command line, the table's labels, and the contradictions refused."""
    from pycaffe_lite.precision import PRECISIONS

    assert zoo.PRECISIONS == PRECISIONS
    legacy = zoo.parse_args(["--tf32"])
    assert legacy.precision is None and zoo.step_drive(legacy) == "solver"  # as before: no update
    assert zoo.precision_text(legacy) == "TF32 allowed" and zoo.precision_text(zoo.parse_args([])) == "fp32"
    amp = zoo.parse_args(["--precision", "FP16", "--batch", "256"])
    assert amp.precision == "fp16" and zoo.step_drive(amp) == "update"  # the solver mode updates
    assert "autocast" in zoo.precision_text(amp) and "autocast" not in zoo.precision_text(
        zoo.parse_args(["--precision", "tf32"]))
    assert zoo.step_drive(zoo.parse_args(["--precision", "bf16", "--mode", "pycaffe"])) == "pycaffe"
    assert zoo.parse_args(["--tf32", "--precision", "tf32"]).precision == "tf32"
    fwd = zoo.parse_args(["--mode", "published", "--forward-only", "--batch", "32"])
    assert zoo.step_drive(fwd) == "forward" and zoo.prototxt(zoo.NETS["mobilenet_v2"], fwd.mode).name == \
        "mobilenet_v2_published_deploy.prototxt"
    assert zoo.header(fwd)[1:3] == ["fwd b32 ours ms", "fwd b32 peer ms"] and zoo.header(amp) == zoo.HEADER
    for bad in (["--tf32", "--precision", "bf16"], ["--precision", "tf32", "--cpu"], ["--precision", "fp8"]):
        with pytest.raises(SystemExit):
            zoo.parse_args(bad)


def test_worker_command_carries_precision(zoo, monkeypatch):
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        raise zoo.subprocess.TimeoutExpired(cmd, 1)

    monkeypatch.setattr(zoo.subprocess, "run", fake_run)
    zoo.spawn(zoo.parse_args(["--precision", "bf16", "--forward-only", "--nets", "vgg16"]), "peer", "vgg16")
    cmd = seen[0]
    assert cmd[cmd.index("--precision") + 1] == "bf16" and "--forward-only" in cmd and "--tf32" not in cmd
    zoo.spawn(zoo.parse_args(["--nets", "vgg16"]), "ours", "vgg16")
    assert "--precision" not in seen[1] and "--forward-only" not in seen[1]


def test_row_cells(zoo):
    mine = {"train_ms": 20.0, "latency_ms": 2.0,
            "memory": {"device": 3 * zoo.MIB, "peak": 3 * zoo.MIB, "pool": 2 * zoo.MIB}}  # backend.memory_held()
    peer = {"train_ms": 10.0, "latency_ms": 4.0, "memory": {"reserved": 2 * zoo.MIB, "device": 4 * zoo.MIB}}
    assert zoo.row("n", mine, peer) == ["n", "20.00", "10.00", "2.00x", "2.00", "4.00", "0.50x", "-", "-",
                                        "3", "2", "1.50x", "2", "4"]
    peer["latency_graph_ms"] = 1.0
    assert zoo.row("n", mine, peer)[7:9] == ["1.00", "2.00x"]  # ours / the peer's CUDA-graph replay
    assert len(zoo.HEADER) == len(zoo.row("n", mine, peer))
    cells = zoo.row("n", {"error": "boom"}, None)
    assert cells[1:4] == ["error", "-", "-"] and cells[9] == "error"


@pytest.mark.parametrize("mode", ["solver", pytest.param("pycaffe", marks=pytest.mark.slow),
                                  pytest.param("published", marks=pytest.mark.slow)])  # ~1 s each (a subprocess)
def test_cpu_smoke_ours(zoo, tmp_path, capsys, monkeypatch, mode):
    import peer_torch

    monkeypatch.setattr(peer_torch, "torchvision_available", lambda: "torchvision not installed (test)")
    out = tmp_path / "zoo.md"
    rc = zoo.main(["--cpu", "--nets", "squeezenet1_1", "--batch", "1", "--iters", "1", "--warmup", "0",
                   "--latency-iters", "1", "--mode", mode, "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "PEER MISSING" in text and f"mode {mode}" in out.read_text()
    cells = _table_row(out, "squeezenet1_1")
    assert float(cells[1]) > 0 and float(cells[4]) > 0  # our iteration and batch-1 times
    assert cells[2] == cells[3] == cells[7] == cells[9] == "-"  # no peer, no memory on the CPU


def test_modes(zoo):
    spec = zoo.NETS["mobilenet_v2"]
    assert zoo.prototxt(spec, "solver").name == "mobilenet_v2_deploy.prototxt"
    assert zoo.prototxt(spec, "published").name == "mobilenet_v2_published_deploy.prototxt"
    for name, net in zoo.NETS.items():
        assert zoo.prototxt(net, "published").is_file(), name
    assert [zoo.drive(m) for m in zoo.MODES] == ["solver", "pycaffe", "pycaffe"]
    assert zoo.parse_args(["--mode", "pycaffe"]).mode == "pycaffe"
    with pytest.raises(SystemExit):
        zoo.parse_args(["--mode", "nope"])


@pytest.mark.slow  # ~3 s: two subprocesses, one in bf16 on the CPU
@pytest.mark.parametrize("extra, step", [(["--precision", "bf16"], "update"),
                                         (["--forward-only", "--mode", "published"], "forward")])
def test_cpu_smoke_ours_precision_and_forward_only(zoo, tmp_path, capsys, monkeypatch, extra, step):
    import peer_torch

    monkeypatch.setattr(peer_torch, "torchvision_available", lambda: "torchvision not installed (test)")
    out = tmp_path / "zoo.md"
    rc = zoo.main(["--cpu", "--nets", "squeezenet1_1", "--batch", "2", "--iters", "1", "--warmup", "1",
                   "--latency-iters", "1", "--out", str(out), *extra])
    text = capsys.readouterr().out
    assert rc == 0, text
    table = out.read_text()
    assert f"timed step: {step}" in table and ("bf16 (AMP-style" in table) == ("bf16" in extra)
    cells = _table_row(out, "squeezenet1_1")
    assert float(cells[1]) > 0 and float(cells[4]) > 0


@pytest.mark.slow  # ~2 s
def test_ours_drives_in_half_on_the_cpu(zoo):
    """Our worker's update drive in bf16 (SGDSolver.step: masters, the update) and forward drive
    in fp16, in process: finite, half blobs, the precision reported."""
    import ours

    import pycaffe_lite as caffe

    try:
        deploy = zoo.prototxt(zoo.NETS["squeezenet1_1"], "solver")
        step, check = ours.zoo_step(deploy, 1, gpu=False, drive="update", precision="bf16")
        step()
        step()
        res = check()
        assert np.isfinite(res["loss"]) and res["loss_scale"] == 1.0 and res["params"] == 1_235_496
        step, check = ours.zoo_step(deploy, 1, gpu=False, drive="forward", precision="fp16")
        step()
        assert check()["params"] == 1_235_496
        assert caffe.get_precision() == "fp16"
        with pytest.raises(ValueError, match="solver, pycaffe, forward, update"):
            ours.zoo_step(deploy, 1, gpu=False, drive="x")
    finally:
        caffe.set_precision(None)


@pytest.mark.slow
def test_pycaffe_drive_reaches_the_input(zoo):
    """Our pycaffe-mode worker on a published file, in process: TEST net with force_backward,
    net.forward(); net.backward() gives a finite, nonzero data gradient."""
    import ours

    res = ours.zoo_net(zoo.prototxt(zoo.NETS["squeezenet1_1"], "published"), 1, 1, 0, 1, gpu=False,
                       drive="pycaffe")
    assert res["train_ms"] > 0 and res["latency_ms"] > 0 and res["params"] == 1_235_496
    with pytest.raises(ValueError):
        ours.zoo_net(zoo.prototxt(zoo.NETS["squeezenet1_1"], "solver"), 1, 1, 0, 1, gpu=False, drive="x")


def test_worker_timeout_is_reported(zoo):
    args = zoo.parse_args(["--cpu", "--nets", "vgg16", "--timeout", "0.01"])
    assert zoo.spawn(args, "ours", "vgg16") == {"error": "timed out after 0 s"}


def _table_row(path: Path, net: str) -> list[str]:
    line = next(ln for ln in path.read_text().splitlines() if ln.startswith(f"| {net} |"))
    return [c.strip() for c in line.strip("|").split("|")]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["solver", "pycaffe", "published"])
def test_gpu_quick_both_sides(zoo, tmp_path, capsys, mode):
    """GPU: a quick SqueezeNet row in each mode with our memory (pool within the device delta)
    and, where torchvision exists, the peer's columns (CUDA-graph replay included) and the ratios."""
    import peer_torch

    out = tmp_path / "zoo.md"
    rc = zoo.main(["--quick", "--nets", "squeezenet1_1", "--mode", mode, "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    cells = _table_row(out, "squeezenet1_1")
    assert float(cells[1]) > 0 and float(cells[4]) > 0
    pool_mib = float(cells[12])
    assert pool_mib > 0  # (the device-wide figure is exact only with no other process on the GPU)
    if peer_torch.torchvision_available() is None:
        assert float(cells[2]) > 0 and float(cells[7]) > 0 and float(cells[10]) > 0
        assert all(cells[i].endswith("x") for i in (3, 6, 8, 11))


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("extra", [["--precision", "fp16"], ["--precision", "bf16"], ["--precision", "tf32"],
                                   ["--forward-only", "--mode", "published"]])
def test_gpu_quick_precision_and_forward_only(zoo, tmp_path, capsys, extra):
    """GPU: a quick SqueezeNet row AMP-style in each precision (ours through caffe.set_precision, the
    peer channels_last under autocast with GradScaler for fp16, both updating) and forward-only."""
    import peer_torch

    out = tmp_path / "zoo.md"
    rc = zoo.main(["--quick", "--nets", "squeezenet1_1", "--out", str(out), *extra])
    text = capsys.readouterr().out
    assert rc == 0, text
    cells = _table_row(out, "squeezenet1_1")
    assert float(cells[1]) > 0 and float(cells[4]) > 0 and float(cells[12]) > 0
    if peer_torch.torchvision_available() is None:
        assert float(cells[2]) > 0 and float(cells[7]) > 0 and float(cells[10]) > 0
