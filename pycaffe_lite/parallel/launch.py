"""``pycaffe-lite train`` on several GPUs and machines: the process launcher and the per-rank session.

``--gpu 0,1`` (or ``all``) starts one ``pycaffe-lite train`` process per GPU (a :class:`Launch`):
they meet over loopback TCP, or at ``--nccl-init tcp://HOST:PORT`` with ``--world-size N`` and
``--rank R`` (this command's first rank) to span machines. A process given one GPU and a world
size above one is a single rank (a :class:`RankJob`), as started by the launcher or by a cluster
launcher (Slurm's ``srun``, ``torchrun``-style ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/
``RANK``/``LOCAL_RANK``). Children inherit the environment unchanged (``NCCL_*`` settings
included) and run in their own session; the launcher forwards SIGINT/SIGHUP/SIGTERM to all of
them. Ranks agree on signal requests every ``config.action_interval`` iterations, so Ctrl-C stops
every rank at the same iteration and rank 0 writes the one snapshot. A rank that exits early
makes the others stop (see :mod:`.rendezvous`); the launcher then reports which rank failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import common
from ..config import config
from ..errors import CaffeError
from ..gpu import backend
from . import nccl
from .multi_gpu import EXIT_PEER_LOST, NCCL, stop_process
from .rendezvous import Rendezvous

log = logging.getLogger("pycaffe_lite")

STOP_GRACE_S = 15.0  # how long the launcher lets the other ranks stop by themselves after a failure
_OWN_FLAGS = ("gpu", "nccl_init", "world_size", "rank")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--nccl-init``, ``--world-size``, ``--rank`` (Caffe's single-dash spellings too)."""
    parser.add_argument("--nccl-init", "-nccl_init", dest="nccl_init", metavar="tcp://HOST:PORT",
                        help="where the ranks of a multi-machine run meet (rank 0 listens there)")
    parser.add_argument("--world-size", "-world_size", dest="world_size", type=int, metavar="N",
                        help="number of ranks (GPUs) over all machines")
    parser.add_argument("--rank", "-rank", dest="rank", type=int, metavar="R",
                        help="this command's (first) rank; with --gpu A,B,... its processes are R, R+1, ...")


def parse_gpu_list(value: str | None, device_count: Callable[[], int] | None = None) -> list[int] | None:
    """``--gpu`` as Caffe reads it: ``"0"`` -> [0], ``"0,1"`` -> [0, 1], ``"all"`` -> every device."""
    if value is None or str(value).strip() == "":
        return None
    value = str(value).strip()
    if value == "all":
        count = (device_count or _device_count)()
        if count < 1:
            raise CaffeError("--gpu all: no CUDA device found")
        return list(range(count))
    try:
        ids = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise CaffeError(f"--gpu {value}: expected device ids (0 or 0,1,...) or 'all'") from None
    if not ids or any(i < 0 for i in ids):
        raise CaffeError(f"--gpu {value}: device ids are >= 0 (Caffe's -1 means CPU: omit --gpu)")
    if len(set(ids)) != len(ids):
        raise CaffeError(f"--gpu {value}: a device is listed twice")
    return ids


def _device_count() -> int:
    return backend._import_driver().Device.count()


def _env_int(env, *names: str) -> int | None:
    for name in names:
        if env.get(name, "").strip().lstrip("-").isdigit():
            return int(env[name])
    return None


@dataclass
class Launch:
    """This command starts one rank per GPU in ``gpus``: ranks ``base_rank ..`` of ``world_size``."""

    gpus: list[int]
    url: str | None
    world_size: int
    base_rank: int


@dataclass
class RankJob:
    """This process is rank ``rank`` of ``world_size`` on GPU ``device``."""

    device: int
    url: str
    world_size: int
    rank: int


def plan(args: argparse.Namespace, env=os.environ, device_count=None) -> Launch | RankJob | None:
    """What ``train`` should do with these arguments; None: one process, as without multi-GPU."""
    gpus = parse_gpu_list(getattr(args, "gpu", None), device_count)
    url, world, rank = args.nccl_init, args.world_size, args.rank
    if url is None and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        url = f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        world = world if world is not None else _env_int(env, "WORLD_SIZE", "SLURM_NTASKS")
        rank = rank if rank is not None else _env_int(env, "RANK", "SLURM_PROCID")
    if gpus is not None and len(gpus) > 1:
        world = len(gpus) if world is None else world
        base = rank or 0
        if base + len(gpus) > world:
            raise CaffeError(f"--gpu {args.gpu} from rank {base}: ranks up to {base + len(gpus) - 1} exceed "
                             f"--world-size {world}")
        if world > len(gpus) and url is None:
            raise CaffeError("--world-size larger than this machine's GPUs needs --nccl-init tcp://HOST:PORT")
        return Launch(gpus, url, world, base)
    if world is None or world <= 1:
        return None
    if url is None:
        raise CaffeError(f"--world-size {world} needs --nccl-init tcp://HOST:PORT (where rank 0 listens)")
    if rank is None or not 0 <= rank < world:
        raise CaffeError(f"--world-size {world} needs --rank in 0..{world - 1}, got {rank}")
    device = gpus[0] if gpus else (_env_int(env, "LOCAL_RANK", "SLURM_LOCALID") or 0)
    return RankJob(device, url, world, rank)


# -- the launcher --------------------------------------------------------------------------------
def forwarded_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The command line for ``args`` without the multi-GPU flags (every flag not at its default)."""
    out: list[str] = []
    for action in parser._actions:
        if not action.option_strings or action.dest in _OWN_FLAGS or action.dest == "help":
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default or value is None:
            continue
        flag = next(o for o in action.option_strings if o.startswith("--"))
        if action.nargs == 0:
            if value == action.const:
                out.append(flag)
        else:
            out += [flag, str(value)]
    return out


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def child_commands(job: Launch, forwarded: Sequence[str]) -> list[list[str]]:
    """One ``python -m pycaffe_lite train ...`` command per GPU of ``job`` (``job.url`` set)."""
    cmds = []
    for i, gpu in enumerate(job.gpus):
        rank = job.base_rank + i
        cmd = [sys.executable, "-m", "pycaffe_lite", "train", *forwarded, "--gpu", str(gpu),
               "--nccl-init", str(job.url), "--world-size", str(job.world_size), "--rank", str(rank)]
        if rank != 0 and "--no-progress" not in cmd:
            cmd.append("--no-progress")
        cmds.append(cmd)
    return cmds


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}" + (" (a peer rank stopped)" if code == EXIT_PEER_LOST else "")


def supervise(job: Launch, procs: list[subprocess.Popen], poll_s: float = 0.1, grace_s: float = STOP_GRACE_S) -> int:
    """Wait for the ranks; after the first failure give the others ``grace_s`` to stop, then end
    them. Returns 0, or raises CaffeError naming the rank that failed first."""
    failed: list[tuple[int, int]] = []  # (rank index, code), in the order seen
    deadline = None
    while True:
        for i, p in enumerate(procs):
            code = p.poll()
            if code not in (None, 0) and all(i != j for j, _ in failed):
                failed.append((i, code))
                deadline = deadline or time.monotonic() + grace_s
        if all(p.poll() is not None for p in procs):
            break
        if deadline is not None and time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(5.0)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5.0)
            break
        time.sleep(poll_s)
    if not failed:
        return 0
    first = next(((i, c) for i, c in failed if c != EXIT_PEER_LOST), failed[0])
    i, code = first
    others = [f"rank {job.base_rank + j} {_describe(c)}" for j, c in failed if j != i]
    raise CaffeError(f"rank {job.base_rank + i} (GPU {job.gpus[i]}) {_describe(code)}; training stopped"
                     + (f" ({'; '.join(others)})" if others else ""))


def run_launch(job: Launch, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Start the ranks of ``job`` as child processes and supervise them."""
    nccl.library()  # fail here, once, with what to install
    try:
        count = _device_count()
    except CaffeError as exc:
        raise CaffeError(f"multi-GPU training on GPUs {job.gpus}: {exc}") from None
    if max(job.gpus) >= count:
        raise CaffeError(f"multi-GPU training on GPUs {job.gpus}: only {count} CUDA device(s) here")
    if job.url is None:
        job.url = f"tcp://127.0.0.1:{free_port()}"
    cmds = child_commands(job, forwarded_arguments(args, parser))
    log.info("Using GPUs %s (ranks %d..%d of %d, rendezvous %s)", job.gpus, job.base_rank,
             job.base_rank + len(job.gpus) - 1, job.world_size, job.url)
    procs: list[subprocess.Popen] = []

    def forward(signum, frame) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    sigs = [s for s in (signal.SIGINT, getattr(signal, "SIGHUP", None), signal.SIGTERM) if s is not None]
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, forward) for s in sigs}
    try:
        for i, cmd in enumerate(cmds):
            procs.append(subprocess.Popen(cmd, start_new_session=True))  # env inherited unchanged
            log.info("rank %d: GPU %d, pid %d", job.base_rank + i, job.gpus[i], procs[-1].pid)
        return supervise(job, procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for s, h in previous.items():
            signal.signal(s, h)


# -- one rank ------------------------------------------------------------------------------------
class RankSession:
    """A rank's side of a run: rendezvous, NCCL, agreed signal actions, goodbye."""

    def __init__(self, job: RankJob, timeout: float | None = None) -> None:
        self.job = job
        self.nccl: NCCL | None = None
        common.set_solver_count(job.world_size)
        common.set_solver_rank(job.rank)
        common.set_multiprocess(True)
        if job.rank != 0:
            log.setLevel(max(log.level, logging.WARNING))  # rank 0 logs for everyone, as in Caffe
        nccl.library()
        self.rendezvous = Rendezvous(job.url, job.world_size, job.rank, timeout, on_peer_lost=self._peer_lost)
        self._requests: set[str] = set()
        self._start_iter: int | None = None

    def _peer_lost(self, rank: int, reason: str) -> None:
        stop_process(f"rank {rank} stopped unexpectedly: {reason}", self.nccl)

    def attach(self, solver) -> None:
        """Join the NCCL communicator, broadcast rank 0's weights, register the reductions."""
        mine = nccl.new_unique_id().hex() if self.job.rank == 0 else None
        uid = bytes.fromhex(self.rendezvous.allgather(mine)[0])
        where = self.rendezvous.allgather(f"{socket.gethostname()} GPU {self.job.device} pid {os.getpid()}")
        for r, w in enumerate(where):
            log.info("rank %d: %s", r, w)
        with _deadline(self.rendezvous.timeout, "NCCL set-up (ncclCommInitRank and the weight broadcast)"):
            self.nccl = NCCL(solver, uid)
            self.nccl.bcast()
        solver.add_callback(self.nccl)
        if solver.param.layer_wise_reduce:
            solver.net.after_backward(self.nccl)
        log.info("NCCL %s: %d ranks, %d gradient buckets%s", ".".join(map(str, nccl.version())),
                 self.job.world_size, len(self.nccl.buckets),
                 " reduced during backward" if solver.param.layer_wise_reduce else "")

    def agreed(self, local: Callable[[], str], solver) -> Callable[[], str]:
        """An action function for ``solver``: the local requests (signals) are pooled and every rank
        acts on them at the same iteration (every ``config.action_interval`` iterations): stop > snapshot."""
        self._start_iter = solver.iter

        def action() -> str:
            request = local()
            if request != "none":
                self._requests.add(request)
            it = solver.iter
            if it == self._start_iter or it % config.action_interval or it == getattr(action, "last", None):
                return "none"
            action.last = it  # type: ignore[attr-defined]
            pooled = set().union(*(set(r) for r in self.rendezvous.allgather(sorted(self._requests))))
            self._requests.clear()
            return "stop" if "stop" in pooled else "snapshot" if "snapshot" in pooled else "none"

        return action

    def close(self) -> None:
        self.rendezvous.close()


class _deadline:
    """``with _deadline(s, what):`` ends the process (EXIT_PEER_LOST) if the block takes over ``s``."""

    def __init__(self, seconds: float, what: str) -> None:
        self.timer = threading.Timer(seconds, stop_process, (f"{what} did not finish within {seconds:g} s",))
        self.timer.daemon = True

    def __enter__(self) -> None:
        self.timer.start()

    def __exit__(self, *exc) -> None:
        self.timer.cancel()
