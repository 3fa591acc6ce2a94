"""Snapshots that lose nothing: the ``.caffemodel`` / ``.solverstate`` pair, leftovers of killed
runs, and the read positions that make a resumed run equal an uninterrupted one.

* ``write_pair`` writes both files to temporary files (``durable.temp_path``, fsynced), records ``<final> <temporary>`` for both in a journal file ``.<prefix>_iter_<n>.pending``,
  renames both into place and removes the journal. A run killed at any point leaves either the
  complete pair or leftovers that ``clean_leftovers`` (run when a solver starts) removes: temporary
  files of dead processes, and a pair whose journal shows that one file was renamed and the other
  not (the half of a new pair, or a new file beside the old one of the same name). So under their
  final names the two files are complete together or absent together, and an older pair that a
  killed run was about to replace stays as it was unless a rename had begun.
* Disk-full and permission errors raise ``SnapshotError`` naming the file; earlier snapshots are
  untouched, so the run can be resumed from the last complete one.
* Files and folders follow the umask (``tempfile`` would make them 0600 / 0700).
* ``SolverState.data_state`` (a pycaffe-lite extension field that BVLC ignores) records each data
  layer's next record and random state, ``SolverState.rng_state`` the process-wide generator.
  Layers that read on record their position with ``read_state() -> (position, key, rng_json)``
  and take it back with ``restore_read_state``: Data (record index and key, transform state),
  ImageData (line, its path, shuffle and transform state), HDF5Data (row, file, shuffle states),
  MemoryData (the next item; give the arrays before resuming). DummyData draws from the
  process-wide generator and Input holds what the caller puts in: nothing of theirs to record.
  A shuffled order is recorded as the generator state it was drawn from (``data.order.Order``), a
  few hundred bytes however long the list, and drawn again on restore.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import common
from ..durable import describe, fsync_dir, pid_alive, remove_stale_temps, write_temp, writer_alive
from ..errors import WeightsError
from ..schema import caffe_pb2

if TYPE_CHECKING:
    from ..net_graph import NetGraph

log = logging.getLogger("pycaffe_lite")

class SnapshotError(WeightsError):
    """A snapshot could not be written (disk full, permissions...); earlier snapshots are kept."""



def _journal(model: Path) -> Path:
    return model.parent / f".{model.stem}.pending"


def write_pair(model: str | os.PathLike, model_bytes: bytes, state: str | os.PathLike, state_bytes: bytes) -> None:
    """Write a ``.caffemodel`` and its ``.solverstate`` so that both appear, or neither (see the
    module docstring). SnapshotError naming the file on disk-full or permission errors."""
    model, state = Path(model), Path(state)
    current = model
    temps: list[Path] = []
    journal = _journal(model)
    placed: list[Path] = []
    try:
        current = model.parent
        model.parent.mkdir(parents=True, exist_ok=True)
        current = model
        temps.append(write_temp(model, model_bytes))
        current = state
        temps.append(write_temp(state, state_bytes))
        current = journal
        journal.write_text("".join(f"{final.name} {tmp.name}\n" for final, tmp in zip((model, state), temps)))
        for tmp, final in zip(temps, (model, state)):
            current = final
            os.replace(tmp, final)
            placed.append(final)
        fsync_dir(model.parent)
        journal.unlink(missing_ok=True)
    except OSError as exc:
        for p in (*temps, *placed, journal):
            try:
                p.unlink(missing_ok=True)
            except OSError:  # (e.g. the folder is a file: nothing was written)
                pass
        raise SnapshotError(
            f"{current}: cannot write the snapshot: {describe(exc)}; earlier snapshots are kept "
            "(resume from the last complete .solverstate)"
        ) from None


def _settle(journal: Path) -> list[Path]:
    """Finish what a killed ``write_pair`` left: remove its journal, and the pair's files if it was
    renamed in part (a file is renamed when its temporary is gone). Returns the removed paths."""
    try:
        lines = [line.split() for line in journal.read_text().splitlines()]
    except OSError:
        return []
    files = [(journal.parent / line[0], journal.parent / line[1]) for line in lines if len(line) == 2]
    if any(writer_alive(tmp) for _, tmp in files):  # still being written
        return []
    renamed = [not tmp.exists() for _, tmp in files]
    removed = []
    if any(renamed) and not all(renamed):
        for final, _ in files:
            if final.exists():
                final.unlink()
                removed.append(final)
    journal.unlink(missing_ok=True)
    return [*removed, journal]


def clean_leftovers(prefix: str | os.PathLike) -> list[Path]:
    """Remove what killed runs left beside the snapshots of ``prefix``: temporary files of dead
    processes, and pairs a journal says were half renamed. Returns the removed paths."""
    prefix = Path(prefix)
    directory = prefix.parent if str(prefix.parent) else Path(".")
    if not directory.is_dir():
        return []
    base = prefix.name
    removed: list[Path] = []
    for journal in directory.glob(f".{glob.escape(base)}_iter_*.pending"):  # first: they tell renamed
        removed += _settle(journal)  # files by their missing temporaries
    removed += remove_stale_temps(directory, lambda name: name.startswith(f"{base}_iter_"))
    for p in removed:
        log.info("Removed %s (left by an interrupted snapshot)", p)
    return removed


# ----------------------------------------------------------------------------------------------
# one run per snapshot_prefix
class SnapshotLockError(SnapshotError):
    """Another live process trains with the same ``snapshot_prefix``."""


def _start_time(pid: int) -> str:
    """The start time of process ``pid`` (clock ticks since boot, from /proc), or "" if unknown:
    with the pid it tells a live owner from an unrelated process that reused the pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


class PrefixLock:
    """``<prefix>.lock``: held while a solver trains (``Solver.step``), so two runs cannot write
    the same snapshots. It holds the owner's pid and start time; a lock whose owner has ended (a
    killed run) is stale and taken over, as temporary files of ended writers are removed. Solvers
    of one process share it (only the first one to take it removes it)."""

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.path = Path(f"{prefix}.lock")
        self.held = False

    def _owner(self) -> tuple[int, str] | None:
        try:
            parts = self.path.read_text().split()
            return int(parts[0]), parts[1] if len(parts) > 1 else ""
        except (OSError, ValueError, IndexError):
            return None

    def acquire(self) -> PrefixLock:
        me = f"{os.getpid()} {_start_time(os.getpid())}\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # no lock possible: a snapshot, if one is written, reports the problem
            log.warning("%s: cannot create the snapshot folder (%s): training without a snapshot lock",
                        self.path.parent, describe(exc))
            return self
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                owner = self._owner()
                if owner is None:  # being written, or garbage: look again, then take it over
                    import time

                    time.sleep(0.05)
                    if self._owner() is None:
                        self.path.unlink(missing_ok=True)
                    continue
                pid, started = owner
                if pid == os.getpid():
                    return self  # another solver of this process holds it
                if pid_alive(pid) and (not started or not _start_time(pid) or _start_time(pid) == started):
                    raise SnapshotLockError(
                        f"{self.path}: snapshot_prefix '{self.path.name[:-5]}' is in use by another training run "
                        f"(process {pid}); two runs would overwrite each other's snapshots. Give this run "
                        "another snapshot_prefix, or stop the other run (if no such run exists, remove the lock "
                        "file)"
                    ) from None
                log.info("Removed %s (stale lock of ended process %d)", self.path, pid)
                self.path.unlink(missing_ok=True)
                continue
            except OSError as exc:  # a read-only folder: training without snapshots still works
                log.warning("%s: cannot create the snapshot lock file (%s): training without a snapshot lock",
                            self.path, describe(exc))
                return self
            with os.fdopen(fd, "w") as fh:
                fh.write(me)
            self.held = True
            return self
        raise SnapshotLockError(f"{self.path}: could not take the snapshot lock (other runs keep taking it)")

    def release(self) -> None:
        """Remove the lock file; one that cannot be removed (its folder turned read-only) is a
        warning, never a second error: the next run takes it over as stale."""
        if not self.held:
            return
        self.held = False
        owner = self._owner()
        if owner is not None and owner[0] == os.getpid():
            try:
                self.path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("%s: cannot remove the snapshot lock (%s); the next run takes it over as stale "
                            "(or remove it by hand)", self.path, describe(exc))


# solvers of this process by snapshot prefix: the last one that trained with it
_IN_PROCESS: dict[str, weakref.ref] = {}


def claim_prefix(prefix: str, solver: Any, where: str) -> None:
    """Record ``solver`` as the one of this process training with ``prefix``, with a warning when
    another live Solver of this process used it and has not reached its ``max_iter``: the two
    would overwrite each other's snapshots (the prefix lock file only tells processes apart). A
    warning, not an error: comparing two solvers of one file, or resuming in the process that
    wrote the snapshot, are what pycaffe scripts do."""
    key = os.path.abspath(prefix)
    ref = _IN_PROCESS.get(key)

    def rival() -> Any:
        other = ref() if ref is not None else None
        busy = other is not None and other is not solver and other.iter < other.param.max_iter
        return other if busy else None

    if rival() is not None:
        import gc

        gc.collect()  # a solver that is only garbage (a notebook cell run again) does not count
        other = rival()
        if other is not None:
            log.warning(
                "%s: snapshot_prefix '%s' is also used by another Solver of this process (%s, at iteration %d of "
                "%d): their snapshots overwrite each other's. Give one of them another snapshot_prefix, or drop "
                "the other one (del it) first", where, prefix, other.where, other.iter, other.param.max_iter)
    _IN_PROCESS[key] = weakref.ref(solver)


# ----------------------------------------------------------------------------------------------
# data positions and random state
def save_extras(nets: Mapping[str, NetGraph], state: caffe_pb2.SolverState) -> None:
    """Record the read position of every data layer of ``nets`` (``{"train": g, "test0": g...}``)
    and the random state in ``state``."""
    for net_id, net in nets.items():
        for name, layer in zip(net.layer_names, net.layers):
            read_state = getattr(layer, "read_state", None)
            if read_state is None:
                continue
            position, key, rng_json = read_state()
            entry = state.data_state.add()
            entry.net, entry.layer, entry.position, entry.key = net_id, name, int(position), bytes(key)
            entry.rng_state = rng_json
    state.rng_state = json.dumps({"generator": common.rng().bit_generator.state,
                                  "gpu_rng_counter": common.context().gpu_rng_counter})


def restore_extras(nets: Mapping[str, NetGraph], state: caffe_pb2.SolverState, path: str) -> None:
    """Put every data layer of ``nets`` back at its recorded position (states written by BVLC or
    older pycaffe-lite versions have none: the layers then restart, as in BVLC)."""
    seen: dict[tuple[str, str], int] = {}  # duplicate layer names: the k-th entry of a name -> k-th layer
    for entry in state.data_state:
        net = nets.get(entry.net)
        layer = None
        if net is not None:
            k = seen[(entry.net, entry.layer)] = seen.get((entry.net, entry.layer), -1) + 1
            same = [i for i, n in enumerate(net.layer_names) if n == entry.layer and hasattr(net.layers[i], "read_state")]
            layer = net.layers[same[k]] if k < len(same) else None
        if layer is None or not hasattr(layer, "restore_read_state"):
            log.warning("%s: data position of %s layer '%s' has no matching data layer: ignored",
                        path, entry.net, entry.layer)
            continue
        layer.restore_read_state(entry.position, entry.key, entry.rng_state, where=f"{path}: layer '{entry.layer}'")
    if state.HasField("rng_state"):
        gen = common.rng().bit_generator
        before = gen.state
        try:
            saved = json.loads(state.rng_state)
            gen.state = saved["generator"]
            counter = int(saved.get("gpu_rng_counter", 0))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            gen.state = before
            raise WeightsError(f"{path}: corrupt random-state field (rng_state): {type(exc).__name__}: {exc}; the "
                               "file is damaged (resume from an earlier snapshot)") from None
        common.context().gpu_rng_counter = counter

