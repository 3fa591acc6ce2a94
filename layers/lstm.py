"""LSTM: BVLC's long short-term memory layer, unrolled over T steps (see ``recurrent.py`` for
bottoms, tops, state and gradients). With D = ``recurrent_param.num_output``, for t = 1..T::

    gates_t = W_hc · (cont_t * h_{t-1}) + W_xc · x_t + b_c [+ W_xc_static · x_static]   (4D: i f o g)
    c_t, h_t = LSTMUnit(c_{t-1}, gates_t, cont_t)

top 0 is h (T, N, D); with ``expose_hidden`` bottoms ``h0``, ``c0`` and tops ``hT``, ``cT``
(1, N, D each). Params, in BVLC's order: W_xc (4D, K), b_c (4D,), [W_xc_static (4D, K_static)],
W_hc (4D, D); weights from ``weight_filler``, the bias from ``bias_filler``.
"""

from __future__ import annotations

from pycaffe_lite.layer import Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

from .recurrent import RecurrentLayer, add_layer, inner_product, sequence_layers


@register_layer("LSTM")
class LSTMLayer(RecurrentLayer):
    traits = Traits(graph_safe=True, outside_effects=True)

    def recurrent_input_names(self):
        return ["h_0", "c_0"]

    def recurrent_output_names(self):
        return [f"h_{self.T}", "c_T"]

    def output_names(self):
        return ["h"]

    def fill_unrolled_net(self, net_param):
        p = self.layer_param.recurrent_param
        D, T = p.num_output, self.T
        shapes = self.recurrent_input_shapes()
        recurrent = net_param.layer.add(type="Input", name="recurrent_input")
        for blob, shape in (("c_0", shapes[1]), ("h_0", shapes[0])):
            recurrent.top.append(blob)
            recurrent.input_param.shape.add().dim.extend(shape)
        _, static = sequence_layers(
            net_param, T, "W_xc_x", "W_xc_x_static" if self.static_input else None, 4 * D, p.weight_filler,
            p.bias_filler, "W_xc", "b_c", "W_xc_static", "W_xc_x_static", "W_xc_x_slice")
        concat = caffe_pb2.LayerParameter(name="h_concat", type="Concat")
        concat.top.append("h")
        concat.concat_param.axis = 0
        for t in range(1, T + 1):
            prev = f"{t - 1}"
            scale = add_layer(net_param, caffe_pb2.LayerParameter(name=f"h_conted_{prev}", type="Scale"),
                              [f"h_{prev}", f"cont_{t}"], [f"h_conted_{prev}"])
            scale.scale_param.axis = 0
            add_layer(net_param, inner_product(f"transform_{t}", 4 * D, 2, p.weight_filler), [f"h_conted_{prev}"],
                      [f"W_hc_h_{prev}"], params=["W_hc"])
            sum_bottoms = [f"W_hc_h_{prev}", f"W_xc_x_{t}"] + ([static] if static else [])
            add_layer(net_param, caffe_pb2.LayerParameter(name=f"gate_input_{t}", type="Eltwise"), sum_bottoms,
                      [f"gate_input_{t}"])
            add_layer(net_param, caffe_pb2.LayerParameter(name=f"unit_{t}", type="LSTMUnit"),
                      [f"c_{prev}", f"gate_input_{t}", f"cont_{t}"], [f"c_{t}", f"h_{t}"])
            concat.bottom.append(f"h_{t}")
        add_layer(net_param, caffe_pb2.LayerParameter(name="c_T_copy", type="Split"), [f"c_{T}"], ["c_T"])
        net_param.layer.add().CopyFrom(concat)
