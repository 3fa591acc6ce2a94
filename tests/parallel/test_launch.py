"""Multi-GPU command line without a GPU: --gpu lists, --nccl-init, cluster variables, the
children's command lines and environment, the launcher's supervision of failing ranks."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import pytest

from pycaffe_lite.commands import train
from pycaffe_lite.errors import CaffeError
from pycaffe_lite.parallel import launch


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    return parser.parse_args(["--solver", "s.prototxt", *argv])


@pytest.mark.parametrize("value, expected", [(None, None), ("0", [0]), ("1,0", [1, 0]), ("0, 2", [0, 2]),
                                             ("all", [0, 1, 2])])
def test_parse_gpu_list(value, expected):
    assert launch.parse_gpu_list(value, lambda: 3) == expected


@pytest.mark.parametrize("value, message", [("x", "expected device ids"), ("-1", ">= 0"), ("0,0", "twice"),
                                            ("all", "no CUDA device")])
def test_parse_gpu_list_errors(value, message):
    with pytest.raises(CaffeError, match=message):
        launch.parse_gpu_list(value, lambda: 0)


def test_plan_single_process_cases():
    assert launch.plan(parse(), env={}) is None
    assert launch.plan(parse("--gpu", "3"), env={}) is None
    assert launch.plan(parse("--gpu", "all"), env={}, device_count=lambda: 1) is None


def test_plan_launch_on_this_machine():
    job = launch.plan(parse("-gpu", "0,1"), env={})
    assert job == launch.Launch([0, 1], None, 2, 0)
    job = launch.plan(parse("--gpu", "all"), env={}, device_count=lambda: 4)
    assert job.gpus == [0, 1, 2, 3] and job.world_size == 4


def test_plan_two_machines():
    args = parse("--gpu", "0,1", "--nccl-init", "tcp://node0:29500", "--world-size", "4", "--rank", "2")
    assert launch.plan(args, env={}) == launch.Launch([0, 1], "tcp://node0:29500", 4, 2)
    with pytest.raises(CaffeError, match="exceed"):
        launch.plan(parse("--gpu", "0,1", "--nccl-init", "tcp://h:1", "--world-size", "2", "--rank", "1"), env={})
    with pytest.raises(CaffeError, match="needs --nccl-init"):
        launch.plan(parse("--gpu", "0,1", "--world-size", "4"), env={})


def test_plan_one_rank_from_flags_and_cluster_variables():
    args = parse("--gpu", "1", "--nccl-init", "tcp://127.0.0.1:5000", "--world-size", "2", "--rank", "1")
    assert launch.plan(args, env={}) == launch.RankJob(1, "tcp://127.0.0.1:5000", 2, 1)
    env = {"MASTER_ADDR": "n0", "MASTER_PORT": "7000", "SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}
    assert launch.plan(parse(), env=env) == launch.RankJob(1, "tcp://n0:7000", 4, 3)
    env = {"MASTER_ADDR": "n0", "MASTER_PORT": "7000", "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    assert launch.plan(parse(), env=env) == launch.RankJob(0, "tcp://n0:7000", 2, 0)
    with pytest.raises(CaffeError, match="--rank in 0..1"):
        launch.plan(parse("--nccl-init", "tcp://h:1", "--world-size", "2"), env={})
    with pytest.raises(CaffeError, match="needs --nccl-init"):
        launch.plan(parse("--world-size", "2", "--rank", "0"), env={})


def test_nccl_init_url_parsing():
    from pycaffe_lite.parallel.rendezvous import parse_init

    assert parse_init("tcp://10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert parse_init("tcp://[::1]:80") == ("::1", 80)
    for bad in ("10.0.0.1:29500", "tcp://host", "tcp://host:0", "tcp://:5"):
        with pytest.raises(CaffeError, match="tcp://HOST:PORT"):
            parse_init(bad)


def test_children_get_the_flags_and_an_unchanged_environment(monkeypatch):
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["-solver", "s.prototxt", "--gpu", "0,1", "--weights", "w.caffemodel",
                              "--stage", "a,b", "--sigint_effect", "snapshot"])
    job = launch.plan(args, env={})
    forwarded = launch.forwarded_arguments(args, parser)
    assert forwarded == ["--solver", "s.prototxt", "--weights", "w.caffemodel", "--stage", "a,b",
                         "--sigint_effect", "snapshot"]
    job.url = "tcp://127.0.0.1:1234"
    cmds = launch.child_commands(job, forwarded)
    assert cmds[0][:4] == [sys.executable, "-m", "pycaffe_lite", "train"]
    assert cmds[0][-8:] == ["--gpu", "0", "--nccl-init", "tcp://127.0.0.1:1234", "--world-size", "2", "--rank", "0"]
    assert cmds[1][-9:] == ["--gpu", "1", "--nccl-init", "tcp://127.0.0.1:1234", "--world-size", "2", "--rank", "1",
                            "--no-progress"]
    # The children re-parse to single ranks.
    child = parser.parse_args(cmds[1][4:])
    assert launch.plan(child, env={}) == launch.RankJob(1, "tcp://127.0.0.1:1234", 2, 1)

    seen = []

    class FakePopen:
        def __init__(self, cmd, **kwargs):
            seen.append(kwargs)
            self.pid = 100 + len(seen)

        def poll(self):
            return 0

    monkeypatch.setattr(launch.nccl, "library", lambda: None)
    monkeypatch.setattr(launch, "_device_count", lambda: 2)
    monkeypatch.setattr(launch.subprocess, "Popen", FakePopen)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    assert launch.run_launch(job, args, parser) == 0
    # No env= argument: every variable (NCCL_NVLS_ENABLE=0 among them) reaches the ranks as it is.
    assert seen == [{"start_new_session": True}] * 2


class _Proc:
    def __init__(self, codes):
        self.codes = list(codes)
        self.code = None
        self.terminated = False

    def poll(self):
        if self.code is None and self.codes:
            self.code = self.codes.pop(0)
        return self.code

    def terminate(self):
        self.terminated = True
        self.code = -15

    def wait(self, timeout=None):
        return self.code

    def kill(self):
        self.code = -9


def test_supervise_names_the_failed_rank_not_the_ones_it_stopped():
    job = launch.Launch([0, 1], "tcp://h:1", 2, 0)
    rank0 = _Proc([None, None, 3])  # stops by itself: its peer was lost
    rank1 = _Proc([-9])  # killed
    with pytest.raises(CaffeError, match=r"rank 1 \(GPU 1\) was killed by SIGKILL.*rank 0 exited with status 3"):
        launch.supervise(job, [rank0, rank1], poll_s=0.001)


def test_supervise_ends_ranks_that_do_not_stop():
    job = launch.Launch([2, 3], "tcp://h:1", 2, 0)
    stuck, failed = _Proc([None] * 10**6), _Proc([1])
    with pytest.raises(CaffeError, match=r"rank 1 \(GPU 3\) exited with status 1"):
        launch.supervise(job, [stuck, failed], poll_s=0.001, grace_s=0.05)
    assert stuck.terminated


def test_supervise_success():
    assert launch.supervise(launch.Launch([0, 1], None, 2, 0), [_Proc([0]), _Proc([None, 0])], poll_s=0.001) == 0


def test_launch_without_nccl_fails_with_what_to_install(monkeypatch, tmp_path):
    from pycaffe_lite.commands import cli
    from pycaffe_lite.parallel import nccl

    def missing():
        raise nccl.NCCLUnavailableError("multi-GPU training needs NCCL, which was not found: " + nccl.INSTALL_HINT)

    monkeypatch.setattr(nccl, "library", missing)
    solver = tmp_path / "s.prototxt"
    solver.write_text('net: "n.prototxt" base_lr: 0.1 lr_policy: "fixed"')
    popen = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: popen.append(a))
    assert cli.main(["train", "--solver", str(solver), "--gpu", "0,1"]) == 1
    assert not popen


def test_alive_sees_exited_and_zombie_processes():
    from pycaffe_lite.parallel.multi_gpu import _alive

    assert _alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 20
    while _alive(child.pid) and time.monotonic() < deadline:  # exited, not yet reaped: a zombie
        time.sleep(0.05)
    assert not _alive(child.pid)
    child.wait(10)
    assert not _alive(child.pid)
