"""Random mutations of LeNet's prototxts end in project errors, never in numpy/Python exceptions.

Each case mutates one of examples/mnist's lenet.prototxt (deploy), lenet_train_test.prototxt
(TRAIN or TEST; its LMDBs replaced by a tiny one) or lenet_solver.prototxt (1 to 3 mutations:
numbers to 0, negative, huge, NaN/inf; wrong enum names; wrong strings, blob names and layer
types; deleted, inserted or duplicated fields and layers; swapped layers; truncated text), builds
the Net or Solver, and where it builds runs a forward (and backward, and for a solver an update)
under a host-memory limit of :data:`HOST_LIMIT`, so any over-large size must be refused before it
is allocated. Every failure must be a :class:`~pycaffe_lite.errors.CaffeError`. The default run
takes :data:`CI_CASES` seeded cases; the ``slow`` one all :data:`ALL_CASES`.
"""

from __future__ import annotations

import collections
import random
import re
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import io, memcheck
from pycaffe_lite.data import db
from pycaffe_lite.errors import CaffeError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist"
HOST_LIMIT = 256 << 20  # every LeNet blob is far smaller; anything larger is a mutated size
CI_CASES = 500
ALL_CASES = 2000

INTS = ["0", "1", "2", "3", "5", "27", "64", "1000", "65536", "2147483647", "-1", "-2147483648", "2147483648",
        "4294967295", "1000000000000"]
FLOATS = ["0", "-1", "0.5", "-0.5", "1e-30", "1e30", "-1e30", "nan", "inf", "-inf", "3.4e38", "1e300"]
NUMBERS = INTS + FLOATS
ENUMS = ["BOGUS", "MAX", "AVE", "STOCHASTIC", "LEVELDB", "LMDB", "TRAIN", "TEST", "CPU", "GPU", "FLOOR",
         "CEIL", "CAFFE", "CUDNN", "FAN_OUT", "AVERAGE", "true", "false", "HDF5", "SUM", "PROD"]
BLOBS = ["data", "label", "conv1", "pool1", "conv2", "pool2", "ip1", "ip2", "prob"]
TYPES = ["AbsVal", "Accuracy", "ArgMax", "BNLL", "BatchNorm", "Bias", "Clip", "Concat", "ContrastiveLoss",
         "Convolution", "Crop", "Deconvolution", "Dropout", "DummyData", "ELU", "Eltwise", "Embed", "EuclideanLoss",
         "Exp", "Flatten", "HingeLoss", "InfogainLoss", "InnerProduct", "LRN", "Log", "MVN",
         "MultinomialLogisticLoss", "PReLU", "Parameter", "Pooling", "Power", "ReLU", "Reduction", "Reshape",
         "SPP", "Scale", "Sigmoid", "SigmoidCrossEntropyLoss", "Silence", "Slice", "Softmax", "SoftmaxWithLoss",
         "Split", "Swish", "TanH", "Threshold", "Tile"]
STRINGS = ["", "bogus", "data", "label", "conv1", "pool1", "conv2", "ip1", "ip2", "loss", "prob", "accuracy",
           "Convolution", "Deconvolution", "Pooling", "SPP", "InnerProduct", "ReLU", "Softmax",
           "SoftmaxWithLoss", "Accuracy", "Input", "Data", "DummyData", "LRN", "Dropout", "Concat", "Split",
           "Flatten", "Reshape", "Eltwise", "BatchNorm", "Scale", "Embed", "PReLU", "Crop", "Slice",
           "ArgMax", "Tile", "Reduction", "MVN", "EuclideanLoss", "Silence", "xavier", "gaussian", "msra",
           "bilinear", "positive_unitball", "uniform", "constant", "step", "multistep", "poly", "exp",
           "sigmoid", "fixed", "inv", "Adam", "AdaGrad", "RMSProp", "Nesterov", "AdaDelta", "SGD",
           "/nonexistent/path", "L1"]
INSERTS = ["pad: {i}", "stride: {i}", "kernel_size: {i}", "dilation: {i}", "group: {i}", "pad_h: {i}",
           "pad_w: {i}", "stride_h: {i}", "stride_w: {i}", "kernel_h: {i}", "kernel_w: {i}", "axis: {i}",
           "num_output: {i}", "global_pooling: true", "round_mode: FLOOR", "pool: AVE", "bias_term: false",
           "engine: CAFFE", "batch_size: {i}", "crop_size: {i}", "mirror: true", "scale: {f}",
           "mean_value: {f}", "rand_skip: {i}", "prefetch: {i}", "std: {f}", "sparse: {i}"]
LAYER_INSERTS = ["propagate_down: false", "loss_weight: {f}", "param {{ lr_mult: {f} decay_mult: {f} }}",
                 'bottom: "{s}"', 'top: "{s}"', "phase: TRAIN", "include {{ phase: TEST }}",
                 "exclude {{ phase: TRAIN }}", "weight_filler {{ type: \"{s}\" }}",
                 'dropout_param {{ dropout_ratio: {f} }}', "inner_product_param {{ num_output: {i} axis: {i} }}",
                 "pooling_param {{ kernel_size: {i} stride: {i} pad: {i} }}",
                 "convolution_param {{ num_output: {i} kernel_size: {i} stride: {i} pad: {i} dilation: {i} }}",
                 "spp_param {{ pyramid_height: {i} }}", "lrn_param {{ local_size: {i} alpha: {f} beta: {f} }}",
                 "reshape_param {{ shape {{ dim: {i} dim: {i} }} }}", "tile_param {{ axis: {i} tiles: {i} }}",
                 "embed_param {{ num_output: {i} input_dim: {i} }}", "dummy_data_param {{ shape {{ dim: {i} }} }}",
                 "slice_param {{ axis: {i} slice_point: {i} }}", "crop_param {{ axis: {i} offset: {i} }}",
                 "reduction_param {{ axis: {i} coeff: {f} }}", "power_param {{ power: {f} scale: {f} shift: {f} }}",
                 "eltwise_param {{ coeff: {f} }}", "concat_param {{ axis: {i} }}", "argmax_param {{ top_k: {i} axis: {i} }}",
                 "batch_norm_param {{ eps: {f} moving_average_fraction: {f} }}", "mvn_param {{ eps: {f} }}",
                 "softmax_param {{ axis: {i} }}", "flatten_param {{ axis: {i} end_axis: {i} }}",
                 "scale_param {{ axis: {i} num_axes: {i} bias_term: true }}", "bias_param {{ axis: {i} num_axes: {i} }}",
                 "accuracy_param {{ top_k: {i} axis: {i} ignore_label: {i} }}", "loss_param {{ ignore_label: {i} }}",
                 "clip_param {{ min: {f} max: {f} }}", "threshold_param {{ threshold: {f} }}",
                 "elu_param {{ alpha: {f} }}", "exp_param {{ base: {f} scale: {f} }}", "log_param {{ base: {f} }}",
                 "parameter_param {{ shape {{ dim: {i} dim: {i} }} }}", "prelu_param {{ channel_shared: true }}",
                 "contrastive_loss_param {{ margin: {f} }}", "hinge_loss_param {{ norm: L2 }}",
                 "dropout_param {{ dropout_ratio: {f} }}", "pooling_param {{ global_pooling: true pool: {e} }}"]
SOLVER_INSERTS = ["type: \"{s}\"", "lr_policy: \"{s}\"", "stepsize: {i}", "stepvalue: {i}", "iter_size: {i}",
                  "average_loss: {i}", "clip_gradients: {f}", "momentum2: {f}", "delta: {f}", "rms_decay: {f}",
                  "regularization_type: \"{s}\"", "test_iter: {i}", "random_seed: {i}", "snapshot_format: HDF5",
                  "solver_type: {e}", "iter_size: {i}", "test_initialization: false", "weights: \"{s}\""]

FIELD = re.compile(r"^(\s*)(\w+)(\s*:\s*)(.+?)\s*$")
VALUE = re.compile(r'(\w+)\s*:\s*("[^"\n]*"|[^\s{}"]+)')


def _blocks(lines: list[str], head: str = "layer {") -> list[tuple[int, int]]:
    """(first, last) line indices of each top-level block opening with ``head``."""
    found, depth, start = [], 0, None
    for i, line in enumerate(lines):
        if depth == 0 and line.strip().startswith(head):
            start = i
        depth += line.count("{") - line.count("}")
        if depth == 0 and start is not None:
            found.append((start, i))
            start = None
    return found


def _fill(template: str, rng: random.Random) -> str:
    return template.format(i=rng.choice(INTS), f=rng.choice(FLOATS), s=rng.choice(STRINGS), e=rng.choice(ENUMS),
                           t=rng.choice(TYPES))


def mutate(text: str, rng: random.Random, solver: bool) -> tuple[str, str]:
    """``text`` with one random mutation, and a description of it."""
    lines = text.splitlines()
    fields = [i for i, line in enumerate(lines) if FIELD.match(line) and "{" not in line]
    op = rng.choice(["value"] * 6 + ["delete", "insert", "insert", "duplicate", "swap", "truncate"])
    values = list(VALUE.finditer(text))
    if op == "value" and values:
        m = rng.choice(values)
        key, value = m.group(1), m.group(2)
        if value.startswith('"'):
            new = '"' + rng.choice(STRINGS) + '"'
        elif re.fullmatch(r"[A-Za-z_]\w*", value):
            new = rng.choice(ENUMS)
        elif re.fullmatch(r"-?\d+", value):
            new = "0" if rng.random() < 0.2 else rng.choice(INTS if rng.random() < 0.8 else FLOATS)
        else:
            new = rng.choice(FLOATS if rng.random() < 0.8 else INTS)
        return text[:m.start(2)] + new + text[m.end(2):], f"{key}: {value} -> {new} (character {m.start(2)})"
    if op == "delete" and fields:
        i = rng.choice(fields)
        return "\n".join(lines[:i] + lines[i + 1:]), f"deleted line {i + 1}: {lines[i].strip()}"
    layers = _blocks(lines) or [(0, len(lines) - 1)]  # (a truncated text may have no whole layer)
    if op == "insert":
        if solver:
            new = _fill(rng.choice(SOLVER_INSERTS), rng)
            i = rng.randrange(len(lines) + 1)
        else:
            params = [i for i, line in enumerate(lines) if re.match(r"\s*\w+_param\s*{", line)]
            if params and rng.random() < 0.6:
                i = rng.choice(params) + 1
                new = _fill(rng.choice(INSERTS), rng)
            elif rng.random() < 0.5:
                i = rng.choice(layers)[0] + 1
                new = _fill(rng.choice(LAYER_INSERTS), rng)
            else:  # a new layer of any type on an existing blob, with a parameter or two
                i = rng.choice(layers)[1] + 1
                bottom = rng.choice(BLOBS)
                extra = " ".join(_fill(rng.choice(LAYER_INSERTS), rng) for _ in range(rng.randrange(3)))
                new = f'layer {{ name: "new{i}" type: "{rng.choice(TYPES)}" bottom: "{bottom}" top: "new{i}" {extra} }}'
        return "\n".join(lines[:i] + [new] + lines[i:]), f"inserted at line {i + 1}: {new}"
    if op == "duplicate":
        a, b = rng.choice(layers)
        at = rng.choice(layers)[1] + 1
        return "\n".join(lines[:at] + lines[a:b + 1] + lines[at:]), f"layer at line {a + 1} copied to line {at + 1}"
    if op == "swap" and len(layers) > 1:
        (a0, a1), (b0, b1) = sorted(rng.sample(layers, 2))
        out = lines[:a0] + lines[b0:b1 + 1] + lines[a1 + 1:b0] + lines[a0:a1 + 1] + lines[b1 + 1:]
        return "\n".join(out), f"layers at lines {a0 + 1} and {b0 + 1} swapped"
    cut = rng.randrange(len(text) + 1)
    return text[:cut], f"truncated at character {cut}"


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, str]:
    """The three LeNet prototxts as texts, the train/test net reading a tiny LMDB."""
    tmp = tmp_path_factory.mktemp("lenet")
    rng = np.random.default_rng(0)
    with db.LMDBWriter(tmp / "lmdb") as w:
        for k in range(8):
            datum = io.array_to_datum(rng.integers(0, 256, (1, 28, 28), dtype=np.uint8), label=k)
            w.put(f"{k:08d}".encode(), datum.SerializeToString())
    train = (EXAMPLE / "lenet_train_test.prototxt").read_text()
    train = re.sub(r'source: "[^"]*"', f'source: "{tmp / "lmdb"}"', train)
    (tmp / "train_test.prototxt").write_text(train)
    solver = (EXAMPLE / "lenet_solver.prototxt").read_text()
    for old, new in ((r'net: "[^"]*"', f'net: "{tmp / "train_test.prototxt"}"'), (r"test_iter: \d+", "test_iter: 1"),
                     (r'snapshot_prefix: "[^"]*"', f'snapshot_prefix: "{tmp / "snap"}"'),
                     (r"solver_mode: GPU", "solver_mode: CPU")):
        solver = re.sub(old, new, solver)
    return {"deploy": (EXAMPLE / "lenet.prototxt").read_text(), "train_test": train, "solver": solver}


def _close(net) -> None:
    for layer in getattr(net, "layers", []):
        if hasattr(layer, "close"):
            layer.close()


def run_case(seed: int, bases: dict[str, str], folder: Path) -> tuple[str, str]:
    """Mutate, build and run one case: (outcome: 'built' or the project error's class, what was done).
    Any other exception propagates."""
    rng = random.Random(seed)
    kind = rng.choice(["deploy", "train_test", "train_test", "solver"])
    text, done = bases[kind], []
    for _ in range(rng.choice([1, 1, 2, 3])):
        text, what = mutate(text, rng, kind == "solver")
        done.append(what)
    path = folder / f"case{seed}.prototxt"
    path.write_text(text)
    caffe.set_mode_cpu()
    caffe.set_random_seed(seed)
    net = solver = None
    try:
        if kind == "solver":
            solver = caffe.get_solver(str(path), progress=False)
            solver.net.forward_backward()
            solver.apply_update()
            for net in solver.test_nets:
                net.forward()
        else:
            phase = rng.choice([caffe.TRAIN, caffe.TEST]) if kind == "train_test" else caffe.TEST
            net = caffe.Net(str(path), phase)
            net.forward()
            net.backward()
        return "built", f"{kind}: {'; '.join(done)}"
    except CaffeError as exc:
        return type(exc).__name__, f"{kind}: {'; '.join(done)}: {exc}"
    except Exception as exc:
        raise AssertionError(f"seed {seed}, {kind}: {'; '.join(done)}\n{''.join(traceback.format_exception(exc))}"
                             f"\n--- mutated text ---\n{text}") from None
    finally:
        _close(net)
        if solver is not None:
            for n in [solver.net, *solver.test_nets]:
                _close(n)
        caffe.set_mode_cpu()


def run_cases(count: int, bases, folder: Path, monkeypatch) -> collections.Counter:
    monkeypatch.setattr(memcheck, "host_limit", lambda: HOST_LIMIT)
    outcomes: collections.Counter = collections.Counter()
    failures = []
    start = time.perf_counter()
    for seed in range(count):
        try:
            with np.errstate(all="ignore"):  # mutated values may legitimately overflow to inf or NaN
                outcome, _ = run_case(seed, bases, folder)
            outcomes[outcome] += 1
        except AssertionError as exc:
            failures.append(str(exc))
    print(f"{count} mutated LeNet prototxts in {time.perf_counter() - start:.1f} s: {dict(outcomes)}")
    assert not failures, f"{len(failures)} of {count} cases raised a non-project error; first:\n" + failures[0]
    assert outcomes["built"] > count // 20, "too few mutants build: the mutations no longer test running"
    return outcomes


@pytest.mark.slow  # ~11 s: hundreds of mutants
def test_mutated_lenet_prototxts_give_project_errors(bases, tmp_path, monkeypatch):
    run_cases(CI_CASES, bases, tmp_path, monkeypatch)


@pytest.mark.slow
def test_2000_mutated_lenet_prototxts_give_project_errors(bases, tmp_path, monkeypatch):
    run_cases(ALL_CASES, bases, tmp_path, monkeypatch)
