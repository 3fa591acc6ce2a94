"""examples/char_lstm: the character-level LSTM trains (its loss falls within a few dozen
iterations), its batches carry each stream on with cont 0 only where a stream starts, and the
sampling net, sharing the trained weights, writes characters of the text's vocabulary."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "char_lstm"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_char_lstm", EXAMPLE / "train_char_lstm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batches_walk_the_streams(example):
    ids = np.arange(10)
    b = example.Batches(ids, steps=3, streams=2)
    chars, cont, target = b.next()
    np.testing.assert_array_equal(chars[:, 0], [0, 1, 2])
    np.testing.assert_array_equal(chars[:, 1], [5, 6, 7])
    np.testing.assert_array_equal(target[:, 1], [6, 7, 8])
    np.testing.assert_array_equal(cont, [[0, 0], [1, 1], [1, 1]])
    chars, cont, target = b.next()
    np.testing.assert_array_equal(chars[:, 0], [3, 4, 5])
    np.testing.assert_array_equal(chars[:, 1], [8, 9, 0])  # wraps: a new sequence starts at 0
    np.testing.assert_array_equal(target[:, 1], [9, 0, 1])
    np.testing.assert_array_equal(cont[:, 1], [1, 1, 0])
    assert cont[:, 0].all()


def test_the_text_ships_with_the_example():
    text = (EXAMPLE / "text.txt").read_text(encoding="utf-8")
    assert 2000 < len(text) < 20000 and len(set(text)) > 20


@pytest.mark.slow
def test_training_lowers_the_loss_and_samples(example, tmp_path):
    text = (EXAMPLE / "text.txt").read_text(encoding="utf-8")
    result = example.train(text, iters=40, out=tmp_path, steps=16, streams=8, quiet=True)
    losses = result["losses"]
    assert len(losses) == 40
    vocab = result["vocab"]
    assert losses[0] == pytest.approx(np.log(len(vocab)), rel=0.1)  # near-uniform predictions at first
    assert np.mean(losses[-5:]) < 0.85 * np.mean(losses[:5])
    out = example.sample(result["solver"], vocab, 30, prime="The ")
    assert out.startswith("The ") and len(out) == 34 and set(out) <= set(vocab)


@pytest.mark.slow
def test_command_line(example, tmp_path, capsys):
    assert example.main(["--iters", "3", "--out", str(tmp_path), "--sample-length", "5"]) == 0
    printed = capsys.readouterr().out
    assert "3 iterations on CPU" in printed and "sample:" in printed
    assert (tmp_path / "char_lstm_iter_3.caffemodel").stat().st_size > 0


@pytest.mark.gpu
def test_training_on_gpu_matches_cpu_start_and_learns(example, tmp_path):
    """On the GPU (whole iterations replayed as CUDA graphs) the first losses agree with the CPU's
    and the loss falls."""
    import pycaffe_lite as caffe

    text = (EXAMPLE / "text.txt").read_text(encoding="utf-8")
    try:
        gpu = example.train(text, iters=40, gpu=0, out=tmp_path, steps=16, streams=8, quiet=True)
    finally:
        caffe.set_mode_cpu()
    cpu = example.train(text, iters=3, out=tmp_path, steps=16, streams=8, quiet=True)
    np.testing.assert_allclose(gpu["losses"][:3], cpu["losses"], rtol=1e-3)
    assert np.mean(gpu["losses"][-5:]) < 0.85 * np.mean(gpu["losses"][:5])
