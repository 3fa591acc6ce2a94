"""Interp (DeepLab v2 / PSPNet): bilinear resize of (N, C, H, W) with aligned corners.

The input is first cropped by ``pad_beg`` / ``pad_end`` (both <= 0: ``-pad_beg`` rows and columns
dropped at the start, ``-pad_end`` at the end), giving ``Hi = H + pad_beg + pad_end`` (same for W).
The output size (the fork's precedence):

- ``shrink_factor`` s alone: ``(Hi - 1) / s + 1``;
- ``zoom_factor`` z alone: ``Hi + (Hi - 1)(z - 1)``;
- ``height`` and ``width``: as given;
- both factors: shrink, then zoom.

Output pixel (h, w) samples the cropped input at ``(h · (Hi - 1) / (Ho - 1), w · (Wi - 1) / (Wo - 1))``
(0 when the output side is 1), bilinearly; the ratios and source coordinates are computed in single
precision as the fork does, the blend in the layer's dtype. Equal sizes copy. Backward is the
adjoint (each output gradient spread over its four source pixels) and overwrites the bottom diff
(zeros outside the cropped window).

GPU: the sampling tables of both axes are built on the host at reshape (``axis_tables``; the same
single-precision numbers as the CPU path) and kept on the device. Forward writes the top with
coalesced stores, each lane keeping its column's blends of the two source rows across the rows of
a band. Backward is a gather, ``dx = Ah^T dy Aw`` per plane, through ``T = Ah^T dy`` held in shared
memory only: one block per tile of bottom rows and columns (``backward_tiling``, chosen at reshape)
streams the top diff once, coalesced, into its part of ``T`` (a thread per two top columns 32 apart,
their top rows in batches of 8 whatever the groups' lengths: loads in flight per register are what
the pass is bound by), then writes its bottom diffs from contiguous ranges of ``T``'s rows. Backward,
% of copy bandwidth, H100 / H200: DeepLab x8 fc8 84 / 87, PSPNet conv6 89 / 96, pool6 74 / 78 (the
two global passes it replaced: 70, 75, 74 on the H200). Every bottom diff is written once, without
atomics, deterministically (float32 may differ from the CPU in the last bits: another summation
order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import backend
from pycaffe_lite.layer import Layer, Traits, register_layer

KERNELS = Path(__file__).with_suffix(".cu")
WARPS_PER_BLOCK = 8
FORWARD_ROWS_PER_TASK = 16  # INTERP_ROWS_PER_TASK in interp.cu
TILE_BYTES = 32 * 1024  # backward: shared memory of a tile's part of T
TILE_ROWS = 8  # backward: bottom rows a band aims at (each band reads one group of top rows twice)
MIN_TILES = 1024  # backward: thinner bands below this many tiles (blocks to keep the GPU busy)
MAX_THREADS = 1024
COLS_PER_THREAD = 2  # INTERP_COLS in interp.cu: top columns per stage-1 thread of the backward
MAX_BLOCKS = 65535 * 4


def interp_weights(n_in: int, n_out: int, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per output index: the lower source index, its step to the upper one (0 or 1), the upper
    weight, with the fork's single-precision ratio."""
    ratio = np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.float32(0)
    r = np.float32(ratio) * np.arange(n_out, dtype=np.float32)
    lo = r.astype(np.int64)
    step = (lo < n_in - 1).astype(np.int64)
    lam = (r - lo.astype(np.float32)).astype(dtype)
    return lo, step, lam


@register_layer("Interp")
class InterpLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=())
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.interp_param
        self.pad_beg, self.pad_end = p.pad_beg, p.pad_end
        if self.pad_beg > 0 or self.pad_end > 0:
            raise self.error(f"pad_beg and pad_end must be <= 0 (cropping), got {self.pad_beg} and {self.pad_end}")
        has_s, has_z = p.HasField("shrink_factor"), p.HasField("zoom_factor")
        if not (has_s or has_z or (p.HasField("height") and p.HasField("width"))):
            raise self.error("interp_param needs zoom_factor, shrink_factor, or both height and width")
        if has_s and p.shrink_factor < 1:
            raise self.error(f"shrink_factor must be >= 1, got {p.shrink_factor}")
        if has_z and p.zoom_factor < 1:
            raise self.error(f"zoom_factor must be >= 1, got {p.zoom_factor}")

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error(f"bottom must be (N, C, H, W), got shape {bottom[0].shape}")
        if top[0] is bottom[0]:
            raise self.error("does not allow in-place computation")
        p = self.layer_param.interp_param
        n, c, h, w = bottom[0].shape
        hi, wi = h + self.pad_beg + self.pad_end, w + self.pad_beg + self.pad_end
        if hi <= 0 or wi <= 0:
            raise self.error(f"cropping by pad_beg {self.pad_beg}, pad_end {self.pad_end} leaves no input of "
                             f"bottom {bottom[0].shape}")
        has_s, has_z = p.HasField("shrink_factor"), p.HasField("zoom_factor")
        if has_s and not has_z:
            ho, wo = (hi - 1) // p.shrink_factor + 1, (wi - 1) // p.shrink_factor + 1
        elif has_z and not has_s:
            ho, wo = hi + (hi - 1) * (p.zoom_factor - 1), wi + (wi - 1) * (p.zoom_factor - 1)
        elif p.HasField("height") and p.HasField("width"):
            ho, wo = p.height, p.width
        else:
            ho, wo = (hi - 1) // p.shrink_factor + 1, (wi - 1) // p.shrink_factor + 1
            ho, wo = ho + (ho - 1) * (p.zoom_factor - 1), wo + (wo - 1) * (p.zoom_factor - 1)
        if ho <= 0 or wo <= 0:
            raise self.error(f"output size must be positive, got {ho} x {wo}")
        self.hi, self.wi, self.ho, self.wo = hi, wi, ho, wo
        top[0].reshape((n, c, ho, wo))
        self._build_tables()
        self._tiling = backward_tiling(hi, wi, self._col_starts, n * c, math_itemsize(self.dtype), self._copy)

    def _crop(self, a):
        o = -self.pad_beg
        return a[:, :, o:o + self.hi, o:o + self.wi]

    def forward_cpu(self, bottom, top):
        x = self._crop(bottom[0].cpu_data())
        y = top[0].mutable_cpu_data()
        if (self.hi, self.wi) == (self.ho, self.wo):
            y[...] = x
            return
        h0, hs, hl = interp_weights(self.hi, self.ho, self.dtype)
        w0, ws, wl = interp_weights(self.wi, self.wo, self.dtype)
        hl, wl = hl[:, None], wl[None, :]
        one = self.dtype.type(1)
        top_rows = x[:, :, h0]
        bot_rows = x[:, :, h0 + hs]
        upper = (one - wl) * top_rows[:, :, :, w0] + wl * top_rows[:, :, :, w0 + ws]
        lower = (one - wl) * bot_rows[:, :, :, w0] + wl * bot_rows[:, :, :, w0 + ws]
        y[...] = (one - hl) * upper + hl * lower

    def backward_cpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx_full = bottom[0].mutable_cpu_diff()
        dx_full[...] = 0
        dx = self._crop(dx_full)
        dy = top[0].cpu_diff()
        if (self.hi, self.wi) == (self.ho, self.wo):
            dx[...] = dy
            return
        # The adjoint of the separable map y = A_h x A_w^T: dx = A_h^T dy A_w (two matrix products).
        ah, aw = self._matrix(self.hi, self.ho), self._matrix(self.wi, self.wo)
        dx[...] = np.matmul(np.matmul(ah.T, dy), aw)

    def _matrix(self, n_in: int, n_out: int) -> np.ndarray:
        """(n_out, n_in) interpolation weights along one axis."""
        lo, step, lam = interp_weights(n_in, n_out, self.dtype)
        m = np.zeros((n_out, n_in), self.dtype)
        rows = np.arange(n_out)
        np.add.at(m, (rows, lo), self.dtype.type(1) - lam)
        np.add.at(m, (rows, lo + step), lam)
        return m

    # -- GPU: per-axis tables built at reshape (see interp.cu), so the passes allocate nothing ---------
    def _build_tables(self) -> None:
        """Device tables of both axes: int32 ``[row pairs | row starts | col pairs | col starts]``
        (raw bits in a float32 blob) and ``[row lam, wp, wq | col lam, wp, wq]`` in the layer's dtype,
        rewritten only when the geometry changes; uploaded here when the mode is GPU."""
        key = (self.hi, self.wi, self.ho, self.wo)
        if getattr(self, "_table_key", None) != key:
            ints, reals = [], []
            for n_in, n_out in ((self.hi, self.ho), (self.wi, self.wo)):
                pairs, starts, lam, wp, wq = axis_tables(n_in, n_out, self.dtype)
                ints += [pairs.ravel(), starts]
                reals += [lam, wp, wq]
            self._col_starts = starts
            int_table, real_table = np.concatenate(ints), np.concatenate(reals)
            if not hasattr(self, "_int_blob"):
                self._int_blob, self._real_blob = Blob(dtype=np.float32), Blob(dtype=self.dtype)
            self._int_blob.reshape(int_table.shape)
            self._int_blob.mutable_cpu_data().view(np.int32)[...] = int_table
            self._real_blob.reshape(real_table.shape)
            self._real_blob.mutable_cpu_data()[...] = real_table
            self._table_key = key
        if common.mode() is common.Mode.GPU:
            self._int_blob.gpu_data()
            self._real_blob.gpu_data()

    def _axis_pointers(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Device pointers (pairs, starts, lam, wp, wq) of the row axis and of the column axis."""
        ib, rb = self._int_blob.gpu_data(), self._real_blob.gpu_data()
        isz, rsz = 4, self.dtype.itemsize
        out = []
        for n_out, i0, r0 in ((self.ho, 0, 0), (self.wo, 2 * self.ho + self.hi + 1, 3 * self.ho)):
            out.append((ib + i0 * isz, ib + (i0 + 2 * n_out) * isz, rb + r0 * rsz, rb + (r0 + n_out) * rsz,
                        rb + (r0 + 2 * n_out) * rsz))
        return out[0], out[1]

    @property
    def _copy(self) -> bool:
        return (self.hi, self.wi) == (self.ho, self.wo)

    def forward_gpu(self, bottom, top):
        n, c, h, w = bottom[0].shape
        if top[0].count == 0:
            return
        (rp, _, rl, _, _), (cp, _, cl, _, _) = self._axis_pointers()
        planes = n * c
        tasks = planes * -(-self.ho // FORWARD_ROWS_PER_TASK) * -(-self.wo // 32)
        k = backend.kernel(KERNELS, "interp_forward", self.dtype)
        k(planes, h, w, -self.pad_beg, self.ho, self.wo, int(self._copy), rp, rl, cp, cl, bottom[0].gpu_data(),
          top[0].mutable_gpu_data(), grid=_warp_grid(tasks), block=WARPS_PER_BLOCK * 32)

    def backward_gpu(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n, c, h, w = bottom[0].shape
        if bottom[0].count == 0:
            return
        (rp, rs, _, rwp, rwq), (_, cs, _, cwp, cwq) = self._axis_pointers()
        rows, bcols, cw, tiles, threads = self._tiling
        shared = rows * stored_row(cw) * math_itemsize(self.dtype)
        k = backend.kernel(KERNELS, "interp_backward", self.dtype)
        threads = min(threads, k.max_threads // 32 * 32)  # fewer where its registers allow fewer
        k(n * c, h, w, -self.pad_beg, self.hi, self.wi, self.ho, self.wo, int(self._copy), rows, bcols, cw, rp, rs,
          rwp, rwq, cs, cwp, cwq, top[0].gpu_diff(), bottom[0].mutable_gpu_diff(), grid=min(tiles, MAX_BLOCKS),
          block=threads, shared=shared)


def axis_tables(n_in: int, n_out: int, dtype) -> tuple[np.ndarray, ...]:
    """One axis's GPU tables (see interp.cu): (lo, lo + step) pairs, per source index the first
    output sampling it from below (``starts``, n_in + 1), the upper weight, and the adjoint's weights
    on lo (``wp``: 1 - lam, plus lam where step is 0, summed as the CPU matrix sums them) and on lo + 1
    (``wq``)."""
    lo, step, lam = interp_weights(n_in, n_out, dtype)
    one = np.dtype(dtype).type(1)
    pairs = np.stack([lo, lo + step], axis=1).astype(np.int32)
    starts = np.searchsorted(lo, np.arange(n_in + 1), side="left").astype(np.int32)
    wp = np.where(step == 0, (one - lam) + lam, one - lam).astype(dtype)
    wq = np.where(step == 0, 0, lam).astype(dtype)
    return pairs, starts, lam, wp, wq


def math_itemsize(dtype) -> int:
    """Bytes of one element of T in shared memory: the kernels' math type (Mtype), float for the
    2-byte storage types (float16, bfloat16 as uint16), else the storage type itself."""
    size = np.dtype(dtype).itemsize
    return 4 if size == 2 else size


def backward_tiling(hi: int, wi: int, col_starts: np.ndarray, planes: int, itemsize: int,
                    copy: bool) -> tuple[int, int, int, int, int]:
    """The backward's tiles (see ``interp_backward`` in interp.cu): bottom rows per band, bottom
    columns per tile, top columns per chunk of T held in shared memory, the number of tiles and the
    threads per block. Full rows where a band of up to TILE_ROWS rows of them fits in TILE_BYTES,
    else column tiles halved until it does (one column's range still too wide: chunks); bands thinned
    towards MIN_TILES tiles, then balanced."""
    elems = TILE_BYTES // itemsize
    want_rows = min(hi, TILE_ROWS)

    def width(bcols: int) -> int:  # the most top columns one tile's bottom columns need
        b0 = np.arange(0, wi, bcols)
        lo = b0 if copy else np.maximum(b0 - 1, 0)
        return int((col_starts[np.minimum(b0 + bcols, wi)] - col_starts[lo]).max())

    bcols = wi
    while bcols > 1 and stored_row(width(bcols)) * want_rows > elems:
        bcols = -(-bcols // 2)
    cw = max(1, min(width(bcols), (elems // want_rows) * 32 // 33))
    rows = min(hi, elems // stored_row(cw))
    ctiles = -(-wi // bcols)
    rows = min(rows, -(-hi // min(hi, -(-MIN_TILES // max(planes * ctiles, 1)))))
    bands = -(-hi // rows)
    rows = -(-hi // bands)
    threads = min(MAX_THREADS, -(-cw // (32 * COLS_PER_THREAD)) * 32)
    return rows, bcols, cw, planes * bands * ctiles, threads


def stored_row(cols: int) -> int:
    """Elements of a stored row of T's tile holding ``cols`` top columns (INTERP_SLOT: a pad slot per 32)."""
    return cols + (cols - 1) // 32


def _warp_grid(tasks: int) -> int:
    """Blocks for ``tasks`` warp tasks of a grid-stride loop (WARPS_PER_BLOCK per block)."""
    return max(1, min(-(-tasks // WARPS_PER_BLOCK), MAX_BLOCKS))
