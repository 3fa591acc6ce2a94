"""Layers declare what the runtime needs (fusion parts, held blobs, outside effects, regenerable tops);
fusions and memory plans ask them instead of matching type strings."""

from __future__ import annotations

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.blob import Blob
from pycaffe_lite.layer import Layer
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer


def _setup(text: str, shape=(2, 3, 4, 4), phase=common.TEST) -> Layer:
    layer = make_layer(text, np.float64)
    layer.phase = phase
    layer.setup(blobs([np.ones(shape)], np.float64), empty_blobs(1, np.float64))
    return layer


def test_fusion_parts_come_from_the_layers():
    assert _setup('name: "r" type: "ReLU"').relu_epilogue()
    assert not _setup('name: "r" type: "ReLU" relu_param { negative_slope: 0.1 }').relu_epilogue()
    assert _setup('name: "c" type: "Convolution" convolution_param { num_output: 2 kernel_size: 1 }').fusable_convolution()
    assert not _setup('name: "d" type: "Deconvolution" convolution_param { num_output: 2 kernel_size: 1 }'
                      ).fusable_convolution()
    bn = 'name: "b" type: "BatchNorm" batch_norm_param { use_global_stats: %s }'
    assert _setup(bn % "true").folds_into_convolution() and not _setup(bn % "false").folds_into_convolution()
    x = Blob((2, 3, 4, 4), np.float64)
    assert _setup('name: "s" type: "Scale" scale_param { bias_term: true }').per_channel_affine(x)
    assert not _setup('name: "s" type: "Scale" scale_param { axis: 0 num_axes: 2 }').per_channel_affine(x)
    assert not _setup('name: "t" type: "TanH"').relu_epilogue()


def test_held_blobs_include_params_and_internal_state():
    scale = _setup('name: "s" type: "Scale"')
    assert scale.blobs[0] in scale.held_blobs()
    bn = _setup('name: "b" type: "BatchNorm"', phase=common.TRAIN)
    held = bn.held_blobs()
    assert all(b in held for b in bn.blobs) and len(held) > len(bn.blobs)  # its batch statistics too


def test_outside_effects_and_regenerable_tops_are_declared():
    from pycaffe_lite.layer import layer_class

    assert layer_class("Python").outside_effects and layer_class("HDF5Output").outside_effects
    assert not layer_class("ReLU").outside_effects
    assert layer_class("BatchNorm").regenerates_top and layer_class("Scale").saves_input_in_place
