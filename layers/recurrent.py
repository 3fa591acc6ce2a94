"""Base of the recurrent layers RNN and LSTM: BVLC's RecurrentLayer, an unrolled internal Net.

bottoms: ``x`` (T, N, ...) — T time steps of N independent streams; ``cont`` (T, N), the
sequence-continuation flags (0 at the first step of a sequence resets the hidden state, 1
continues it); optionally a static input ``x_static`` (N, ...) seen at every step; with
``recurrent_param.expose_hidden`` then the initial recurrent states (RNN: ``h0``; LSTM: ``h0``,
``c0``; each (1, N, num_output)). tops: the output sequence (T, N, num_output) and, with
``expose_hidden``, the final recurrent states (RNN: ``hT``; LSTM: ``hT``, ``cT``).

A subclass writes the unrolled net (``fill_unrolled_net``) with BVLC's layer names, blob names and
param names; the net is built with the layers of this package, so it runs on the CPU and the GPU
as they do, and its parameters (each one once, shared across time steps by name) are this
layer's ``blobs`` in BVLC's order, so BVLC-trained weights load unchanged.

State across forwards, as in BVLC: without ``expose_hidden`` every forward starts from the final
state of the previous forward (zero at first); ``cont`` decides whether step 1 uses it. With
``expose_hidden`` the state comes from the bottoms, and the final state is only output.
Gradients, as in BVLC: to ``x`` and ``x_static`` and the parameters; none crosses batches, none
reaches ``h0``/``c0`` (their diffs are set to 0 here) and the diffs of ``hT``/``cT`` are ignored;
``cont`` takes none (asking for one is an error). T may not change after set-up; N may.
"""

from __future__ import annotations

import logging

import numpy as np

from pycaffe_lite.blob import Blob
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits
from pycaffe_lite.net_builder import build_net, check_tops_hold_values
from pycaffe_lite.net_graph import NetGraph
from pycaffe_lite.runtime.executor import runs_on_device
from pycaffe_lite.schema import caffe_pb2

log = logging.getLogger("pycaffe_lite")


class RecurrentLayer(Layer):
    """Shared machinery; subclasses name the blobs and fill the unrolled net."""
    traits = Traits(graph_safe=True, outside_effects=True)


    # -- what a subclass provides ---------------------------------------------------------------
    def recurrent_input_names(self) -> list[str]:
        raise NotImplementedError

    def recurrent_output_names(self) -> list[str]:
        """Names in the unrolled net (they may depend on ``self.T``); as many as the inputs."""
        raise NotImplementedError

    def output_names(self) -> list[str]:
        raise NotImplementedError

    def fill_unrolled_net(self, net_param: caffe_pb2.NetParameter) -> None:
        raise NotImplementedError

    def recurrent_input_shapes(self) -> list[tuple[int, ...]]:
        """One time step of N streams of ``num_output`` each, per recurrent input."""
        num_output = self.layer_param.recurrent_param.num_output
        return [(1, self.N, num_output) for _ in self.recurrent_input_names()]

    # -- blob counts ----------------------------------------------------------------------------
    def _num_exposed(self) -> int:
        return len(self.recurrent_input_names()) if self.layer_param.recurrent_param.expose_hidden else 0

    def check_blob_counts(self, bottom, top):
        exposed = self._num_exposed()
        low, high = 2 + exposed, 3 + exposed
        if not low <= len(bottom) <= high:
            names = ", ".join(["x", "cont", "[x_static]"] + self.recurrent_input_names()[:exposed])
            raise self.error(f"takes {low} or {high} bottom blobs ({names}), got {len(bottom)}")
        want = 1 + exposed  # one final state per initial state
        if len(top) != want:
            raise self.error(f"takes exactly {want} top blob(s), got {len(top)}")

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    # -- set-up ---------------------------------------------------------------------------------
    def _input_layer(self, net_param, names_shapes) -> None:
        lp = net_param.layer.add(type="Input", name="input")
        for name, shape in names_shapes:
            lp.top.append(name)
            lp.input_param.shape.add().dim.extend(shape)

    def _check_bottoms(self, bottom) -> None:
        """x (T, N, ...), cont (T, N), and x_static (N, ...) when given; sets T, N and the options."""
        x, cont = bottom[0], bottom[1]
        if x.num_axes < 2:
            raise self.error(f"bottom 0 (x) must have at least 2 axes (time steps, streams, ...), got {x.shape}")
        self.T, self.N = x.shape[0], x.shape[1]
        if cont.num_axes != 2 or cont.shape != (self.T, self.N):
            raise self.error(f"bottom 1 (cont) must have shape (T, N) = {(self.T, self.N)} like x {x.shape}, "
                             f"got {cont.shape}")
        p = self.layer_param.recurrent_param
        if p.num_output <= 0:
            raise self.error("recurrent_param.num_output must be positive")
        self.expose_hidden = p.expose_hidden
        exposed = self._num_exposed()
        self.static_input = len(bottom) > 2 + exposed
        if self.static_input:
            if bottom[2].num_axes < 1 or bottom[2].shape[0] != self.N:
                raise self.error(f"bottom 2 (x_static) must have N = {self.N} rows like x {x.shape}, "
                                 f"got {bottom[2].shape}")

    def _unrolled_param(self, bottom) -> tuple[caffe_pb2.NetParameter, list[str], list[str]]:
        """The unrolled NetParameter (layers named after this layer), its outputs and the names of the
        pseudo-losses that mark those outputs as needing backward."""
        x, cont = bottom[0], bottom[1]
        net_param = caffe_pb2.NetParameter(name=f"{self.name}_unrolled")
        inputs = [("x", x.shape), ("cont", cont.shape)]
        if self.static_input:
            inputs.append(("x_static", bottom[2].shape))
        self._input_layer(net_param, inputs)
        self.fill_unrolled_net(net_param)
        if self.name:
            for lp in net_param.layer:
                lp.name = f"{self.name}_{lp.name}"
        outputs = self.output_names()
        pseudo_losses = []
        for name in outputs:  # pseudo-losses mark the outputs as needing backward; never run
            lp = net_param.layer.add(name=f"{name}_pseudoloss", type="Reduction")
            lp.bottom.append(name)
            lp.top.append(lp.name)
            lp.loss_weight.append(1)
            pseudo_losses.append(lp.name)
        return net_param, outputs, pseudo_losses

    def _adopt_params(self) -> list[Blob]:
        """Our params: the owners among the unrolled net's params, in its order (weights embedded in
        the prototxt are copied in)."""
        net = self.unrolled_net
        owned = [blob for blob, owner in zip(net.params_list, net.param_owners) if owner == -1]
        self._shared = [(net.params_list[i], net.params_list[owner])
                        for i, owner in enumerate(net.param_owners) if owner != -1]
        if self.blobs:  # weights embedded in the prototxt
            if len(self.blobs) != len(owned):
                raise self.error(f"has {len(self.blobs)} param blobs, expected {len(owned)}")
            self.check_param_shapes([b.shape for b in owned])
            for mine, inner in zip(self.blobs, owned):
                inner.mutable_cpu_data()[...] = mine.cpu_data()
        self.blobs = owned
        return owned

    def layer_setup(self, bottom, top):
        self._check_bottoms(bottom)
        p = self.layer_param.recurrent_param
        net_param, outputs, pseudo_losses = self._unrolled_param(bottom)
        net_param.state.phase = self.phase
        net = build_net(net_param, self.dtype)
        self.unrolled_net: NetGraph = net
        # BVLC's Net lets a layer's explicit propagate_down: true force a bottom's gradient
        # (the x and x_static transforms ask for one though their bottoms are net inputs).
        assert net.param is not None
        for li, lp in enumerate(net.param.layer):
            for bi, want in enumerate(lp.propagate_down):
                if want and net.layer_need_backward[li]:
                    net.bottom_need_backward[li][bi] = True
        self.last_layer_index = len(net.layers) - 1 - len(pseudo_losses)
        names = [layer.name for layer in net.layers]
        if names[self.last_layer_index + 1:] != pseudo_losses:
            raise self.error(f"internal: unrolled net ends with {names[self.last_layer_index + 1:]}")

        blobs = dict(zip(net.blob_names, net.blobs))
        self.x_input_blob = blobs["x"]
        self.cont_input_blob = blobs["cont"]
        self.x_static_input_blob = blobs["x_static"] if self.static_input else None
        self.recur_input_blobs = [blobs[n] for n in self.recurrent_input_names()]
        self.recur_output_blobs = [blobs[n] for n in self.recurrent_output_names()]
        self.output_blobs = [blobs[n] for n in outputs]
        # The layers a forward runs (the Input layers only declare the inputs; the pseudo-losses never run).
        self.run_ids = [li for li in range(self.last_layer_index + 1) if net.bottom_id_vecs[li]]
        self.inner_layers = [net.layers[li] for li in self.run_ids]

        owned = self._adopt_params()
        self.param_propagate_down = [True] * len(owned)
        for blob in self.recur_output_blobs:  # no gradient crosses batches
            blob.mutable_cpu_diff()[...] = 0
        self.debug_info = p.debug_info
        self.traits = self.traits.but(
            graph_safe=not self.debug_info and all(runs_on_device(layer) for layer in self.inner_layers))
        self._zeroed_key: tuple | None = None
        log.info("layer '%s': unrolled %d time steps of %d streams into %d layers", self.name, self.T, self.N,
                 len(self.inner_layers))

    def reshape(self, bottom, top):
        x, cont = bottom[0], bottom[1]
        if x.num_axes < 2 or x.shape[0] != self.T:
            raise self.error(f"bottom 0 (x) must keep its {self.T} time steps (the net is unrolled for them), "
                             f"got shape {x.shape}")
        self.N = x.shape[1]
        if cont.shape != (self.T, self.N):
            raise self.error(f"bottom 1 (cont) must have shape (T, N) = {(self.T, self.N)} like x {x.shape}, "
                             f"got {cont.shape}")
        self.x_input_blob.reshape(x.shape)
        self.cont_input_blob.reshape(cont.shape)
        if self.x_static_input_blob is not None:
            if bottom[2].shape[0] != self.N:
                raise self.error(f"bottom 2 (x_static) must have N = {self.N} rows like x {x.shape}, "
                                 f"got {bottom[2].shape}")
            self.x_static_input_blob.reshape(bottom[2].shape)
        for blob, shape in zip(self.recur_input_blobs, self.recurrent_input_shapes()):
            blob.reshape(shape)
        net = self.unrolled_net
        for li, layer in enumerate(net.layers):
            layer.reshape(net.bottom_vecs[li], net.top_vecs[li])
            check_tops_hold_values(net, li)
        self.x_input_blob.share_data(x)
        self.x_input_blob.share_diff(x)
        self.cont_input_blob.share_data(cont)
        if self.x_static_input_blob is not None:
            self.x_static_input_blob.share_data(bottom[2])
            self.x_static_input_blob.share_diff(bottom[2])
        if self.expose_hidden:
            offset = 2 + int(self.static_input)
            for j, blob in enumerate(self.recur_input_blobs):
                given = bottom[offset + j]
                if given.shape != blob.shape:
                    raise self.error(f"bottom {offset + j} ({self.recurrent_input_names()[j]}) must have shape "
                                     f"{blob.shape} (1, N, num_output), got {given.shape}")
                blob.share_data(given)
        for t, blob in zip(top, self.output_blobs):
            t.reshape(blob.shape)
            t.share_data(blob)
            t.share_diff(blob)
        if self.expose_hidden:
            for t, blob in zip(top[len(self.output_blobs):], self.recur_output_blobs):
                t.reshape(blob.shape)
        self._zero_unwritten_diffs()

    def _zero_unwritten_diffs(self) -> None:
        """Diffs that backward reads but no layer writes (the final states, tops of layers that need no
        backward such as the copy of c_T) hold zeros, as BVLC's fresh blobs do."""
        net = self.unrolled_net
        key = tuple(b.shape for b in net.blobs)
        if key == self._zeroed_key:
            return
        self._zeroed_key = key
        written = {bid for li in range(self.last_layer_index + 1) if net.layer_need_backward[li]
                   for bid, need in zip(net.bottom_id_vecs[li], net.bottom_need_backward[li]) if need}
        outputs = {id(b) for b in self.output_blobs}
        for li in range(self.last_layer_index + 1):
            for bid in net.top_id_vecs[li]:
                blob = net.blobs[bid]
                if bid not in written and id(blob) not in outputs:
                    blob.mutable_cpu_diff()[...] = 0

    # -- running --------------------------------------------------------------------------------
    def _share_weights(self) -> None:
        # Re-point the steps' copies at their owners (Net.share_with may have swapped an owner's memory).
        for blob, owner in self._shared:
            if blob.data_memory is not owner.data_memory:
                blob.share_data(owner)

    def _carry_state(self, gpu: bool) -> None:
        if self.expose_hidden:
            return
        for src, dst in zip(self.recur_output_blobs, self.recur_input_blobs):
            if gpu:
                gm.copy(dst.count, src.gpu_data(), dst.mutable_gpu_data(), self.dtype)
            else:
                dst.mutable_cpu_data()[...] = src.cpu_data().reshape(dst.shape)

    def _expose(self, top) -> None:
        if self.expose_hidden:
            for t, blob in zip(top[len(self.output_blobs):], self.recur_output_blobs):
                t.share_data(blob)

    def _debug(self, li: int, what: str) -> None:
        net = self.unrolled_net
        layer = net.layers[li]
        if what == "forward":
            for bid in net.top_id_vecs[li]:
                data = net.blobs[bid].cpu_data()
                log.info("    [Forward] Layer %s, top blob %s data: %g", layer.name, net.blob_names[bid],
                         float(np.abs(data).mean()) if data.size else 0.0)
        else:
            for bid, need in zip(net.bottom_id_vecs[li], net.bottom_need_backward[li]):
                if need:
                    diff = net.blobs[bid].cpu_diff()
                    log.info("    [Backward] Layer %s, bottom blob %s diff: %g", layer.name,
                             net.blob_names[bid], float(np.abs(diff).mean()) if diff.size else 0.0)

    def _forward(self, top, gpu: bool) -> None:
        self._share_weights()
        self._carry_state(gpu)
        net = self.unrolled_net
        for li, layer in zip(self.run_ids, self.inner_layers):
            if gpu:
                layer.forward_gpu(net.bottom_vecs[li], net.top_vecs[li])
            else:
                layer.forward_cpu(net.bottom_vecs[li], net.top_vecs[li])
            if self.debug_info:
                self._debug(li, "forward")
        self._expose(top)

    def _backward(self, propagate_down, bottom, gpu: bool) -> None:
        if propagate_down[1]:
            raise self.error("cannot back-propagate to the sequence continuation flags (bottom 1, cont)")
        net = self.unrolled_net
        for li in reversed(self.run_ids):
            if not net.layer_need_backward[li]:
                continue
            layer = net.layers[li]
            if gpu:
                layer.backward_gpu(net.top_vecs[li], net.bottom_need_backward[li], net.bottom_vecs[li])
            else:
                layer.backward_cpu(net.top_vecs[li], net.bottom_need_backward[li], net.bottom_vecs[li])
            if self.debug_info:
                self._debug(li, "backward")
        if self.expose_hidden:  # BVLC passes no gradient to the initial states
            offset = 2 + int(self.static_input)
            for j in range(len(self.recur_input_blobs)):
                if propagate_down[offset + j]:
                    b = bottom[offset + j]
                    if gpu:
                        gm.set(b.count, 0.0, b.mutable_gpu_diff(), self.dtype)
                    else:
                        b.mutable_cpu_diff()[...] = 0

    def forward_cpu(self, bottom, top):
        self._forward(top, gpu=False)

    def backward_cpu(self, top, propagate_down, bottom):
        self._backward(propagate_down, bottom, gpu=False)

    def forward_gpu(self, bottom, top):
        self._forward(top, gpu=True)

    def backward_gpu(self, top, propagate_down, bottom):
        self._backward(propagate_down, bottom, gpu=True)


def inner_product(name: str, num_output: int, axis: int, filler, bias_filler=None) -> caffe_pb2.LayerParameter:
    """An InnerProduct LayerParameter of the unrolled nets (bias only with ``bias_filler``)."""
    lp = caffe_pb2.LayerParameter(name=name, type="InnerProduct")
    ip = lp.inner_product_param
    ip.num_output = num_output
    ip.axis = axis
    ip.bias_term = bias_filler is not None
    ip.weight_filler.CopyFrom(filler)
    if bias_filler is not None:
        ip.bias_filler.CopyFrom(bias_filler)
    return lp


def add_layer(net_param: caffe_pb2.NetParameter, lp: caffe_pb2.LayerParameter, bottoms, tops,
              params=(), propagate_down=()) -> caffe_pb2.LayerParameter:
    """Append ``lp`` with its bottoms, tops, shared-param names and explicit propagate_down."""
    out = net_param.layer.add()
    out.CopyFrom(lp)
    out.bottom.extend(bottoms)
    out.top.extend(tops)
    for name in params:
        out.param.add(name=name)
    out.propagate_down.extend(propagate_down)
    return out


def sequence_layers(net_param: caffe_pb2.NetParameter, T: int, x_name: str, static_name: str | None,
                    num_output: int, filler, bias_filler, w_x: str, b_x: str, w_static: str,
                    static_layer: str, x_slice_name: str) -> tuple[caffe_pb2.LayerParameter, str | None]:
    """The layers both unrolled nets open with: cont sliced by step, the input transform of every step
    at once (``W_x·x + b``), the static input's transform reshaped to one step, and the slice of the
    transformed input by step. Returns the x slice layer (its tops ``{x_name}_t`` are added by the
    caller, as BVLC adds them) and the static blob's name."""
    cont_slice = add_layer(net_param, caffe_pb2.LayerParameter(name="cont_slice", type="Slice"), ["cont"], [])
    cont_slice.slice_param.axis = 0
    cont_slice.top.extend(f"cont_{t}" for t in range(1, T + 1))
    add_layer(net_param, inner_product("x_transform", num_output, 2, filler, bias_filler), ["x"], [x_name],
              params=[w_x, b_x], propagate_down=[True])
    static_blob = None
    if static_name is not None:
        add_layer(net_param, inner_product(static_layer, num_output, 1, filler), ["x_static"],
                  [f"{static_name}_preshape"], params=[w_static], propagate_down=[True])
        reshape = add_layer(net_param, caffe_pb2.LayerParameter(name=f"{static_layer}_reshape", type="Reshape"),
                            [f"{static_name}_preshape"], [static_name])
        reshape.reshape_param.shape.dim.extend([1, -1, num_output])
        static_blob = static_name
    x_slice = add_layer(net_param, caffe_pb2.LayerParameter(name=x_slice_name, type="Slice"), [x_name], [])
    x_slice.slice_param.axis = 0
    x_slice.top.extend(f"{x_name}_{t}" for t in range(1, T + 1))
    return x_slice, static_blob
