"""The TCP rendezvous between local processes over loopback: id exchange, bounded waits, lost peers."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from pycaffe_lite.parallel.launch import free_port
from pycaffe_lite.parallel.rendezvous import PeerLostError, Rendezvous, RendezvousError

CTX = mp.get_context("spawn")


def _rank(url, world, rank, out, die_after_meeting=False):
    r = Rendezvous(url, world, rank, timeout=20)
    uid = r.allgather(os.urandom(16).hex() if rank == 0 else None)[0]
    everyone = r.allgather(f"rank{rank}")
    out.put((rank, uid, everyone))
    if die_after_meeting:
        os._exit(9)  # no goodbye
    r.close()


@pytest.mark.slow
def test_two_processes_exchange_the_unique_id():
    url = f"tcp://127.0.0.1:{free_port()}"
    out = CTX.Queue()
    procs = [CTX.Process(target=_rank, args=(url, 3, r, out)) for r in (2, 1)]  # clients first: they retry
    for p in procs:
        p.start()
    _rank(url, 3, 0, out)
    results = sorted(out.get(timeout=20) for _ in range(3))
    for p in procs:
        p.join(20)
        assert p.exitcode == 0
    uids = {uid for _, uid, _ in results}
    assert len(uids) == 1 and len(uids.pop()) == 32
    assert all(everyone == ["rank0", "rank1", "rank2"] for _, _, everyone in results)


@pytest.mark.slow
def test_lost_peer_is_reported_within_seconds():
    url = f"tcp://127.0.0.1:{free_port()}"
    out = CTX.Queue()
    lost = []
    child = CTX.Process(target=_rank, args=(url, 2, 1, out, True))
    child.start()
    r = Rendezvous(url, 2, 0, timeout=20, on_peer_lost=lambda rank, reason: lost.append((rank, reason)))
    r.allgather("uid")
    r.allgather("rank0")
    child.join(20)
    start = time.monotonic()
    with pytest.raises(PeerLostError, match="rank 1 stopped unexpectedly"):
        r.allgather("next")  # would wait for rank 1: fails at once instead
    assert time.monotonic() - start < 5
    assert lost and lost[0][0] == 1 and "connection closed" in lost[0][1]
    r.close()


@pytest.mark.slow
def test_nobody_comes_bounded_wait():
    url = f"tcp://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=r"ranks \[1\] did not connect within 0.5 s"):
        Rendezvous(url, 2, 0, timeout=0.5)
    with pytest.raises(RendezvousError, match="cannot reach rank 0"):
        Rendezvous(url, 2, 1, timeout=0.5)
    assert time.monotonic() - start < 5


def test_rank_out_of_range():
    with pytest.raises(Exception, match="out of range"):
        Rendezvous("tcp://127.0.0.1:1", 2, 2)
