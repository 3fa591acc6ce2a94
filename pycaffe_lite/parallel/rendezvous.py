"""Rendezvous over TCP: the ranks of one run find each other, exchange small values, watch each other.

Rank 0 listens on ``tcp://HOST:PORT``; every other rank connects (retrying until the timeout) and
keeps its connection for the whole run. Messages are JSON lines through rank 0 (a star).
:meth:`Rendezvous.allgather` is the one collective (NCCL's unique id, signal requests, host
names); every wait is bounded by ``timeout``. The connections double as a liveness check: a rank
whose connection closes before it said goodbye (it crashed or was killed) is reported to every
other rank's ``on_peer_lost(rank, reason)`` within moments, and waits in progress raise
:class:`PeerLostError` naming it.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..config import config
from ..errors import CaffeError

log = logging.getLogger("pycaffe_lite")



class RendezvousError(CaffeError):
    """The ranks could not meet or exchange in time."""


class PeerLostError(RendezvousError):
    """Another rank stopped without saying goodbye."""


def parse_init(url: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` -> (HOST, PORT)."""
    if not url.startswith("tcp://") or ":" not in url[6:]:
        raise CaffeError(f"--nccl-init {url}: expected tcp://HOST:PORT")
    host, _, port = url[6:].rstrip("/").rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CaffeError(f"--nccl-init {url}: expected tcp://HOST:PORT with a port in 1..65535")
    return host, int(port)


class _Peer:
    """One connection (from rank 0: to a client rank; from a client: to rank 0)."""

    def __init__(self, sock: socket.socket, rank: int) -> None:
        self.sock = sock
        self.rank = rank
        self.inbox: queue.Queue = queue.Queue()
        self.said_bye = threading.Event()
        self.lock = threading.Lock()
        self.reader = sock.makefile("r", encoding="utf-8")

    def send(self, **msg: Any) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self.lock:
            self.sock.sendall(data)

    def read(self) -> dict | None:
        line = self.reader.readline()
        return json.loads(line) if line else None


class Rendezvous:
    """This process's place (``rank`` of ``world_size``) in the run that meets at ``url``."""

    def __init__(self, url: str, world_size: int, rank: int, timeout: float | None = None,
                 on_peer_lost: Callable[[int, str], None] | None = None) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise CaffeError(f"rank {rank} is out of range for world size {world_size}")
        self.host, self.port = parse_init(url)
        self.world_size, self.rank, self.timeout = (
            int(world_size), int(rank), float(config.nccl_timeout if timeout is None else timeout))
        self.on_peer_lost = on_peer_lost
        self.lost: str | None = None
        self.closing = False
        self.peers: dict[int, _Peer] = {}
        self._server: socket.socket | None = None
        deadline = time.monotonic() + self.timeout
        if rank == 0:
            self._serve(deadline)
        elif world_size > 1:
            self._connect(deadline)
        for peer in self.peers.values():
            threading.Thread(target=self._read_loop, args=(peer,), name=f"rendezvous rank {peer.rank}",
                             daemon=True).start()

    # -- meeting --------------------------------------------------------------------------------
    def _serve(self, deadline: float) -> None:
        server = self._server = socket.create_server((self.host, self.port), reuse_port=False)
        try:
            while len(self.peers) < self.world_size - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(1, self.world_size)) - set(self.peers))
                    raise RendezvousError(f"rendezvous at tcp://{self.host}:{self.port}: ranks {missing} did not "
                                          f"connect within {self.timeout:g} s")
                server.settimeout(min(left, 1.0))
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                sock.settimeout(max(1.0, left))
                peer = _Peer(sock, -1)
                try:
                    hello = peer.read()
                except (OSError, ValueError):
                    sock.close()
                    continue
                sock.settimeout(None)
                rank = hello.get("rank") if isinstance(hello, dict) else None
                if not isinstance(hello, dict) or not isinstance(rank, int) or not 0 < rank < self.world_size \
                        or rank in self.peers or hello.get("world_size") != self.world_size:
                    peer.send(kind="reject", reason=f"bad hello {hello!r} for world size {self.world_size}")
                    sock.close()
                    continue
                peer.rank = rank
                self.peers[rank] = peer
        except BaseException:
            self._close_sockets()
            raise
        for peer in self.peers.values():
            peer.send(kind="welcome")

    def _connect(self, deadline: float) -> None:
        while True:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(0.1, min(left, 5.0)))
                break
            except OSError as exc:
                if left <= 0:
                    raise RendezvousError(f"rank {self.rank}: cannot reach rank 0 at tcp://{self.host}:{self.port} "
                                          f"within {self.timeout:g} s ({exc})") from None
                time.sleep(0.1)
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        peer = _Peer(sock, 0)
        try:
            peer.send(rank=self.rank, world_size=self.world_size)
            reply = peer.read()
        except OSError as exc:
            sock.close()
            raise RendezvousError(f"rank {self.rank}: rendezvous with rank 0 failed: {exc}") from None
        if not reply or reply.get("kind") != "welcome":
            sock.close()
            raise RendezvousError(f"rank {self.rank}: rank 0 refused the connection: {reply!r}")
        sock.settimeout(None)
        self.peers[0] = peer

    # -- liveness -------------------------------------------------------------------------------
    def _read_loop(self, peer: _Peer) -> None:
        while True:
            try:
                msg = peer.read()
            except (OSError, ValueError):
                msg = None
            if msg is None:
                if not (self.closing or peer.said_bye.is_set()):
                    self._peer_lost(peer.rank, "its connection closed (the process exited or was killed)")
                return
            kind = msg.get("kind")
            if kind == "bye":
                peer.said_bye.set()
            elif kind == "lost":
                self._peer_lost(int(msg["rank"]), str(msg["reason"]))
            else:
                peer.inbox.put(msg)

    def _peer_lost(self, rank: int, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = f"rank {rank} stopped unexpectedly: {reason}"
        if self.rank == 0:
            for other in self.peers.values():
                if other.rank != rank:
                    try:
                        other.send(kind="lost", rank=rank, reason=reason)
                    except OSError:
                        pass
        if self.on_peer_lost is not None:
            self.on_peer_lost(rank, reason)

    def _get(self, peer: _Peer, timeout: float | None) -> dict:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if self.lost is not None:
                raise PeerLostError(self.lost)
            try:
                return peer.inbox.get(timeout=0.05)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RendezvousError(f"rank {self.rank}: no message from rank {peer.rank} within "
                                          f"{self.timeout if timeout is None else timeout:g} s") from None

    # -- the collective -------------------------------------------------------------------------
    def allgather(self, value: Any, timeout: float | None = None) -> list[Any]:
        """Every rank's ``value`` (JSON-serialisable), indexed by rank; all ranks must call it."""
        if self.world_size == 1:
            return [value]
        if self.rank == 0:
            values = [value] + [None] * (self.world_size - 1)
            for rank, peer in sorted(self.peers.items()):
                values[rank] = self._get(peer, timeout)["value"]
            for peer in self.peers.values():
                peer.send(kind="result", value=values)
            return values
        peer = self.peers[0]
        peer.send(kind="value", value=value)
        return list(self._get(peer, timeout)["value"])

    def close(self, timeout: float | None = None) -> None:
        """Say goodbye. Rank 0 waits (bounded) for every rank's goodbye before closing."""
        if self.closing:
            return
        self.closing = True
        try:
            if self.rank == 0:
                deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
                for peer in self.peers.values():
                    while not peer.said_bye.wait(0.05) and self.lost is None and time.monotonic() < deadline:
                        pass
            else:
                for peer in self.peers.values():
                    peer.send(kind="bye")
        except OSError:
            pass
        finally:
            self._close_sockets()

    def _close_sockets(self) -> None:
        for peer in self.peers.values():
            try:
                peer.sock.close()
            except OSError:
                pass
        if self._server is not None:
            self._server.close()
