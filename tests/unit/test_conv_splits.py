"""Host-side choices of the GPU convolution engines that need no GPU: how the weight gradient's
contraction is split into blocks (whole waves of resident blocks), which passes the channel-sliced
tensor-core kernels take, and when the gemm engine's 1x1 passes skip the column buffer."""

from __future__ import annotations

import pytest

from pycaffe_lite.conv import gemm, tiling
from pycaffe_lite.conv import tensorcore as tc
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.conv.registry import PASSES
from pycaffe_lite.gpu import backend

SMS = 132


def _prob(n: int, c: int, hw: int, m: int, k: int = 3, group: int = 1) -> ConvProblem:
    return ConvProblem(n, c, hw, hw, m, group, (k, k), (k // 2, k // 2), (1, 1), (1, 1), "<f4")


@pytest.mark.parametrize("prob,bm,bn,bk,resident", [
    (_prob(32, 64, 224, 64), 64, 64, 32, 2),     # VGG conv1_2: 9 tiles, 1.6M pixels
    (_prob(32, 64, 224, 64), 64, 128, 32, 2),    # 5 tiles, the last one ragged
    (_prob(32, 256, 56, 256), 64, 64, 32, 2),    # 144 tiles: more than a wave's slots at one split
    (_prob(32, 512, 14, 512), 128, 128, 16, 1),  # 144 tiles, one block per SM
    (_prob(2, 3, 9, 5), 32, 32, 16, 4),          # a few pixels: at least 4 slices a split
    (_prob(4, 64, 16, 64, group=4), 16, 16, 16, 8),
])
def test_splits_fill_whole_waves_and_cover_the_contraction(monkeypatch, prob, bm, bn, bk, resident):
    monkeypatch.setattr(backend, "multiprocessor_count", lambda: SMS)
    splits, chunk = tiling.split_contraction(prob, bm, bn, bk, False, resident)
    total = prob.num * prob.out_plane
    assert chunk % bk == 0 and splits * chunk >= total > (splits - 1) * chunk
    assert splits == 1 or chunk >= 4 * bk
    tiles = -(-prob.mg // bm) * -(-prob.kg // bn) * prob.group
    blocks, slots = tiles * splits, resident * SMS
    if total >= 4 * bk * slots:  # enough work to fill the device: the last wave is (nearly) full
        assert blocks / (-(-blocks // slots) * slots) >= 0.9, (tiles, splits)


def test_splits_do_not_spill_a_wave_by_a_few_blocks(monkeypatch):
    """9 tiles on 264 slots: 29 splits (261 blocks), not 30 (270: a second wave of 6 blocks)."""
    monkeypatch.setattr(backend, "multiprocessor_count", lambda: SMS)
    splits, _ = tiling.split_contraction(_prob(32, 64, 224, 64), 64, 64, 32, False, 2)
    assert splits == 29


def test_sliced_conditions():
    # forward: C/G % 32; data gradient: M/G % 32; weight gradient: C/G % (tile width / 8); no dilation
    p = _prob(2, 64, 8, 48)
    assert tc.sliced(p, "128x128", "forward") and not tc.sliced(p, "128x128", "backward_data")
    assert tc.sliced(p, "128x128", "backward_weight") and tc.sliced(p, "64x64", "backward_weight")
    p = _prob(2, 24, 8, 64)
    assert not tc.sliced(p, "64x128", "forward") and tc.sliced(p, "64x128", "backward_data")
    assert not tc.sliced(p, "128x128", "backward_weight") and tc.sliced(p, "64x64", "backward_weight")
    dilated = ConvProblem(2, 64, 9, 9, 64, 1, (3, 3), (2, 2), (1, 1), (2, 2), "<f4")
    assert not any(tc.sliced(dilated, "64x64", s) for s in ("forward", "backward_data", "backward_weight"))


def test_gemm_1x1_weight_gradient_uses_columns_only_at_small_planes():
    per_image = gemm.GemmEngine._per_image
    small, large = _prob(32, 512, 7, 2048, k=1), _prob(32, 256, 14, 1024, k=1)
    assert small.out_plane < gemm.COLUMNS_1X1_WEIGHT_PLANE <= large.out_plane
    assert per_image(small, "forward") and per_image(small, "backward_data")
    assert not per_image(small, "backward_weight") and per_image(large, "backward_weight")
    assert not any(per_image(_prob(2, 8, 9, 8), p) for p in PASSES)  # 3x3: always columns
    engine = gemm.GemmEngine()
    assert len(engine.scratch(small, "backward_weight", False)) == 2  # columns and the transposed dy
    assert engine.scratch(small, "forward", False) == ()
