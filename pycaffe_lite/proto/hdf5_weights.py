"""Net weights and solver states in Caffe's HDF5 layout (``snapshot_format: HDF5``).

Weights (``.caffemodel.h5``, BVLC's ``Net::ToHDF5`` / ``CopyTrainedLayersFromHDF5``): group
``/data/<layer name>`` holds one dataset per param, named ``0``, ``1``, ... (the blob's shape,
float32 or float64 as the net); a param shared from another layer is stored only under its owner.
With ``write_diff`` a ``/diff`` group holds every param's diff the same way. A layer name with
``/`` (GoogLeNet's ``inception_3a/1x1``) is an HDF5 path: its group is nested
(``/data/inception_3a/1x1/0``), and loading looks every net layer up by that path, so such names
round-trip. Loading follows ``.caffemodel`` rules: file layers that match no net layer are ignored
(logged), net layers with params that the file lacks keep their values with a warning, or are a
WeightsError with ``allow_missing=False``; blob counts and shapes must match.

Solver states (``.solverstate.h5``, BVLC's ``SnapshotSolverStateToHDF5``): int datasets ``iter``
and ``current_step`` (shape ``(1,)``), string dataset ``learned_net`` and group ``history`` with
datasets ``0`` ... ``n-1``. pycaffe-lite adds a dataset ``pycaffe_lite_state`` holding a serialized
``SolverState`` with only the data layers' read positions and the random state (BVLC ignores it).

Files are built in memory and written through a temporary file renamed into place, so a killed
write never destroys an existing file.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..durable import remove_stale_temps, write_temp
from ..errors import WeightsError
from ..optional import require
from ..schema import caffe_pb2

if TYPE_CHECKING:
    from ..net_graph import NetGraph
    from ..schema import caffe_pb2

log = logging.getLogger("pycaffe_lite")

EXTRAS_DATASET = "pycaffe_lite_state"


def _h5py():
    return require("h5py", feature="HDF5 weights and solver states")


_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def is_hdf5_file(path: str | os.PathLike) -> bool:
    """True when ``path`` starts with the HDF5 signature (how Caffe tells .h5 weights apart)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(8) == _HDF5_MAGIC
    except OSError:
        return False


def _param_ids(net: NetGraph) -> dict[tuple[int, int], int]:
    return {pair: i for i, pair in enumerate(net.param_layer_indices)}


def _check_name(name: str, filename: str) -> None:
    parts = name.split("/")
    if not name or any(p in ("", ".") for p in parts):
        raise WeightsError(f"{filename}: layer name '{name}' cannot name an HDF5 group (empty part or leading, "
                           "trailing or doubled '/')")


def to_bytes(net: NetGraph, write_diff: bool = False, filename: str = "<hdf5>") -> bytes:
    """The weights file ``save`` writes, as bytes (see the module docstring for the layout)."""
    h5py = _h5py()
    ids = _param_ids(net)
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        roots = [f.create_group("data")] + ([f.create_group("diff")] if write_diff else [])
        written: dict[str, int] = {}  # group name -> layer that wrote datasets into it
        for li, (name, layer) in enumerate(zip(net.layer_names, net.layers)):
            _check_name(name, filename)
            groups = [root.require_group(name) for root in roots]
            if layer.blobs:
                if name in written:
                    raise WeightsError(
                        f"{filename}: layers {written[name]} and {li} are both named '{name}' and both have "
                        "params: an HDF5 weights file keeps one group per name (save a .caffemodel instead)"
                    )
                written[name] = li
            for j, blob in enumerate(layer.blobs):
                try:
                    if net.param_owners[ids[(li, j)]] == -1:  # only owners hold data, as in Caffe
                        # (float16 params as float16 datasets; bfloat16, which HDF5 lacks, as float32)
                        groups[0].create_dataset(str(j), data=blob.math_data() if blob.dtype == np.uint16
                                                 else blob.cpu_data())
                    if write_diff:  # diffs of every param, shared or not
                        groups[1].create_dataset(str(j), data=blob.math_diff() if blob.diff_dtype == np.uint16
                                                 else blob.cpu_diff())
                except ValueError as exc:  # a name clash inside the file
                    raise WeightsError(f"{filename}: cannot store layer '{name}' param {j}: {exc}") from None
    return buf.getvalue()


def save(net: NetGraph, filename: str | os.PathLike, write_diff: bool = False) -> None:
    """Write the params in Caffe's HDF5 layout, atomically (temporary file, then rename)."""
    final = Path(filename)
    data = to_bytes(net, write_diff, os.fspath(filename))
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(final.parent, lambda name: name == final.name)
        tmp = write_temp(final, data)
        try:
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise WeightsError(f"{filename}: cannot write the HDF5 weights: {exc.strerror or exc}") from None


def _open(filename: str, what: str):
    h5py = _h5py()
    if os.path.isdir(filename):
        raise WeightsError(f"{filename}: is a folder, not an HDF5 {what} file")
    try:
        return h5py.File(filename, "r")
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{filename}: cannot open the HDF5 {what} file: {exc}") from None


def _datasets(group) -> dict[str, object]:
    h5py = _h5py()
    return {k: v for k, v in group.items() if k.isdigit() and isinstance(v, h5py.Dataset)}


def _fill_layer(net: NetGraph, li: int, lname: str, stored: dict[str, object], ids: dict[tuple[int, int], int],
                filename: str) -> bool:
    """Copy layer ``li``'s params from its group's datasets ``stored``; False where the group holds
    none for it (a layer without params, or an empty parent of ``name/...`` groups)."""
    layer = net.layers[li]
    if len(stored) > len(layer.blobs):
        raise WeightsError(
            f"{filename}: layer '{lname}' has {len(stored)} blobs in the file but "
            f"{len(layer.blobs)} in the net"
        )
    if not layer.blobs:
        return False
    if not stored and any(net.param_owners[ids[(li, j)]] == -1 for j in range(len(layer.blobs))):
        return False  # an empty group (e.g. only the parent of 'name/...' groups): no weights here
    for j, blob in enumerate(layer.blobs):
        key = str(j)
        if key not in stored:
            if net.param_owners[ids[(li, j)]] == -1:
                raise WeightsError(f"{filename}: layer '{lname}' lacks param {j} "
                                   f"(the file holds {len(stored)} of its {len(layer.blobs)})")
            continue  # shared params are stored under their owner
        values = np.asarray(stored[key][()])  # type: ignore[index]
        if values.dtype.kind not in "biuf":  # strings, objects, compounds: not weights
            raise WeightsError(f"{filename}: layer '{lname}' param {j}: the dataset /data/{lname}/{key} holds "
                               f"{values.dtype} values, not numbers (not a Caffe weights file, or a broken one)")
        if tuple(values.shape) != blob.shape:
            raise WeightsError(
                f"{filename}: layer '{lname}' param {j}: shape mismatch: net has "
                f"{blob.shape}, file has {tuple(values.shape)}"
            )
        blob.set_math_data(values)  # (rounded into a half param's storage)
    return True


def load(net: NetGraph, filename: str | os.PathLike, allow_missing: bool = True) -> list[str]:
    """Copy params from a Caffe HDF5 weights file (rules in the module docstring). Returns the net
    layers with params that got none (warned about; a WeightsError with ``allow_missing=False``).
    With duplicate layer names the last layer of a name is filled, as BVLC's HDF5 loader does."""
    h5py = _h5py()
    filename = os.fspath(filename)
    ids = _param_ids(net)
    targets: dict[str, int] = {}
    for i, name in enumerate(net.layer_names):
        targets[name] = i  # the last layer of a name (BVLC's layer_names_index_)
    with _open(filename, "weights") as f:
        data = f.get("data")
        if not isinstance(data, h5py.Group):
            raise WeightsError(f"{filename}: no 'data' group (not a Caffe HDF5 weights file)")
        filled: set[int] = set()
        for lname, li in targets.items():
            try:
                group = data.get(lname) if lname and not lname.startswith("/") else None
            except (KeyError, ValueError):
                group = None
            if not isinstance(group, h5py.Group):
                continue
            if _fill_layer(net, li, lname, _datasets(group), ids, filename):
                filled.add(li)
        known = {n.split("/")[0] for n in targets}
        ignored = [k for k in data if k not in known]
        if ignored:
            log.info("%s: ignoring source layer%s %s (not in net '%s')", filename, "s" if len(ignored) > 1 else "",
                     ", ".join(ignored), net.name)
    missing = [n for i, (n, layer) in enumerate(zip(net.layer_names, net.layers)) if layer.blobs and i not in filled]
    if missing and not allow_missing:
        raise WeightsError(
            f"{filename}: holds no weights for layer{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"of net '{net.name}' (truncated file, or weights of another net?); pass --allow-missing "
            "(allow_missing=True) to run with their initial values"
        )
    if missing:
        from ..net_graph import warn_missing_weights

        shown = {name: i for name, i in targets.items() if i in filled}
        warn_missing_weights(net, filename, missing, shown,
                             "an HDF5 file's weights go to the last net layer of a name, as in BVLC")
    return missing


# ----------------------------------------------------------------------------------------------
# solver states
def state_to_bytes(state: caffe_pb2.SolverState, history: list[np.ndarray]) -> bytes:
    """A ``.solverstate.h5`` holding ``state``'s iter, current_step, learned_net and extras
    (data positions, random state) and the ``history`` arrays."""
    h5py = _h5py()

    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        f.create_dataset("iter", data=np.array([state.iter], np.int32))
        name = state.learned_net.encode()
        f.create_dataset("learned_net", data=np.array(name + b"\0", dtype=f"S{len(name) + 1}"))
        f.create_dataset("current_step", data=np.array([state.current_step], np.int32))
        g = f.create_group("history")
        for i, h in enumerate(history):
            g.create_dataset(str(i), data=h)
        extras = caffe_pb2.SolverState()
        extras.data_state.extend(state.data_state)
        if state.HasField("rng_state"):
            extras.rng_state = state.rng_state
        f.create_dataset(EXTRAS_DATASET, data=np.frombuffer(extras.SerializeToString(), np.uint8))
    return buf.getvalue()


def _int(f, name: str, filename: str) -> int:
    ds = f.get(name)
    try:
        values = np.asarray(ds[()]).ravel()
        if values.size != 1 or values.dtype.kind not in "iu":
            raise ValueError
        return int(values[0])
    except (TypeError, ValueError, KeyError):
        raise WeightsError(f"{filename}: '{name}' is missing or not one integer (not a Caffe HDF5 solver "
                           "state?)") from None


def read_state(filename: str | os.PathLike) -> tuple[caffe_pb2.SolverState, list[np.ndarray]]:
    """The SolverState (no history) and the history arrays of a ``.solverstate.h5``."""
    h5py = _h5py()

    filename = os.fspath(filename)
    state = caffe_pb2.SolverState()
    with _open(filename, "solver state") as f:
        extras = f.get(EXTRAS_DATASET)
        if isinstance(extras, h5py.Dataset):
            try:
                state.ParseFromString(np.asarray(extras[()], np.uint8).tobytes())
            except Exception as exc:
                raise WeightsError(f"{filename}: corrupt '{EXTRAS_DATASET}' dataset: {exc}") from None
        state.iter = _int(f, "iter", filename)
        state.current_step = _int(f, "current_step", filename)
        net = f.get("learned_net")
        if isinstance(net, h5py.Dataset):
            raw = net[()]
            raw = raw.tobytes() if isinstance(raw, np.ndarray) else raw
            state.learned_net = (raw if isinstance(raw, bytes) else str(raw).encode()).rstrip(b"\0").decode(
                errors="replace")
        group = f.get("history")
        if not isinstance(group, h5py.Group):
            raise WeightsError(f"{filename}: no 'history' group (not a Caffe HDF5 solver state)")
        stored = _datasets(group)
        if len(stored) != len(group):
            raise WeightsError(f"{filename}: the 'history' group holds entries other than datasets 0..n-1")
        history = []
        for i in range(len(stored)):
            if str(i) not in stored:
                raise WeightsError(f"{filename}: history dataset {i} is missing")
            values = np.asarray(stored[str(i)][()])  # type: ignore[index]
            if values.dtype.kind not in "biuf":
                raise WeightsError(f"{filename}: history dataset {i} holds {values.dtype} values, not numbers")
            history.append(values)
    return state, history
