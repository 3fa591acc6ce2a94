#!/usr/bin/env python3
"""Train LeNet on MNIST end to end with Caffe's recipe (examples/mnist/lenet_solver.prototxt).

    python examples/mnist/train_lenet.py [--data DIR] [--gpu N] [--precision P] [--iters K] [--out DIR]

Data: the full MNIST (60,000 training and 10,000 test images). The four standard files ship with
the repository in ``examples/mnist/data`` (SHA-256 checked at load; no network needed);
``--data DIR`` or ``$MNIST_DIR`` name another folder holding them (a folder without them is an
error). The run prints where the data came from and how many images it uses.

Steps: check the extras it needs (``lmdb``, ``matplotlib``: one line naming what to install),
convert to LMDB (``OUT/mnist_{train,test}_lmdb``), train with the solver (the test net runs every
``test_interval`` iterations), snapshot ``OUT/lenet_main_iter_K.caffemodel``, plot training loss and
test accuracy to ``OUT/lenet_curves.png`` and print a one-line summary.

``--precision fp32|tf32|fp16|bf16`` trains in that precision (``caffe.set_precision``,
docs/precision.md: fp16/bf16 store LeNet's blobs and weights in half and compute in float32, with
float32 master weights; fp16 scales the loss adaptively); tf32 needs ``--gpu``.

The screen: in a terminal, one progress bar (loss, last test accuracy) and nothing else but
warnings, printed above it; Caffe's INFO log lines with ``--verbose``. When stderr is not a
terminal (a file, a pipe, CI) or the terminal has no size, one plain line every ``--every``
iterations instead of the bar. Errors are one line (``--debug``: with the traceback).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def find_mnist(data_dir: str | None):
    """((train images, labels), (test images, labels), description): the full MNIST from
    ``--data``, else ``$MNIST_DIR``, else the copy shipped in examples/mnist/data (SHA-256 checked).
    A given folder without the four files is an error (DataError), never silently skipped."""
    from pycaffe_lite.data import mnist

    directory, where = mnist.locate(data_dir)
    return mnist.load_split(directory, "train"), mnist.load_split(directory, "test"), f"MNIST from {where}"


def build_solver_param(out: Path, iters: int | None, test_batches: int, test_interval: int | None,
                       cache_on_device: bool = False):
    """Caffe's lenet_solver.prototxt with the net inlined and pointed at our LMDBs; with
    ``cache_on_device`` the Data layers keep MNIST in GPU memory (pycaffe-lite's extension)."""
    from pycaffe_lite.proto import protoio
    from pycaffe_lite.schema import caffe_pb2

    sp = protoio.read_text(HERE / "lenet_solver.prototxt", caffe_pb2.SolverParameter())
    net = protoio.read_text(HERE / "lenet_train_test.prototxt", caffe_pb2.NetParameter())
    for layer in net.layer:
        if layer.type == "Data":
            phase = layer.include[0].phase if layer.include else caffe_pb2.TRAIN
            name = "mnist_train_lmdb" if phase == caffe_pb2.TRAIN else "mnist_test_lmdb"
            layer.data_param.source = str(out / name)
            layer.data_param.cache_on_device = cache_on_device
    sp.ClearField("net")
    sp.net_param.CopyFrom(net)
    if iters is not None:
        sp.max_iter = iters
    sp.snapshot = 0  # we snapshot once at the end
    sp.snapshot_prefix = str(out / "lenet_main")  # (lenet_solver.prototxt writes lenet_iter_K: kept apart)
    del sp.test_iter[:]
    sp.test_iter.append(test_batches)
    if test_interval is not None:
        sp.test_interval = test_interval
    return sp


def plot_curves(path: Path, losses: list[float], tests: list[tuple[int, float]], title: str) -> tuple[float, float, float]:
    """Write the loss/accuracy plot; the title is wrapped (and its font shrunk if need be) so it fits
    the figure. Returns the title's left and right edge and the figure's width, in pixels."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    its = np.arange(len(losses))
    ax.plot(its, losses, color="tab:blue", alpha=0.3, lw=0.8, label="training loss")
    if len(losses) >= 20:
        k = max(10, len(losses) // 100)
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(its[k - 1 :], smooth, color="tab:blue", lw=1.5, label=f"training loss ({k}-iter mean)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax2 = ax.twinx()
    if tests:
        x, acc = zip(*tests)
        ax2.plot(x, acc, "o-", color="tab:red", label="test accuracy")
    ax2.set_ylabel("test accuracy")
    ax2.set_ylim(min([0.9] + [a - 0.01 for _, a in tests]), 1.0)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper center", bbox_to_anchor=(0.5, -0.14),
              ncol=3, frameon=False)
    text = ax.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=11)
    fig.tight_layout()
    fig.canvas.draw()
    width = fig.bbox.width
    for size in (10, 9, 8, 7):  # (a narrow figure or a long path: shrink until it fits)
        box = text.get_window_extent()
        if box.x0 >= 0 and box.x1 <= width:
            break
        text.set_fontsize(size)
        fig.tight_layout()
        fig.canvas.draw()
    box = text.get_window_extent()
    fig.savefig(path)
    plt.close(fig)
    return float(box.x0), float(box.x1), float(width)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="folder with the four MNIST files (default: $MNIST_DIR, else the shipped examples/mnist/data)")
    parser.add_argument("--gpu", type=int, default=None, metavar="N", help="train on GPU N (default: CPU)")
    parser.add_argument("--precision", default=None, type=str.lower, choices=("fp32", "tf32", "fp16", "bf16"),
                        help="train in this precision (default: the prototxt's, float32); tf32 needs --gpu")
    parser.add_argument("--iters", type=int, default=None, help="iterations (default: max_iter of the solver, 10000)")
    parser.add_argument("--out", default=str(HERE), help="folder for the LMDBs, weights and plot (default: examples/mnist)")
    parser.add_argument("--train-limit", type=int, default=None, help="use only the first N training images")
    parser.add_argument("--test-limit", type=int, default=None, help="use only the first N test images (multiple of 100)")
    parser.add_argument("--test-interval", type=int, default=None, help="test every N iterations (default: 500)")
    parser.add_argument("--seed", type=int, default=1,
                        help="random seed (solver random_seed; default 1, so runs repeat; -1: from the clock, as Caffe)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-device-cache", action="store_true",
                        help="with --gpu: read batches from the LMDB on the host instead of keeping MNIST on the GPU")
    parser.add_argument("--verbose", action="store_true", help="also show the solver's log lines (Caffe style)")
    parser.add_argument("--every", type=int, default=500, metavar="N",
                        help="without a terminal: one progress line every N iterations (default 500)")
    parser.add_argument("--debug", action="store_true", help="on an error, also print the traceback")
    args = parser.parse_args(argv)
    from pycaffe_lite.commands._errors import run_guarded

    log = logging.getLogger("pycaffe_lite")
    level, handlers = log.level, list(log.handlers)
    try:  # no GPU or PyCUDA, bad data, a missing extra, disk problems: one line, no traceback
        return run_guarded("train_lenet", lambda: _train(args),
                           lambda message: print(f"error: {message}", file=sys.stderr), args.debug)
    finally:  # (the logging set-up is this run's: a caller's stays as it was)
        log.setLevel(level)
        log.handlers[:] = handlers


EXTRAS = ("lmdb", "matplotlib")  # the LMDBs and the plot (pycaffe-lite's 'data' extra)


def check_extras() -> None:
    """MissingDependencyError naming every extra this script needs that is not installed, before
    any work (found without importing them)."""
    from pycaffe_lite.optional import require_all

    require_all(EXTRAS, "train_lenet.py")


def terminal_width(stream) -> int:
    """The width of the terminal ``stream`` writes to; 0 when it is not a terminal or has no size
    (then a bar cannot be drawn: plain lines are printed instead)."""
    try:
        if not stream.isatty():
            return 0
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def _output_folder(path: str) -> Path:
    """``--out``, created if needed and writable, or a CaffeError saying why not."""
    from pycaffe_lite.errors import CaffeError

    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CaffeError(f"--out {out}: cannot create the folder: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK):
        raise CaffeError(f"--out {out}: the folder is not writable (give another folder with --out)")
    return out


def _use_device(caffe, gpu: int | None) -> str:
    if gpu is None:
        caffe.set_mode_cpu()
        return "CPU"
    caffe.set_device(gpu)
    caffe.set_mode_gpu()
    return f"GPU {gpu}"


def _use_precision(precision: str | None, device: str) -> str:
    """``--precision``: the switch set for the nets built next; the device text with it."""
    if precision is None:
        return device
    from pycaffe_lite.commands import use_precision

    use_precision(precision)  # (tf32 without --gpu: a one-line error)
    return f"{device}, {precision}"


def _stored(solver, precision: str) -> str:
    """The line saying how the training net stores LeNet's weights (bfloat16: uint16 bit patterns)."""
    stored = solver.net.params["conv1"][0].dtype
    kind = {"float16": "float16", "uint16": "bfloat16"}.get(stored.name, stored.name)
    masters = ", float32 master weights" if kind != "float32" else ""
    return f"Precision: {precision} (weights and blobs stored as {kind}{masters})"


def _train(args: argparse.Namespace) -> int:
    import pycaffe_lite as caffe
    from pycaffe_lite.data import mnist
    from pycaffe_lite.solvers.sgd_solvers import get_solver

    # the solver's INFO lines only with --verbose; warnings always (above the bar, see below)
    caffe.init_log(0 if args.verbose else 1)
    check_extras()
    device = _use_device(caffe, args.gpu)  # before any work: no GPU or no PyCUDA is a one-line error
    device = _use_precision(args.precision, device)
    out = _output_folder(args.out)
    (train_x, train_y), (test_x, test_y), description = find_mnist(args.data)
    if args.train_limit:
        train_x, train_y = train_x[: args.train_limit], train_y[: args.train_limit]
    if args.test_limit:
        test_x, test_y = test_x[: args.test_limit], test_y[: args.test_limit]
    print(f"Data: {description}; using {len(train_y):,} training / {len(test_y):,} test images", flush=True)

    mnist.write_lmdb(train_x, train_y, out / "mnist_train_lmdb", overwrite=True)
    mnist.write_lmdb(test_x, test_y, out / "mnist_test_lmdb", overwrite=True)

    test_batch = 100
    test_batches = max(1, len(test_y) // test_batch)
    sp = build_solver_param(out, args.iters, test_batches, args.test_interval,
                            cache_on_device=args.gpu is not None and not args.no_device_cache)
    iters = sp.max_iter
    sp.random_seed = args.seed
    solver = get_solver(sp, progress=False)
    interval = sp.test_interval or iters
    if args.precision is not None:
        print(_stored(solver, args.precision), flush=True)

    losses: list[float] = []
    tests: list[tuple[int, float]] = []
    bar = None
    every = max(1, args.every)
    if not args.no_progress and terminal_width(sys.stderr) > 0:
        from tqdm import tqdm

        bar = tqdm(total=iters, desc=f"LeNet ({device})", unit="it", dynamic_ncols=True)
    started = time.perf_counter()

    def record_loss(iteration: int, loss: float) -> None:
        losses.append(loss)
        if bar is not None:
            bar.update(1)
            if len(losses) % 20 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}",
                                acc=f"{tests[-1][1]:.4f}" if tests else "-", refresh=False)
        elif not args.no_progress and (iteration + 1) % every == 0:  # no terminal: a plain line now and then
            rate = (iteration + 1) / max(time.perf_counter() - started, 1e-9)
            acc = f"{tests[-1][1]:.4f}" if tests else "-"
            print(f"iteration {iteration + 1}/{iters}: loss {np.mean(losses[-20:]):.4f}, test accuracy {acc}, "
                  f"{rate:.1f} it/s", flush=True)

    def run_test() -> float:
        acc = float(solver.test(0)["accuracy"][0])
        tests.append((solver.iter, acc))
        if bar is not None:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]) if losses else float('nan'):.4f}", acc=f"{acc:.4f}")
        return acc

    solver.iteration_hooks.append(record_loss)
    start = time.perf_counter()
    sp_interval = solver.param.test_interval
    solver.param.test_interval = 0  # testing is driven from here, to record the accuracy
    from contextlib import nullcontext

    from tqdm.contrib.logging import logging_redirect_tqdm

    # with the bar, log lines (warnings; all with --verbose) are written above it, not through it
    above = logging_redirect_tqdm(loggers=[logging.getLogger("pycaffe_lite")]) if bar is not None else nullcontext()
    try:
        with above:
            while solver.iter < iters:
                solver.step(min(iters, (solver.iter // interval + 1) * interval) - solver.iter)
                run_test()
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - start
    solver.param.test_interval = sp_interval
    weights, _ = solver.snapshot()
    png = out / "lenet_curves.png"
    final = tests[-1][1] if tests else float("nan")
    plot_curves(png, losses, tests, f"LeNet, {solver.iter:,} iterations on {len(train_y):,} MNIST training "
                                    f"images ({device}): accuracy {final:.4f} on {len(test_y):,} test images")
    for layer in list(solver.net.layers) + [x for n in solver.test_nets for x in n.layers]:
        if hasattr(layer, "close"):
            layer.close()
    print(f"LeNet: {solver.iter} iterations in {wall:.1f} s ({solver.iter / wall:.1f} it/s) on {device}; "
          f"final test accuracy {final:.4f} on {len(test_y)} images; weights {weights}; curves {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
