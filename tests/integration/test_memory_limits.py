"""Memory limits below the machine's memory: cgroup v1/v2 limits and RLIMIT_AS are read, a net that
cannot fit is refused naming the net and its largest blobs, and a MemoryError becomes a project
error naming what was being allocated (a child process under RLIMIT_AS checks it for real)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite import memcheck
from pycaffe_lite.memcheck import OutOfMemoryError

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
GiB = 1 << 30


def fake_cgroup(monkeypatch, tmp_path, proc_lines, files):
    (tmp_path / "proc").write_text("\n".join(proc_lines) + "\n")
    root = tmp_path / "cg"
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    monkeypatch.setattr(memcheck, "PROC_CGROUP", tmp_path / "proc")
    monkeypatch.setattr(memcheck, "CGROUP_ROOT", root)
    monkeypatch.setattr(memcheck, "address_space_limit", lambda: None)
    monkeypatch.setattr(memcheck, "host_memory_bytes", lambda reclaim=False: 64 * GiB)


def test_cgroup_v2_limit_of_a_parent_and_free_memory(monkeypatch, tmp_path):
    fake_cgroup(monkeypatch, tmp_path, ["0::/job/step"], {
        "cgroup.controllers": "memory",
        "job/memory.max": f"{2 * GiB}\n", "job/memory.stat": f"anon {512 * MiB}\nfile 999\n",
        "job/step/memory.max": "max\n", "job/step/memory.stat": f"anon {100 * MiB}\n",
    })
    limit, source = memcheck.cgroup_limit()
    assert limit == 2 * GiB and source == tmp_path / "cg/job/memory.max"
    assert memcheck.host_limit() == 2 * GiB
    have, words = memcheck.host_available()
    assert have == 2 * GiB - 512 * MiB and "memory cgroup limit of 2.0 GiB" in words
    with pytest.raises(OutOfMemoryError, match=r"would need 3.0 GiB .* more than the 2.0 GiB that this process's "
                                               r"memory cgroup allows \(.*job/memory.max\)"):
        memcheck.check_fits("layer 'x'", "a blob", 3 * GiB // 4, 4)


def test_cgroup_v1_memory_controller(monkeypatch, tmp_path):
    fake_cgroup(monkeypatch, tmp_path, ["5:cpu,cpuacct:/x", "4:memory:/docker/abc", "0::/"], {
        "memory/docker/abc/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "unlimited"
        "memory/docker/memory.limit_in_bytes": f"{3 * GiB}\n",
        "memory/docker/memory.stat": f"cache 5\nrss 7\ntotal_rss {GiB}\n",
    })
    assert memcheck.cgroup_limit() == (3 * GiB, tmp_path / "cg/memory/docker/memory.limit_in_bytes")
    assert memcheck.host_available()[0] == 2 * GiB


def test_no_cgroup_files_means_no_limit(monkeypatch, tmp_path):
    fake_cgroup(monkeypatch, tmp_path, ["0::/"], {})
    assert memcheck.cgroup_limit() is None and memcheck.host_limit() == 64 * GiB


TRAIN_NET = """name: "big"
force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 64 dim: 3 dim: 100 dim: 100 } } }
layer { name: "r1" type: "ReLU" bottom: "data" top: "r1" }
layer { name: "r2" type: "ReLU" bottom: "r1" top: "r2" }
layer { name: "ip" type: "InnerProduct" bottom: "r2" top: "ip" inner_product_param { num_output: 10 } }
"""


def test_net_that_cannot_fit_under_the_limit_is_refused(monkeypatch, tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(TRAIN_NET)
    monkeypatch.setattr(memcheck, "host_available", lambda: (20 * MiB, "still free under the memory cgroup limit"))
    with pytest.raises(OutOfMemoryError, match=r"net 'big': its blobs and params would need 24.3 MiB, more than the "
                                               r"20.0 MiB still free .*largest: 'data' 7.3 MiB, 'r1' 7.3 MiB"):
        caffe.Net(str(path), caffe.TRAIN)
    # a forward-only net can share blob memory: only its largest layer counts (2 x 7.3 MiB + params)
    path.write_text(TRAIN_NET.replace("force_backward: true", ""))
    caffe.Net(str(path), caffe.TEST).forward()


def test_memory_error_in_a_layer_names_it(monkeypatch, tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(TRAIN_NET.replace("64", "2"))
    net = caffe.Net(str(path), caffe.TEST)
    relu = type(net.layers[1])

    def boom(self, bottom, top):
        np.empty(1)
        raise MemoryError()

    monkeypatch.setattr(relu, "forward_cpu", boom)
    with pytest.raises(OutOfMemoryError, match=r"layer 'r1' \(ReLU\): forward: out of memory while allocating "
                                               r"temporaries of its forward \(bottom shapes \[\(2, 3, 100, 100\)\]\)"
                                               r"; limits: .* of memory this machine has"):
        net.forward()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/status").exists(), reason="Linux RLIMIT_AS")
def test_child_under_rlimit_as_refuses_a_too_large_batch():
    """A real address-space limit (ulimit -v): a batch too large for it is refused with a message
    naming RLIMIT_AS, and a net whose blobs together exceed what is left is refused too."""
    import resource

    limit = 1536 * MiB

    def preexec():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    code = textwrap.dedent("""
        import sys
        import pycaffe_lite as caffe
        from pycaffe_lite.errors import CaffeError
        from pycaffe_lite.proto.protoio import parse_text
        from pycaffe_lite.schema import caffe_pb2
        one = 'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: %d dim: 1000 dim: 1000 } } }'
        many = one % 100 + ''.join(
            'layer { name: "r%d" type: "ReLU" bottom: "%s" top: "r%d" }' % (i, "data" if i == 0 else "r%d" % (i - 1), i)
            for i in range(6))
        for text in (one % 1000, 'force_backward: true ' + many):
            try:
                net = caffe.Net(parse_text(text, caffe_pb2.NetParameter()), caffe.TRAIN)
                net.forward()
                print("NO ERROR")
            except CaffeError as exc:
                print(type(exc).__name__, exc)
        """)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         preexec_fn=preexec)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout + out.stderr
    assert lines[0].startswith("OutOfMemoryError") and "RLIMIT_AS (ulimit -v)" in lines[0], lines[0]
    assert "3.7 GiB" in lines[0] and "'data'" in lines[0]
    assert lines[1].startswith("OutOfMemoryError") and "its blobs and params would need 2.6 GiB" in lines[1], lines[1]
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_child_in_a_memory_cgroup_refuses_a_too_large_batch():
    """Where this machine lets us make a memory cgroup (v1 or v2) under our own: a child in it with
    a 1 GiB limit refuses a 3.7 GiB batch naming the cgroup's limit file (not the OOM killer)."""
    dirs = memcheck._cgroup_dirs()
    if not dirs:
        pytest.skip("no memory cgroup")
    parent, version = dirs[0]
    cg = parent / f"pycaffe_lite_test_{os.getpid()}"
    try:
        cg.mkdir()
        (cg / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(GiB))
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")

    def preexec():
        (cg / "cgroup.procs").write_text(str(os.getpid()))

    code = textwrap.dedent("""
        import pycaffe_lite as caffe
        from pycaffe_lite.errors import CaffeError
        from pycaffe_lite.proto.protoio import parse_text
        from pycaffe_lite.schema import caffe_pb2
        text = 'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1000 dim: 1000 dim: 1000 } } }'
        try:
            caffe.Net(parse_text(text, caffe_pb2.NetParameter()), caffe.TRAIN).forward()
            print("NO ERROR")
        except CaffeError as exc:
            print(type(exc).__name__, exc)
        """)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                             preexec_fn=preexec)
    finally:
        try:
            cg.rmdir()
        except OSError:
            pass
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OutOfMemoryError") and "memory cgroup allows" in out.stdout, out.stdout
    assert cg.name in out.stdout and "3.7 GiB" in out.stdout


def test_gpu_mode_nets_are_checked_on_the_device_not_against_a_small_host_limit(monkeypatch, tmp_path):
    """In GPU mode the blobs live on the device: a host limit smaller than the activations does not
    refuse the net (only its params must fit on the host); the device's free memory does."""
    from pycaffe_lite import common

    path = tmp_path / "net.prototxt"
    path.write_text(TRAIN_NET)
    monkeypatch.setattr(common, "mode", lambda: common.Mode.GPU)
    monkeypatch.setattr(memcheck, "device_limit", lambda reclaim=False: 64 * GiB)
    monkeypatch.setattr(memcheck, "host_available", lambda: (10 * MiB, "still free under the memory cgroup limit"))
    monkeypatch.setattr(memcheck, "device_available", lambda reclaim=False: 64 * GiB)
    caffe.Net(str(path), caffe.TRAIN)  # 24 MiB of blobs on the device, 1.1 MiB of params on the host
    monkeypatch.setattr(memcheck, "device_available", lambda reclaim=False: 20 * MiB)
    with pytest.raises(OutOfMemoryError, match=r"its blobs and params would need 24.3 MiB, more than the 20.0 MiB "
                                               r"of GPU memory still free"):
        caffe.Net(str(path), caffe.TRAIN)
