"""The first hour and the bad day, part III (issue 37): each case a new user or a bad day meets,
rerun as reported, ends in the right result or one clean line naming the file, layer or record."""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import common, memcheck
from pycaffe_lite.commands import caffe_cli, cli
from pycaffe_lite.errors import CaffeError, DataError, GPUUnavailableError, NetError, WeightsError
from pycaffe_lite.proto import caffe_pb2
from pycaffe_lite.solvers.sgd_solvers import get_solver

REPO = Path(__file__).resolve().parents[2]

NET = """name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "out" loss_weight: 1
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
"""
SOLVER = """net: "net.prototxt"
base_lr: 0.01
lr_policy: "fixed"
max_iter: 2
display: 1
snapshot_prefix: "snap/tiny"
random_seed: 3
"""


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("net.prototxt").write_text(NET)
    Path("solver.prototxt").write_text(SOLVER)
    caffe.set_mode_cpu()
    return tmp_path


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def no_gpu(monkeypatch):
    """Make GPU mode unavailable, as on a CPU-only machine (also where a GPU is present)."""
    def refuse(*args):
        raise GPUUnavailableError("no CUDA device (test stand-in)")

    monkeypatch.setattr(common, "set_mode_gpu", refuse)
    monkeypatch.setattr(common, "set_device", lambda device: None)


# -- the main job's screen --------------------------------------------------------------------
def _train_lenet():
    spec = importlib.util.spec_from_file_location("train_lenet_screen", REPO / "examples" / "mnist" / "train_lenet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY_RUN = ["--iters", "4", "--every", "2", "--test-interval", "2", "--train-limit", "200", "--test-limit", "100"]


@pytest.mark.slow  # trains LeNet for 4 iterations, three times
def test_main_job_screen_bar_alone_plain_lines_without_terminal_and_log_with_verbose(tmp_path, capsys, monkeypatch):
    tl = _train_lenet()
    # no terminal (captured output): a plain line every 2 iterations, no log lines
    assert tl.main([*TINY_RUN, "--out", str(tmp_path / "a")]) == 0
    out, err = capsys.readouterr()
    assert re.findall(r"^iteration (\d+)/4: loss [\d.]+", out, re.M) == ["2", "4"]
    assert not re.search(r"^I\d{4} ", err, re.M), err[:500]
    # a terminal: the bar, and still no log line tearing it
    monkeypatch.setattr(tl, "terminal_width", lambda stream: 80)
    assert tl.main([*TINY_RUN, "--out", str(tmp_path / "b")]) == 0
    out, err = capsys.readouterr()
    assert "LeNet (CPU)" in err and "4/4" in err and not re.search(r"^I\d{4} ", err, re.M)
    assert "iteration 2/4" not in out
    # --verbose: Caffe's log lines too
    assert tl.main([*TINY_RUN, "--out", str(tmp_path / "c"), "--verbose", "--no-progress"]) == 0
    assert re.search(r"^I\d{4} .*Iteration 0", capsys.readouterr().err, re.M)


def test_main_job_checks_its_extras_before_any_work(tmp_path, capsys, monkeypatch):
    tl = _train_lenet()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (find_spec then says: not installed)
    assert tl.main([*TINY_RUN, "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert error_lines(err) == [err.strip()] and "Traceback" not in err
    assert "'matplotlib'" in err and "pycaffe-lite[data]" in err
    assert not (tmp_path / "o" / "mnist_train_lmdb").exists()  # refused before converting anything


# -- the caffe command on a CPU-only machine ---------------------------------------------------
def test_caffe_train_solver_mode_gpu_without_gpu_falls_back_with_one_warning(job, capsys, monkeypatch):
    no_gpu(monkeypatch)
    Path("solver.prototxt").write_text(SOLVER + "solver_mode: GPU\n")
    assert caffe_cli.run(["train", "-solver", "solver.prototxt"]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("W")]
    assert len(warned) == 1 and "solver_mode: GPU" in warned[0] and "training on the CPU" in warned[0]
    assert Path("snap/tiny_iter_2.caffemodel").is_file()
    # -cpu (and --cpu) are flags of caffe train: no warning
    for flag in ("-cpu", "--cpu"):
        assert caffe_cli.run(["train", "-solver", "solver.prototxt", flag]) == 0
        err = capsys.readouterr().err
        assert not [line for line in err.splitlines() if line.startswith("W")], err
    # -gpu 0 asks for the GPU: an error, one line
    assert caffe_cli.run(["train", "-solver", "solver.prototxt", "-gpu", "0"]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_caffe_test_shows_each_result_once(job, capsys):
    assert caffe_cli.run(["train", "-solver", "solver.prototxt", "-minloglevel", "1"]) == 0
    capsys.readouterr()
    assert caffe_cli.run(["test", "-model", "net.prototxt", "-weights", "snap/tiny_iter_2.caffemodel",
                          "-iterations", "2", "-log_dir", "logs"]) == 0
    out, err = capsys.readouterr()
    values = 4  # 'out' is (2, 2): four result lines
    assert len(re.findall(r"^out = ", out, re.M)) == values  # on stdout
    assert not re.search(r"\] out = ", err)  # not again in the console log (only its per-batch lines)
    logged = (job / "logs" / "caffe.INFO").read_text()
    assert len(re.findall(r"\] out = ", logged)) == values  # and in the log file, as BVLC's caffe test


# -- one rule: every command turns OSError / ValueError / project errors into one line ---------
@pytest.mark.parametrize("exc", [ValueError("could not convert string to float: 'x'"),
                                 PermissionError(errno.EACCES, "Permission denied", "/data/out.bin"),
                                 WeightsError("w.caffemodel: broken")])
def test_every_command_error_is_one_line_and_debug_shows_the_traceback(job, capsys, monkeypatch, exc):
    from pycaffe_lite.commands import test as test_command

    def fail(args):
        raise exc

    monkeypatch.setattr(test_command, "run", fail)
    argv = ["test", "--model", "net.prototxt", "--weights", "w"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and err.startswith("pycaffe-lite test: error: ")
    if isinstance(exc, OSError):
        assert "/data/out.bin: Permission denied (check its permissions" in err
    assert cli.main([*argv, "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("PYCAFFE_LITE_DEBUG", "1")
    assert cli.main(argv) == 1
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.delenv("PYCAFFE_LITE_DEBUG")
    # the caffe front end (and BVLC's tools through it): one F line; -debug adds the traceback
    assert caffe_cli.run(["test", "-model", "net.prototxt", "-weights", "w"]) == 1
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and err.startswith("F") and "caffe test: " in err
    assert caffe_cli.run(["test", "-model", "net.prototxt", "-weights", "w", "-debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


# -- raw tracebacks turned into one line -------------------------------------------------------
@pytest.fixture
def onnx_job(job):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    return job


def test_export_onnx_output_folder_problems_are_one_line(onnx_job, capsys, monkeypatch):
    Path("adir").mkdir()
    cases = [("missing/net.onnx", "the folder missing does not exist"), ("adir", "it is a folder")]
    for output, words in cases:
        assert cli.main(["export_onnx", "--model", "net.prototxt", "--output", output, "--no-check"]) == 1
        err = capsys.readouterr().err
        assert len(error_lines(err)) == 1 and words in err and "Traceback" not in err, err
    assert not Path("missing").exists()
    # a full disk (or a folder turned read-only) at the write: one line, and no truncated file or temporary
    from pycaffe_lite import durable

    def full(tmp, final):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(durable.os, "replace", full)
    assert cli.main(["export_onnx", "--model", "net.prototxt", "--output", "adir/net.onnx", "--no-check"]) == 1
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "adir/net.onnx" in err and "No space left" in err, err
    assert list(Path("adir").iterdir()) == []
    # net.to_onnx writes the same way
    net = caffe.Net("net.prototxt", caffe.TEST)
    with pytest.raises(CaffeError, match="No space left"):
        net.to_onnx("adir/net.onnx", check=False)
    monkeypatch.undo()
    os.chdir(onnx_job)
    net.to_onnx("adir/net.onnx", check=False)
    assert [p.name for p in Path("adir").iterdir()] == ["net.onnx"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_export_onnx_into_read_only_folder_is_one_line(onnx_job, capsys):
    Path("ro").mkdir()
    os.chmod("ro", 0o555)
    try:
        assert cli.main(["export_onnx", "--model", "net.prototxt", "--output", "ro/net.onnx", "--no-check"]) == 1
    finally:
        os.chmod("ro", 0o755)
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "ro/net.onnx: cannot write the ONNX model" in err


def test_hdf5_weights_with_string_datasets_name_the_layer(job, capsys):
    h5py = pytest.importorskip("h5py")
    with h5py.File("w.h5", "w") as f:
        g = f.create_group("data").create_group("ip1")
        g.create_dataset("0", data=np.array([["a"] * 3] * 4, dtype="S1"))
    net = caffe.Net("net.prototxt", caffe.TEST)
    with pytest.raises(WeightsError, match=r"w.h5: layer 'ip1' param 0: .*holds \|S1 values, not numbers"):
        net.copy_from("w.h5")
    assert caffe_cli.run(["test", "-model", "net.prototxt", "-weights", "w.h5", "-iterations", "1"]) == 1
    err = capsys.readouterr().err
    fatal = [line for line in err.splitlines() if line.startswith("F")]
    assert "Traceback" not in err and len(fatal) == 1 and "layer 'ip1' param 0" in fatal[0]


@pytest.fixture
def image_list(job):
    pytest.importorskip("cv2")
    from PIL import Image

    Image.fromarray(np.full((4, 5, 3), 90, np.uint8)).save("a.png")
    return job


def test_convert_imageset_label_out_of_int32_is_one_line(image_list, capsys):
    Path("list.txt").write_text("a.png 1\na.png 99999999999\n")
    assert caffe_cli.run(["convert_imageset", "./", "list.txt", "db"]) == 1
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "list.txt:2: the label 99999999999 does not fit" in err
    assert not Path("db").exists()


def test_convert_imageset_negative_labels_are_kept_with_one_warning(image_list, capsys):
    from pycaffe_lite.commands import _tools

    Path("list.txt").write_text("a.png -3\na.png 2\na.png -1\n")
    assert caffe_cli.run(["convert_imageset", "./", "list.txt", "db"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("W")]
    assert len(warned) == 1 and "2 negative labels (first on line 1)" in warned[0]
    labels = []
    for _, value in _tools.read_records("db", "lmdb"):
        datum = caffe_pb2.Datum()
        datum.ParseFromString(value)
        labels.append(datum.label)
    assert labels == [-3, 2, -1]


def test_snapshot_folder_turning_read_only_gives_one_error_not_two_tracebacks(job, capsys, monkeypatch):
    from pycaffe_lite import durable
    from pycaffe_lite.solvers import snapshot as snap_module

    real_unlink = Path.unlink

    def unlink(self, missing_ok=False):
        if self.name.endswith(".lock"):
            raise PermissionError(errno.EROFS, "Read-only file system", str(self))
        return real_unlink(self, missing_ok=missing_ok)

    def read_only(final, data):
        raise OSError(errno.EROFS, "Read-only file system", str(final))

    monkeypatch.setattr(Path, "unlink", unlink)
    monkeypatch.setattr(snap_module, "write_temp", read_only)
    monkeypatch.setattr(durable, "write_temp", read_only)
    assert cli.main(["train", "--solver", "solver.prototxt", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Read-only file system" in errors[0]
    assert "cannot remove the snapshot lock" in err  # the lock's trouble: a warning


def test_forward_with_strings_names_the_input(job):
    net = caffe.Net("net.prototxt", caffe.TEST)
    with pytest.raises(NetError, match=r"net 'tiny': input 'data': holds <U1 values .*expected numbers"):
        net.forward(data=np.full((2, 3), "x"))
    with pytest.raises(NetError, match="input 'data'"):
        net.forward(data=[[1, 2], [3]])  # ragged
    with pytest.raises(NetError, match="diff for 'out'"):
        net.backward(out=np.full((2, 2), "x", dtype=object))


# -- silent or misleading ----------------------------------------------------------------------
def test_two_solvers_of_one_process_with_one_prefix_are_said(job, caplog):
    """A warning, not an error: comparing two solvers of one file, or resuming in the process that
    wrote the snapshot, are what pycaffe scripts do."""
    a = get_solver("solver.prototxt", progress=False)
    b = get_solver("solver.prototxt", progress=False)
    a.step(1)
    with caplog.at_level("WARNING", logger="pycaffe_lite"):
        b.step(1)
    said = [r.getMessage() for r in caplog.records if "also used by another Solver" in r.getMessage()]
    assert len(said) == 1 and "iteration 1 of 2" in said[0] and "overwrite each other's" in said[0]
    a.step(1)  # (said again: b is mid-run) a reached max_iter: nothing to say when b trains on
    caplog.clear()
    with caplog.at_level("WARNING", logger="pycaffe_lite"):
        b.step(1)
    assert not [r for r in caplog.records if "also used by another Solver" in r.getMessage()]


@pytest.mark.parametrize("field", ["scale: nan", "scale: inf", "mean_value: 1 mean_value: -inf"])
def test_non_finite_transform_param_is_refused(job, field):
    from pycaffe_lite.data import mnist

    images, labels = mnist.load_split(mnist.SHIPPED_DIR, "test")
    mnist.write_lmdb(images[:4], labels[:4], job / "db")
    Path("d.prototxt").write_text(f'''layer {{ name: "d" type: "Data" top: "data" top: "label"
      data_param {{ source: "db" batch_size: 2 backend: LMDB }} transform_param {{ {field} }} }}''')
    with pytest.raises(DataError, match=r"layer 'd'.*transform_param\.(scale|mean_value) is -?(nan|inf); expected a finite"):
        caffe.Net("d.prototxt", caffe.TRAIN)


def test_test_interval_without_test_iter_is_a_warning(job, caplog):
    Path("solver.prototxt").write_text(SOLVER + "test_interval: 1\n")
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        get_solver("solver.prototxt", progress=False)
    assert any("test_interval: 1 is set but no test_iter is given: no test net is made" in r.getMessage()
               for r in caplog.records)


def test_duplicate_layer_names_warning_says_what_happened(job, caplog):
    Path("dup.prototxt").write_text("""name: "tiny"
    layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "a" inner_product_param { num_output: 4 } }
    layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "b" inner_product_param { num_output: 4 } }""")
    net = caffe.Net("dup.prototxt", caffe.TEST)
    net.save("dup.caffemodel")  # two layers named ip1 in the file too
    with caplog.at_level(logging.WARNING, logger="pycaffe_lite"):
        missing = caffe.Net("dup.prototxt", caffe.TEST).copy_from("dup.caffemodel")
    assert missing == ["ip1"]
    text = " ".join(r.getMessage() for r in caplog.records)
    first, second = [i for i, n in enumerate(caffe.Net("dup.prototxt", caffe.TEST)._layer_names) if n == "ip1"]
    assert f"holds 2 layers named 'ip1'; all were copied into net layer #{first}" in text
    assert (f"has 2 layers named 'ip1': the weights went to layer #{first} only and layer #{second} keeps its "
            "initial values") in text
    assert "first net layer of a name, as in BVLC" in text and "no weights for layer ip1" not in text


def test_empty_solverstate_and_caffemodel_as_state_are_named(job, capsys):
    Path("empty.solverstate").write_bytes(b"")
    assert cli.main(["train", "--solver", "solver.prototxt", "--snapshot", "empty.solverstate"]) == 1
    assert "empty.solverstate: the solver state file is empty" in capsys.readouterr().err
    caffe.Net("net.prototxt", caffe.TEST).save("w.caffemodel")
    Path("w.state").write_bytes(Path("w.caffemodel").read_bytes())
    solver = get_solver("solver.prototxt", progress=False)
    with pytest.raises(WeightsError, match=r"w.state: is a .caffemodel \(weights of net 'tiny'\), not a solver "
                                           r"state: pass it with --weights"):
        solver.restore("w.state")
    assert cli.main(["train", "--solver", "solver.prototxt", "--snapshot", "w.state"]) == 1
    err = capsys.readouterr().err
    assert "is a .caffemodel" in err and "holds 0 history blobs" not in err


def test_weights_beyond_memory_are_refused_before_filling(job, monkeypatch):
    from pycaffe_lite import fillers

    monkeypatch.setattr(memcheck, "host_available", lambda: (1 << 30, "of memory (test limit)"))
    filled = []
    real_fill = fillers.fill
    monkeypatch.setattr(fillers, "fill", lambda blob, *a, **k: (filled.append(blob.shape), real_fill(blob, *a, **k)))
    Path("big.prototxt").write_text('''name: "big"
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 60000 } } }
    layer { name: "small" type: "InnerProduct" bottom: "x" top: "s" inner_product_param { num_output: 2 } }
    layer { name: "huge" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 6000 } }''')
    with pytest.raises(memcheck.OutOfMemoryError) as info:
        caffe.Net("big.prototxt", caffe.TEST)
    message = str(info.value)
    assert "layer 'huge' param (6000, 60000) 1.3 GiB" in message and "more than the 1.0 GiB" in message
    assert "a smaller batch_size does not shrink params" in message and "use a smaller batch_size" not in message
    assert (6000, 60000) not in filled  # refused before the 1.3 GiB were filled
    # data blobs dominating: the batch size is the advice
    monkeypatch.setattr(memcheck, "host_available", lambda: (1 << 20, "of memory (test limit)"))
    Path("wide.prototxt").write_text('''name: "wide"
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 64 dim: 3 dim: 64 dim: 64 } } }''')
    with pytest.raises(memcheck.OutOfMemoryError, match="use a smaller batch_size"):
        caffe.Net("wide.prototxt", caffe.TEST)


def test_bbox_decode_of_wild_predictions_is_finite_and_silent():
    from pycaffe_lite import bbox

    priors = np.array([[0.1, 0.1, 0.3, 0.4], [0.5, 0.5, 0.9, 0.7]], np.float32)
    variances = np.full((2, 4), 0.2, np.float32)
    loc = np.array([[0.5, -0.5, 2000.0, 1e30], [0.1, 0.2, 0.3, -0.4]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        boxes = bbox.decode(priors, variances, loc, bbox.CENTER_SIZE, False)
        overlaps = bbox.iou(boxes, boxes)
    assert np.isfinite(boxes).all() and np.isfinite(overlaps).all()
    # ordinary predictions decode exactly as before (exp unchanged below the cap)
    t = loc[1] * variances[1]
    pw, ph = priors[1, 2] - priors[1, 0], priors[1, 3] - priors[1, 1]
    assert np.isclose(boxes[1, 2] - boxes[1, 0], np.exp(t[2]) * pw) and np.isclose(boxes[1, 3] - boxes[1, 1],
                                                                                    np.exp(t[3]) * ph)


@pytest.mark.slow  # builds and runs an SSD net (small width)
def test_ssd_detect_with_random_weights_warns_and_draws_few(tmp_path, capsys):
    pytest.importorskip("PIL")
    spec = importlib.util.spec_from_file_location("ssd_detect_fh", REPO / "examples" / "ssd" / "detect.py")
    assert spec is not None and spec.loader is not None
    detect = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(detect)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert detect.main(["--net", "ssdlite", "--width", "0.0625", "--num-classes", "4", "--out",
                            str(tmp_path / "d.png"), "--max-boxes", "5"]) == 0
    out, err = capsys.readouterr()
    assert "random weights" in err
    assert re.search(r", [0-5] drawn ", out)


def test_readme_python_snippets_import_what_exists():
    """Every ``from pycaffe_lite... import name`` in the READMEs' Python blocks imports."""
    for page in (REPO / "README.md", REPO / "examples" / "mnist" / "README.md"):
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
        for block in blocks:
            for line in block.splitlines():
                if re.match(r"\s*(from pycaffe_lite\S* import |import pycaffe_lite)", line):
                    exec(line.strip(), {})  # noqa: S102 (an import line of our own docs)


@pytest.mark.slow  # runs DeepLab and SegNet (small) as the README says
def test_segmentation_readme_commands_run_both_nets(tmp_path, monkeypatch, capsys):
    pytest.importorskip("PIL")
    from PIL import Image

    spec = importlib.util.spec_from_file_location("segment_fh", REPO / "examples" / "segmentation" / "segment.py")
    assert spec is not None and spec.loader is not None
    segment = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(segment)
    monkeypatch.chdir(tmp_path)
    Image.fromarray(np.full((40, 50, 3), 120, np.uint8)).save("photo.jpg")
    readme = (REPO / "examples" / "segmentation" / "README.md").read_text()
    commands = re.findall(r"^\s+python examples/segmentation/segment\.py (.*)$", readme, re.M)
    assert any("--arch segnet" in c and "--prototxt" not in c for c in commands)
    for command in commands:
        argv = command.split() + ["--size", "64", "--classes", "3"]
        assert segment.main(argv) == 0
        out = argv[argv.index("--out") + 1]
        assert Image.open(out).size == (50, 40)
    assert capsys.readouterr().out.count("wrote ") == len(commands)
