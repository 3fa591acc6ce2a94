"""Write nets in Python (BVLC's ``caffe.net_spec``): ``layers`` (L), ``params`` (P), NetSpec.

``L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type='xavier'))``
returns a :class:`Top` (a tuple of Tops with ``ntop=k``, the bare :class:`Function` with
``ntop=0``). Keyword arguments go into the layer's own ``<type>_param`` message when it has that
field, else into the LayerParameter itself (``param=[dict(lr_mult=1)]``, ``loss_weight``,
``include=dict(phase=caffe.TRAIN)``); names ending in ``param`` always go to the LayerParameter.
Dicts become messages, lists become repeated fields, and a scalar given for a repeated field
becomes a one-element list. ``in_place=True`` makes the layer's tops its bottoms.
``P.Pooling.MAX`` reads enum values of ``PoolingParameter``. Assigning Tops to a NetSpec's
attributes names them; unnamed tops and layers get automatic names (type + counter).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from .schema import caffe_pb2


def param_name_dict() -> dict[str, str]:
    """Layer type name -> prefix of its ``<prefix>_param`` field (``Convolution`` -> ``convolution``)."""
    out = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name
            if type_name.endswith("Parameter"):
                out[type_name[: -len("Parameter")]] = field.name[: -len("_param")]
    return out


def to_proto(*tops: Top) -> caffe_pb2.NetParameter:
    """A NetParameter holding every layer needed to compute ``tops`` (with automatic names)."""
    layers: OrderedDict = OrderedDict()
    autonames: Counter = Counter()
    for top in tops:
        top.fn._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


def _is_repeated(proto, name: str) -> bool:
    field = proto.DESCRIPTOR.fields_by_name.get(name)
    if field is None:
        raise AttributeError(f"{proto.DESCRIPTOR.name} has no field '{name}'")
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED


def assign_proto(proto, name: str, val) -> None:
    """Assign a Python value to field ``name`` of ``proto``: dicts fill messages, lists fill
    repeated fields, a scalar for a repeated field becomes ``[scalar]``."""
    repeated = _is_repeated(proto, name)
    if repeated and not isinstance(val, (list, tuple)):
        val = [val]
    if isinstance(val, (list, tuple)):
        field = getattr(proto, name)
        if val and isinstance(val[0], dict):
            for item in val:
                sub = field.add()
                for k, v in item.items():
                    assign_proto(sub, k, v)
        else:
            field.extend(val)
    elif isinstance(val, dict):
        for k, v in val.items():
            assign_proto(getattr(proto, name), k, v)
    else:
        setattr(proto, name, val)


class Top:
    """One output blob of a layer (output ``n`` of Function ``fn``)."""

    def __init__(self, fn: Function, n: int) -> None:
        self.fn = fn
        self.n = n

    def to_proto(self) -> caffe_pb2.NetParameter:
        """A NetParameter with every layer needed to compute this top."""
        return to_proto(self)

    def _to_proto(self, layers, names, autonames):
        return self.fn._to_proto(layers, names, autonames)


class Function:
    """A layer: its type, its input Tops and its parameters."""

    def __init__(self, type_name: str, inputs: tuple, params: dict) -> None:
        self.type_name = type_name
        for i, inp in enumerate(inputs):
            if not isinstance(inp, Top):
                # BVLC's wording, word for word (scripts and BVLC's tests match it)
                raise TypeError(f"{type_name} input {i} is not a Top (type is {type(inp)})")
        self.inputs = inputs
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names, autonames) -> str:
        if self not in names and self.ntop > 0:
            names[self] = self._get_top_name(self.tops[0], names, autonames)
        elif self not in names:
            autonames[self.type_name] += 1
            names[self] = self.type_name + str(autonames[self.type_name])
        return names[self]

    def _get_top_name(self, top: Top, names, autonames) -> str:
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = top.fn.type_name + str(autonames[top.fn.type_name])
        return names[top]

    def _to_proto(self, layers, names, autonames) -> None:
        if self in layers:
            return
        bottom_names = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottom_names.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottom_names)
        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            for top in self.tops:
                layer.top.append(self._get_top_name(top, names, autonames))
        layer.name = self._get_name(names, autonames)
        for k, v in self.params.items():
            if k.endswith("param"):
                assign_proto(layer, k, v)
                continue
            prefix = _param_names.get(self.type_name)
            sub = getattr(layer, prefix + "_param") if prefix else None
            if sub is not None and k in sub.DESCRIPTOR.fields_by_name:
                assign_proto(sub, k, v)
            elif k in layer.DESCRIPTOR.fields_by_name:
                assign_proto(layer, k, v)
            else:
                where = f"{prefix}_param or " if prefix else ""
                raise AttributeError(
                    f"L.{self.type_name}: '{k}' is not a field of {where}LayerParameter"
                )
        layers[self] = layer


class NetSpec:
    """Named Tops, assigned as attributes (``n.conv1 = L.Convolution(...)``); ``to_proto()``
    builds the NetParameter using those names for the tops and the layers producing them."""

    def __init__(self) -> None:
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name: str, value) -> None:
        self.tops[name] = value

    def __getattr__(self, name: str):
        try:
            return self.__dict__["tops"][name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top named '{name}'") from None

    def __setitem__(self, name: str, value) -> None:
        self.__setattr__(name, value)

    def __getitem__(self, name: str):
        return self.__getattr__(name)

    def __delattr__(self, name: str) -> None:
        del self.tops[name]

    def keys(self) -> list[str]:
        return list(self.tops)

    def vals(self) -> list:
        return list(self.tops.values())

    def to_proto(self) -> caffe_pb2.NetParameter:
        names = {v: k for k, v in self.tops.items()}
        autonames: Counter = Counter()
        layers: OrderedDict = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


class Layers:
    """Pseudo-module: ``layers.<Type>(*bottoms, **params)`` specifies a layer of that type."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)

        def layer_fn(*args, **kwargs):
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops

        return layer_fn


class Parameters:
    """Pseudo-module: ``params.<Type>.<CONSTANT>`` is an enum value of ``<Type>Parameter``."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        message = getattr(caffe_pb2, name + "Parameter", None)
        if message is None:
            raise AttributeError(f"caffe_pb2 has no message {name}Parameter")

        class Param:
            def __getattr__(self, param_name: str):
                try:
                    return getattr(message, param_name)
                except AttributeError:
                    raise AttributeError(f"{name}Parameter has no constant '{param_name}'") from None

        return Param()


_param_names = param_name_dict()
layers = Layers()
params = Parameters()
