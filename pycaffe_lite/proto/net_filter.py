"""Net-definition rewriting done before a Net is built, as in Caffe's net.cpp and insert_splits.cpp:
phase/level/stage filtering, legacy net-level inputs, and Split insertion for shared blobs.
"""

from __future__ import annotations

from ..errors import NetError
from ..schema import caffe_pb2


def state_meets_rule(state: caffe_pb2.NetState, rule: caffe_pb2.NetStateRule) -> bool:
    """True when ``state`` satisfies every condition of ``rule`` (Caffe's StateMeetsRule)."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(s not in stages for s in rule.stage):
        return False
    if any(s in stages for s in rule.not_stage):
        return False
    return True


def filter_net(param: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """Keep the layers whose include/exclude rules admit ``param.state``."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    for layer in param.layer:
        if layer.include and layer.exclude:
            raise NetError(f"layer '{layer.name}': specify either include or exclude rules, not both")
        if layer.include:
            keep = any(state_meets_rule(param.state, r) for r in layer.include)
        else:
            keep = not any(state_meets_rule(param.state, r) for r in layer.exclude)
        if keep:
            out.layer.add().CopyFrom(layer)
    return out


def upgrade_net_inputs(param: caffe_pb2.NetParameter) -> None:
    """Turn net-level ``input`` / ``input_shape`` / ``input_dim`` into an Input layer (in place)."""
    if not param.input:
        return
    n = len(param.input)
    if param.input_shape:
        if len(param.input_shape) not in (1, n):
            raise NetError(
                f"net '{param.name}': {n} inputs but {len(param.input_shape)} input_shape entries"
            )
        shapes = [param.input_shape[i if len(param.input_shape) > 1 else 0] for i in range(n)]
    elif param.input_dim:
        if len(param.input_dim) != 4 * n:
            raise NetError(
                f"net '{param.name}': input_dim must have 4 values per input ({4 * n}), "
                f"got {len(param.input_dim)}"
            )
        shapes = []
        for i in range(n):
            s = caffe_pb2.BlobShape()
            s.dim.extend(param.input_dim[4 * i : 4 * i + 4])
            shapes.append(s)
    else:
        raise NetError(f"net '{param.name}': net-level inputs {list(param.input)} need input_shape or input_dim")
    layer = caffe_pb2.LayerParameter(name="input", type="Input")
    layer.top.extend(param.input)
    for s in shapes:
        layer.input_param.shape.add().CopyFrom(s)
    layers = list(param.layer)
    del param.layer[:]
    param.layer.add().CopyFrom(layer)
    param.layer.extend(layers)
    del param.input[:]
    del param.input_shape[:]
    del param.input_dim[:]


def split_layer_name(layer: str, blob: str, top_index: int) -> str:
    return f"{blob}_{layer}_{top_index}_split"


def split_blob_name(layer: str, blob: str, top_index: int, split_index: int) -> str:
    return f"{blob}_{layer}_{top_index}_split_{split_index}"


def insert_splits(param: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """Insert a Split layer after every top consumed more than once (a loss weight counts as a use).

    Consumers then read separate copies whose gradients the Split sums in backward.
    """
    producer: dict[str, tuple[int, int]] = {}  # blob -> (layer index, top index) of latest producer
    uses: dict[tuple[int, int], int] = {}
    consumer_source: dict[tuple[int, int], tuple[int, int]] = {}
    for li, layer in enumerate(param.layer):
        for bi, name in enumerate(layer.bottom):
            if name not in producer:
                raise NetError(f"layer '{layer.name}': unknown bottom blob '{name}' (no earlier layer produces it)")
            src = producer[name]
            consumer_source[(li, bi)] = src
            uses[src] = uses.get(src, 0) + 1
        for ti, name in enumerate(layer.top):
            producer[name] = (li, ti)
    loss_weight: dict[tuple[int, int], float] = {}
    for li, layer in enumerate(param.layer):
        for ti, w in enumerate(layer.loss_weight):
            if w:
                loss_weight[(li, ti)] = w

    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    next_split: dict[tuple[int, int], int] = {}
    for li, layer in enumerate(param.layer):
        new = out.layer.add()
        new.CopyFrom(layer)
        for bi, name in enumerate(layer.bottom):
            src = consumer_source[(li, bi)]
            if _needs_split(src, uses, loss_weight):
                k = next_split.get(src, 0)
                next_split[src] = k + 1
                src_layer = param.layer[src[0]].name
                new.bottom[bi] = split_blob_name(src_layer, name, src[1], k)
        for ti, name in enumerate(layer.top):
            src = (li, ti)
            if not _needs_split(src, uses, loss_weight):
                continue
            n_uses = uses.get(src, 0)
            weight = loss_weight.get(src, 0.0)
            split = out.layer.add()
            split.name = split_layer_name(layer.name, name, ti)
            split.type = "Split"
            split.bottom.append(name)
            n_tops = n_uses + (1 if weight else 0)
            for k in range(n_tops):
                split.top.append(split_blob_name(layer.name, name, ti, k))
            if weight:
                # The loss is carried by the last split top, which no consumer overwrites.
                split.loss_weight.extend([0.0] * (n_tops - 1) + [weight])
                new.loss_weight[ti] = 0.0
    return out


def _needs_split(src, uses, loss_weight) -> bool:
    n = uses.get(src, 0) + (1 if loss_weight.get(src) else 0)
    return uses.get(src, 0) > 0 and n > 1
