"""RNN: BVLC's simple recurrent layer, unrolled over T steps (see ``recurrent.py`` for bottoms, tops,
state and gradients). With D = ``recurrent_param.num_output``, for t = 1..T::

    h_t = tanh(W_hh · (cont_t * h_{t-1}) + W_xh · x_t + b_h [+ W_xh_static · x_static])
    o_t = tanh(W_ho · h_t + b_o)

top 0 is o (T, N, D); with ``expose_hidden`` bottom ``h0`` and top ``hT`` (1, N, D).
Params, in BVLC's order: W_xh (D, K), b_h (D,), [W_xh_static (D, K_static)], W_hh (D, D),
W_ho (D, D), b_o (D,); weights from ``weight_filler``, biases from ``bias_filler``.
"""

from __future__ import annotations

from pycaffe_lite.layer import Traits, register_layer
from pycaffe_lite.schema import caffe_pb2

from .recurrent import RecurrentLayer, add_layer, inner_product, sequence_layers


@register_layer("RNN")
class RNNLayer(RecurrentLayer):
    traits = Traits(graph_safe=True, outside_effects=True)

    def recurrent_input_names(self):
        return ["h_0"]

    def recurrent_output_names(self):
        return [f"h_{self.T}"]

    def output_names(self):
        return ["o"]

    def fill_unrolled_net(self, net_param):
        p = self.layer_param.recurrent_param
        D, T = p.num_output, self.T
        recurrent = net_param.layer.add(type="Input", name="recurrent_input")
        recurrent.top.append("h_0")
        recurrent.input_param.shape.add().dim.extend(self.recurrent_input_shapes()[0])
        _, static = sequence_layers(
            net_param, T, "W_xh_x", "W_xh_x_static" if self.static_input else None, D, p.weight_filler,
            p.bias_filler, "W_xh", "b_h", "W_xh_static", "W_xh_x_static", "W_xh_x_slice")
        concat = caffe_pb2.LayerParameter(name="o_concat", type="Concat")
        concat.top.append("o")
        concat.concat_param.axis = 0
        for t in range(1, T + 1):
            prev = f"{t - 1}"
            scale = add_layer(net_param, caffe_pb2.LayerParameter(name=f"h_conted_{prev}", type="Scale"),
                              [f"h_{prev}", f"cont_{t}"], [f"h_conted_{prev}"])
            scale.scale_param.axis = 0
            add_layer(net_param, inner_product(f"W_hh_h_{prev}", D, 2, p.weight_filler), [f"h_conted_{prev}"],
                      [f"W_hh_h_{prev}"], params=["W_hh"])
            sum_bottoms = [f"W_hh_h_{prev}", f"W_xh_x_{t}"] + ([static] if static else [])
            add_layer(net_param, caffe_pb2.LayerParameter(name=f"h_input_sum_{t}", type="Eltwise"), sum_bottoms,
                      [f"h_neuron_input_{t}"])
            add_layer(net_param, caffe_pb2.LayerParameter(name=f"h_neuron_{t}", type="TanH"),
                      [f"h_neuron_input_{t}"], [f"h_{t}"])
            add_layer(net_param, inner_product(f"W_ho_h_{t}", D, 2, p.weight_filler, p.bias_filler), [f"h_{t}"],
                      [f"W_ho_h_{t}"], params=["W_ho", "b_o"])
            add_layer(net_param, caffe_pb2.LayerParameter(name=f"o_neuron_{t}", type="TanH"), [f"W_ho_h_{t}"],
                      [f"o_{t}"])
            concat.bottom.append(f"o_{t}")
        net_param.layer.add().CopyFrom(concat)
