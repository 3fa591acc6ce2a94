"""benchmarks/kernel_profile.py without a GPU: kernel names fall into the families it sums, ours and
the peer's (cuDNN's BatchNorm and layout transposes, cuBLAS's Hopper GEMMs), and the argument
defaults."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_profile.py"


@pytest.fixture(scope="module")
def kp():
    spec = importlib.util.spec_from_file_location("bench_kernel_profile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # puts benchmarks/ on sys.path (zoo)
    return mod


@pytest.mark.parametrize(("name", "family"), [
    ("tcs_forward_128x128", "conv: tensor-core implicit GEMM"),
    ("winograd_input", "conv: winograd"),
    ("col2im_batch", "conv: depthwise / direct / im2col"),
    ("bn_chain_reduce_v4", "batch norm / scale"),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float)", "batch norm / scale"),
    ("sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc", "conv: cuDNN (and its layout transposes)"),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<float>", "conv: cuDNN (and its layout transposes)"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x64x32", "GEMM (cuBLAS)"),
    ("max_pool_backward_s2_w1", "pooling"),
    ("eltwise_sum_relu_backward_v4", "elementwise / relu / add"),
    ("Memcpy DtoH (Device -> Pinned)", "copies and fills"),
    ("memcpy128", "copies and fills"),
    ("moments_finish", "other"),
])
def test_family(kp, name, family):
    assert kp.family(name) == family


def test_arguments(kp):
    args = kp.parse_args(["--net", "vgg16", "--mode", "published", "--tf32"])
    assert (args.net, args.mode, args.side, args.tf32, args.batch) == ("vgg16", "published", "ours", True, 32)
    with pytest.raises(SystemExit):
        kp.parse_args(["--net", "lenet"])
    assert args.precision is None and kp.step_drive(args) == "pycaffe"
    amp = kp.parse_args(["--precision", "bf16"])
    assert amp.precision == "bf16" and kp.step_drive(amp) == "update"
    assert kp.step_drive(kp.parse_args(["--forward-only", "--mode", "published"])) == "forward"
    with pytest.raises(SystemExit):
        kp.parse_args(["--tf32", "--precision", "fp16"])


def test_busy_and_gaps_take_the_union_of_overlapping_streams(kp):
    # two streams: [0, 10] and [5, 12] overlap; then idle 3; [15, 20]; idle 80 up to [100, 101]
    span, busy, gaps = kp.busy_and_gaps([(15.0, 20.0), (0.0, 10.0), (100.0, 101.0), (5.0, 12.0), (16.0, 18.0)])
    assert (span, busy, gaps) == (101.0, 18.0, [3.0, 80.0])
    assert kp.busy_and_gaps([]) == (0.0, 0.0, [])


def test_idle_line_bins_the_gaps_per_iteration(kp):
    # 2 iterations; gaps of 4, 20, 600 us: busy 376 us, idle 624 us over 2 iterations
    line = kp.idle_line([(0.0, 100.0), (104.0, 200.0), (220.0, 300.0), (900.0, 1000.0)], iters=2)
    assert line.startswith("device busy 0.19 ms/iter (any stream), idle 0.31 ms/iter;")
    assert line.endswith("<10 0.00, 10-50 0.01, 50-500 0.00, >=500 0.30")
