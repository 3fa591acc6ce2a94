"""Bringing old net definitions (prototxts and .caffemodels) up to date, as Caffe's upgrade_proto.

In Caffe's order, each step logging a warning that names the source:
1. V0 (``layers { layer { type: "conv" ... } }``) -> V1: padding layers are folded into the pad
   of the conv/pool they feed, flat V0 fields move into the per-type parameter messages.
2. Data transformation fields (``scale``, ``mean_file``, ``crop_size``, ``mirror``) inside V1
   data / image_data / window_data params move into ``transform_param``.
3. V1 (``layers { type: CONVOLUTION blobs_lr: 1 ... }``) -> V2 ``layer``: enum type -> type string,
   ``blobs_lr`` / ``weight_decay`` / ``param`` / ``blob_share_mode`` -> ``param { ... }`` specs,
   include/exclude, loss weights, blobs and every per-layer parameter message copied.
4. Net-level ``input`` fields -> an Input layer.
5. BatchNorm layers declaring 3 param specs get lr_mult and decay_mult 0 (statistics are not
   learned).
"""

from __future__ import annotations

import logging

from ..errors import NetError
from ..schema import caffe_pb2
from .net_filter import upgrade_net_inputs

log = logging.getLogger("pycaffe_lite")

V1 = caffe_pb2.V1LayerParameter

# V1 enum name -> V2 type string (NONE -> "").
V1_TYPE_NAMES = {
    "NONE": "", "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL",
    "CONCAT": "Concat", "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution", "DATA": "Data", "DROPOUT": "Dropout", "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise", "EXP": "Exp", "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output", "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData", "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct",
    "LRN": "LRN", "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence", "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice", "TANH": "TanH",
    "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
    "UNPOOLING": "Unpooling",  # DeconvNet's fork (docs/fork_layers.md)
}

# V0 type string -> V1 enum name.
V0_TYPES = {
    "accuracy": "ACCURACY", "bnll": "BNLL", "concat": "CONCAT", "conv": "CONVOLUTION", "data": "DATA",
    "dropout": "DROPOUT", "euclidean_loss": "EUCLIDEAN_LOSS", "flatten": "FLATTEN",
    "hdf5_data": "HDF5_DATA", "hdf5_output": "HDF5_OUTPUT", "im2col": "IM2COL", "images": "IMAGE_DATA",
    "infogain_loss": "INFOGAIN_LOSS", "innerproduct": "INNER_PRODUCT", "lrn": "LRN",
    "multinomial_logistic_loss": "MULTINOMIAL_LOGISTIC_LOSS", "pool": "POOLING", "relu": "RELU",
    "sigmoid": "SIGMOID", "softmax": "SOFTMAX", "softmax_loss": "SOFTMAX_LOSS", "split": "SPLIT",
    "tanh": "TANH", "window_data": "WINDOW_DATA",
}

_CONV_IP = {"conv": "convolution_param", "innerproduct": "inner_product_param"}
_CONV_POOL = {"conv": "convolution_param", "pool": "pooling_param"}
_SOURCES = {"data": "data_param", "hdf5_data": "hdf5_data_param", "images": "image_data_param",
            "window_data": "window_data_param", "infogain_loss": "infogain_loss_param"}
_BATCH = {"data": "data_param", "hdf5_data": "hdf5_data_param", "images": "image_data_param",
          "window_data": "window_data_param"}
_ANY = {"*": "transform_param"}

# V0 field -> (V0 types it applies to -> V1 sub-message, field name in that message); sub-message ""
# is the V1 layer itself (a whole message copied, as hdf5_output_param).
V0_FIELDS: dict[str, tuple[dict[str, str], str]] = {
    "num_output": (_CONV_IP, "num_output"),
    "biasterm": (_CONV_IP, "bias_term"),
    "weight_filler": (_CONV_IP, "weight_filler"),
    "bias_filler": (_CONV_IP, "bias_filler"),
    "pad": (_CONV_POOL, "pad"),
    "kernelsize": (_CONV_POOL, "kernel_size"),
    "group": ({"conv": "convolution_param"}, "group"),
    "stride": (_CONV_POOL, "stride"),
    "pool": ({"pool": "pooling_param"}, "pool"),
    "dropout_ratio": ({"dropout": "dropout_param"}, "dropout_ratio"),
    "local_size": ({"lrn": "lrn_param"}, "local_size"),
    "alpha": ({"lrn": "lrn_param"}, "alpha"),
    "beta": ({"lrn": "lrn_param"}, "beta"),
    "k": ({"lrn": "lrn_param"}, "k"),
    "source": (_SOURCES, "source"),
    "scale": (_ANY, "scale"),
    "meanfile": (_ANY, "mean_file"),
    "batchsize": (_BATCH, "batch_size"),
    "cropsize": (_ANY, "crop_size"),
    "mirror": (_ANY, "mirror"),
    "rand_skip": ({"data": "data_param", "images": "image_data_param"}, "rand_skip"),
    "shuffle_images": ({"images": "image_data_param"}, "shuffle"),
    "new_height": ({"images": "image_data_param"}, "new_height"),
    "new_width": ({"images": "image_data_param"}, "new_width"),
    "concat_dim": ({"concat": "concat_param"}, "concat_dim"),
    "det_fg_threshold": ({"window_data": "window_data_param"}, "fg_threshold"),
    "det_bg_threshold": ({"window_data": "window_data_param"}, "bg_threshold"),
    "det_fg_fraction": ({"window_data": "window_data_param"}, "fg_fraction"),
    "det_context_pad": ({"window_data": "window_data_param"}, "context_pad"),
    "det_crop_mode": ({"window_data": "window_data_param"}, "crop_mode"),
    "hdf5_output_param": ({"hdf5_output": ""}, "hdf5_output_param"),
}

_DATA_TYPES = {V1.DATA: "data_param", V1.IMAGE_DATA: "image_data_param", V1.WINDOW_DATA: "window_data_param"}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


# -- detection ------------------------------------------------------------------------------
def net_needs_v0_upgrade(param: caffe_pb2.NetParameter) -> bool:
    return any(layer.HasField("layer") for layer in param.layers)


def net_needs_data_upgrade(param: caffe_pb2.NetParameter) -> bool:
    for layer in param.layers:
        sub = _DATA_TYPES.get(layer.type)
        if sub and any(getattr(layer, sub).HasField(f) for f in _TRANSFORM_FIELDS):
            return True
    return False


def net_needs_v1_upgrade(param: caffe_pb2.NetParameter) -> bool:
    return len(param.layers) > 0


def net_needs_batch_norm_upgrade(param: caffe_pb2.NetParameter) -> bool:
    return any(layer.type == "BatchNorm" and len(layer.param) == 3 for layer in param.layer)


def net_needs_upgrade(param: caffe_pb2.NetParameter) -> bool:
    return (net_needs_v0_upgrade(param) or net_needs_v1_upgrade(param) or bool(param.input)
            or net_needs_batch_norm_upgrade(param))


# -- V0 -> V1 -------------------------------------------------------------------------------
def _fold_padding_layers(param: caffe_pb2.NetParameter, source: str) -> list[caffe_pb2.V1LayerParameter]:
    """V0 layers without the "padding" ones; a padded conv/pool reads the padding's input."""
    last_producer: dict[str, int] = {name: -1 for name in param.input}
    out: list[caffe_pb2.V1LayerParameter] = []
    for i, conn in enumerate(param.layers):
        v0 = conn.layer
        kept = None
        if v0.type != "padding":
            kept = caffe_pb2.V1LayerParameter()
            kept.CopyFrom(conn)
            out.append(kept)
        for j, blob in enumerate(conn.bottom):
            if blob not in last_producer:
                raise NetError(f"{source}: V0 layer '{v0.name}' reads unknown blob '{blob}'")
            src_i = last_producer[blob]
            if src_i < 0 or param.layers[src_i].layer.type != "padding":
                continue
            pad_conn = param.layers[src_i]
            if v0.type not in ("conv", "pool"):
                raise NetError(
                    f"{source}: padding layer '{pad_conn.layer.name}' feeds '{v0.name}' of type "
                    f"'{v0.type}'; only conv and pool layers can absorb padding"
                )
            if len(conn.bottom) != 1 or len(pad_conn.bottom) != 1 or len(pad_conn.top) != 1:
                raise NetError(
                    f"{source}: padding layer '{pad_conn.layer.name}' and its consumer '{v0.name}' "
                    "must each have a single input and the padding a single output"
                )
            assert kept is not None  # v0 is a conv or pool layer here
            kept.layer.pad = pad_conn.layer.pad
            kept.bottom[j] = pad_conn.bottom[0]
        for blob in conn.top:
            last_producer[blob] = i
    return out


def _set_field(msg, name: str, value) -> None:
    field = msg.DESCRIPTOR.fields_by_name[name]
    if field.message_type is not None:
        getattr(msg, name).CopyFrom(value)
    elif field.is_repeated:
        getattr(msg, name).append(value)
    else:
        setattr(msg, name, value)


def upgrade_v0_layer(conn: caffe_pb2.V1LayerParameter, source: str = "") -> tuple[caffe_pb2.V1LayerParameter, bool]:
    """One V0 layer connection -> a V1 layer; returns it and whether every field was understood."""
    out = caffe_pb2.V1LayerParameter()
    out.bottom.extend(conn.bottom)
    out.top.extend(conn.top)
    ok = True
    if not conn.HasField("layer"):
        return out, ok
    v0 = conn.layer
    if v0.HasField("name"):
        out.name = v0.name
    if v0.HasField("type"):
        if v0.type not in V0_TYPES:
            raise NetError(f"{source}: V0 layer '{v0.name}' has unknown type '{v0.type}'")
        out.type = V1.LayerType.Value(V0_TYPES[v0.type])
    out.blobs.extend(v0.blobs)
    out.blobs_lr.extend(v0.blobs_lr)
    out.weight_decay.extend(v0.weight_decay)
    for v0_field, (targets, field) in V0_FIELDS.items():
        if not v0.HasField(v0_field):
            continue
        sub = targets.get("*") or targets.get(v0.type)
        if sub is None:
            log.error("%s: V0 layer '%s': parameter %s does not apply to type '%s'; dropped",
                      source, v0.name, v0_field, v0.type)
            ok = False
            continue
        _set_field(getattr(out, sub) if sub else out, field, getattr(v0, v0_field))
    return out, ok


def upgrade_v0_net(param: caffe_pb2.NetParameter, source: str = "") -> bool:
    """V0 layers -> V1 layers, in place; returns whether the upgrade was fully compatible."""
    ok = True
    upgraded = []
    for conn in _fold_padding_layers(param, source):
        layer, layer_ok = upgrade_v0_layer(conn, source)
        ok &= layer_ok
        upgraded.append(layer)
    del param.layers[:]
    param.layers.extend(upgraded)
    return ok


# -- data transformation fields -------------------------------------------------------------
def upgrade_data_transformation(param: caffe_pb2.NetParameter) -> None:
    """Move scale / mean_file / crop_size / mirror of V1 data layers into transform_param."""
    for layer in param.layers:
        sub = _DATA_TYPES.get(layer.type)
        if sub is None:
            continue
        data_param = getattr(layer, sub)
        for name in _TRANSFORM_FIELDS:
            if data_param.HasField(name):
                setattr(layer.transform_param, name, getattr(data_param, name))
                data_param.ClearField(name)


# -- V1 -> V2 -------------------------------------------------------------------------------
_V1_SUBMESSAGES = [
    f.name for f in V1.DESCRIPTOR.fields if f.message_type is not None and f.name.endswith("_param")
]


def upgrade_v1_layer(v1: caffe_pb2.V1LayerParameter, source: str = "") -> tuple[caffe_pb2.LayerParameter, bool]:
    """One V1 layer -> a V2 LayerParameter; returns it and whether it converted fully."""
    out = caffe_pb2.LayerParameter()
    ok = True
    out.bottom.extend(v1.bottom)
    out.top.extend(v1.top)
    if v1.HasField("name"):
        out.name = v1.name
    out.include.extend(v1.include)
    out.exclude.extend(v1.exclude)
    if v1.HasField("type"):
        out.type = V1_TYPE_NAMES[V1.LayerType.Name(v1.type)]
    out.blobs.extend(v1.blobs)

    def spec(i: int) -> caffe_pb2.ParamSpec:
        while len(out.param) <= i:
            out.param.add()
        return out.param[i]

    for i, name in enumerate(v1.param):
        spec(i).name = name
    for i, mode in enumerate(v1.blob_share_mode):
        spec(i).share_mode = caffe_pb2.ParamSpec.DimCheckMode.Value(V1.DimCheckMode.Name(mode))
    for i, lr in enumerate(v1.blobs_lr):
        spec(i).lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        spec(i).decay_mult = decay
    out.loss_weight.extend(v1.loss_weight)
    for name in _V1_SUBMESSAGES:
        if v1.HasField(name):
            getattr(out, name).CopyFrom(getattr(v1, name))
    if v1.HasField("layer"):
        log.error("%s: V1 layer '%s' also holds a V0 layer definition; ignored", source, v1.name)
        ok = False
    return out, ok


def upgrade_v1_net(param: caffe_pb2.NetParameter, source: str = "") -> bool:
    """V1 ``layers`` -> V2 ``layer``, in place; returns whether the upgrade was fully compatible."""
    ok = True
    if len(param.layer):
        log.error("%s: net has both V1 'layers' and V2 'layer' fields; the 'layer' ones are ignored", source)
        ok = False
    upgraded = []
    for i, v1 in enumerate(param.layers):
        layer, layer_ok = upgrade_v1_layer(v1, source)
        if not layer_ok:
            log.error("%s: upgrade of V1 layer %d ('%s') was incomplete", source, i, v1.name)
        ok &= layer_ok
        upgraded.append(layer)
    del param.layer[:]
    del param.layers[:]
    param.layer.extend(upgraded)
    return ok


# -- BatchNorm ------------------------------------------------------------------------------
def upgrade_batch_norm(param: caffe_pb2.NetParameter) -> None:
    """BatchNorm layers with 3 param specs (the old required form): lr_mult and decay_mult 0."""
    for layer in param.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


# -- entry point ----------------------------------------------------------------------------
def upgrade_net(param: caffe_pb2.NetParameter, source: str = "<NetParameter>") -> bool:
    """Upgrade ``param`` in place to the current (V2, ``layer``) form, as Caffe does when it reads
    a prototxt or .caffemodel. Returns False when some old field could not be carried over (each
    such field is logged as an error)."""
    ok = True
    if net_needs_v0_upgrade(param):
        log.warning("%s: upgrading deprecated V0LayerParameter net definition; re-save it in the "
                    "current format", source)
        ok &= upgrade_v0_net(param, source)
    if net_needs_data_upgrade(param):
        log.warning("%s: moving deprecated data-layer transformation fields into transform_param", source)
        upgrade_data_transformation(param)
    if net_needs_v1_upgrade(param):
        log.warning("%s: upgrading deprecated V1LayerParameter ('layers') net definition to 'layer'", source)
        ok &= upgrade_v1_net(param, source)
    if param.input:
        log.warning("%s: upgrading deprecated net-level input fields to an Input layer", source)
        upgrade_net_inputs(param)
    if net_needs_batch_norm_upgrade(param):
        log.warning("%s: BatchNorm param specs upgraded: statistics get lr_mult 0 and decay_mult 0", source)
        upgrade_batch_norm(param)
    return ok
