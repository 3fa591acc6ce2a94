#!/usr/bin/env python3
"""Train a character-level LSTM language model on a short text, then sample text from it.

    python examples/char_lstm/train_char_lstm.py [--gpu N] [--iters K] [--text FILE] [--out DIR]

The text (default ``examples/char_lstm/text.txt``, a short story that ships with the repository)
is read as characters; its distinct characters are the vocabulary. The training net
(``char_lstm_train.prototxt``: Embed -> LSTM -> InnerProduct -> SoftmaxWithLoss) sees T steps of
N streams per iteration: stream s reads the text from position s*len/N on, continuing where the
previous batch stopped, so the LSTM carries its state across batches (truncated
back-propagation through time); ``cont`` is 0 where a stream starts or wraps around. The solver
is ``char_lstm_solver.prototxt`` (Adam). At the end the weights are written to
``OUT/char_lstm_iter_K.caffemodel`` and the sampling net (``char_lstm_deploy.prototxt``, one
character per forward) generates ``--sample-length`` characters from ``--prime``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run from a source checkout without installing


def read_text(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if len(text) < 2:
        raise SystemExit(f"{path}: needs at least 2 characters of text, has {len(text)}")
    return text


def configure(net_param, vocab_size: int, steps: int | None = None, streams: int | None = None) -> None:
    """Set the vocabulary size (Embed input_dim, InnerProduct num_output) and the input shapes."""
    for layer in net_param.layer:
        if layer.type == "Embed":
            layer.embed_param.input_dim = vocab_size
        elif layer.type == "InnerProduct":
            layer.inner_product_param.num_output = vocab_size
        elif layer.type == "Input" and steps is not None and streams is not None:
            for shape in layer.input_param.shape:
                del shape.dim[:]
                shape.dim.extend([steps, streams])


class Batches:
    """(chars, cont, target) arrays of shape (T, N): N streams walking through the encoded text."""

    def __init__(self, ids: np.ndarray, steps: int, streams: int) -> None:
        self.ids, self.T, self.N = ids, steps, streams
        self.pos = [s * len(ids) // streams for s in range(streams)]
        self.started = [False] * streams

    def next(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(self.ids)
        chars = np.empty((self.T, self.N), np.float32)
        cont = np.ones((self.T, self.N), np.float32)
        target = np.empty((self.T, self.N), np.float32)
        for s in range(self.N):
            for t in range(self.T):
                p = self.pos[s]
                if not self.started[s] or p == 0:  # a new pass over the text starts a new sequence
                    cont[t, s] = 0
                    self.started[s] = True
                chars[t, s] = self.ids[p]
                target[t, s] = self.ids[(p + 1) % n]
                self.pos[s] = (p + 1) % n
        return chars, cont, target


def train(text: str, iters: int, gpu: int | None = None, out: Path | None = None, seed: int = 1,
          steps: int | None = None, streams: int | None = None, quiet: bool = False) -> dict:
    """Train on ``text`` for ``iters`` iterations; returns the solver, the vocabulary and the
    per-iteration losses."""
    import pycaffe_lite as caffe
    from pycaffe_lite.proto import protoio
    from pycaffe_lite.schema import caffe_pb2
    from pycaffe_lite.solvers.sgd_solvers import get_solver

    if gpu is not None:
        caffe.set_device(gpu)
        caffe.set_mode_gpu()
    else:
        caffe.set_mode_cpu()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.array([index[c] for c in text], np.int64)

    sp = protoio.read_text(HERE / "char_lstm_solver.prototxt", caffe_pb2.SolverParameter())
    net = protoio.read_text(HERE / "char_lstm_train.prototxt", caffe_pb2.NetParameter())
    shape = net.layer[0].input_param.shape[0].dim
    steps, streams = steps or shape[0], streams or shape[1]
    configure(net, len(vocab), steps, streams)
    sp.ClearField("net")
    sp.net_param.CopyFrom(net)
    sp.max_iter = iters
    sp.random_seed = seed
    sp.display = 0 if quiet else sp.display
    if out is not None:
        sp.snapshot_prefix = str(out / "char_lstm")
    solver = get_solver(sp, progress=False)
    losses: list[float] = []
    solver.iteration_hooks.append(lambda it, loss: losses.append(float(loss)))
    batches = Batches(ids, steps, streams)
    blobs = solver.net.blobs
    start = time.perf_counter()
    for _ in range(iters):
        chars, cont, target = batches.next()
        blobs["chars"].data[...] = chars
        blobs["cont"].data[...] = cont
        blobs["target"].data[...] = target
        solver.step(1)
    wall = time.perf_counter() - start
    return {"solver": solver, "vocab": vocab, "losses": losses, "seconds": wall, "steps": steps, "streams": streams}


def sample(solver, vocab: list[str], length: int, prime: str = "The ", temperature: float = 0.7,
           seed: int = 1) -> str:
    """Generate ``length`` characters after ``prime`` with the sampling net, sharing the trained weights."""
    import pycaffe_lite as caffe
    from pycaffe_lite.proto import protoio
    from pycaffe_lite.schema import caffe_pb2

    param = protoio.read_text(HERE / "char_lstm_deploy.prototxt", caffe_pb2.NetParameter())
    configure(param, len(vocab))
    net = caffe.Net(param, caffe.TEST)
    net.share_with(solver.net)
    index = {c: i for i, c in enumerate(vocab)}
    rng = np.random.default_rng(seed)
    prime = "".join(c for c in prime if c in index) or vocab[0]
    out = []
    probs = None
    for k, c in enumerate(prime):
        probs = net.forward(chars=np.array([[index[c]]], np.float32),
                            cont=np.array([[0.0 if k == 0 else 1.0]], np.float32))["probs"]
    for _ in range(length):
        assert probs is not None
        p = np.asarray(probs, np.float64).reshape(-1)
        p = np.exp(np.log(np.maximum(p, 1e-12)) / temperature)
        p /= p.sum()
        nxt = int(rng.choice(len(vocab), p=p))
        out.append(vocab[nxt])
        probs = net.forward(chars=np.array([[nxt]], np.float32), cont=np.array([[1.0]], np.float32))["probs"]
    return prime + "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=None, help="GPU device id (default: CPU)")
    parser.add_argument("--iters", type=int, default=None, help="iterations (default: the solver's max_iter)")
    parser.add_argument("--text", type=Path, default=HERE / "text.txt", help="training text (UTF-8)")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the weights (default: this folder)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (solver random_seed and sampling)")
    parser.add_argument("--sample-length", type=int, default=400, help="characters to sample at the end")
    parser.add_argument("--prime", default="The ", help="text fed to the sampling net before sampling")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (> 0)")
    args = parser.parse_args(argv)
    if args.temperature <= 0:
        parser.error("--temperature must be positive")

    from pycaffe_lite.proto import protoio
    from pycaffe_lite.schema import caffe_pb2

    text = read_text(args.text)
    iters = args.iters
    if iters is None:
        iters = protoio.read_text(HERE / "char_lstm_solver.prototxt", caffe_pb2.SolverParameter()).max_iter
    args.out.mkdir(parents=True, exist_ok=True)
    device = f"GPU {args.gpu}" if args.gpu is not None else "CPU"
    print(f"text: {args.text} ({len(text):,} characters, {len(set(text))} distinct); {iters} iterations on {device}")
    result = train(text, iters, args.gpu, args.out, args.seed)
    losses = result["losses"]
    weights = args.out / f"char_lstm_iter_{iters}.caffemodel"
    result["solver"].net.save(str(weights))
    first = float(np.mean(losses[:10]))
    last = float(np.mean(losses[-10:]))
    print(f"trained {iters} iterations of {result['steps']} steps x {result['streams']} streams in "
          f"{result['seconds']:.1f} s; loss {first:.3f} (first 10) -> {last:.3f} (last 10); weights: {weights}")
    print("sample:")
    print(sample(result["solver"], result["vocab"], args.sample_length, args.prime, args.temperature, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
