"""Layers declare what the runtime needs (fusion parts, held blobs, outside effects, regenerable tops);
fusions and memory plans ask them instead of matching type strings."""

from __future__ import annotations

import numpy as np

from pycaffe_lite import common
from pycaffe_lite.blob import Blob
from pycaffe_lite.layer import AFFINE, CONVOLUTION, NORM_FOLD, RELU, Layer
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer


def _setup(text: str, shape=(2, 3, 4, 4), phase=common.TEST) -> Layer:
    layer = make_layer(text, np.float64)
    layer.phase = phase
    layer.setup(blobs([np.ones(shape)], np.float64), empty_blobs(1, np.float64))
    return layer


def test_fusion_parts_come_from_the_layers():
    assert _setup('name: "r" type: "ReLU"').fuses_as(RELU)
    assert not _setup('name: "r" type: "ReLU" relu_param { negative_slope: 0.1 }').fuses_as(RELU)
    assert _setup('name: "c" type: "Convolution" convolution_param { num_output: 2 kernel_size: 1 }').fuses_as(
        CONVOLUTION)
    assert not _setup('name: "d" type: "Deconvolution" convolution_param { num_output: 2 kernel_size: 1 }'
                      ).fuses_as(CONVOLUTION)
    bn = 'name: "b" type: "BatchNorm" batch_norm_param { use_global_stats: %s }'
    assert _setup(bn % "true").fuses_as(NORM_FOLD) and not _setup(bn % "false").fuses_as(NORM_FOLD)
    x = Blob((2, 3, 4, 4), np.float64)
    assert _setup('name: "s" type: "Scale" scale_param { bias_term: true }').fuses_as(AFFINE, x)
    assert not _setup('name: "s" type: "Scale" scale_param { axis: 0 num_axes: 2 }').fuses_as(AFFINE, x)
    assert not _setup('name: "t" type: "TanH"').fuses_as(RELU)


def test_held_blobs_include_params_and_internal_state():
    scale = _setup('name: "s" type: "Scale"')
    assert scale.blobs[0] in scale.held_blobs()
    bn = _setup('name: "b" type: "BatchNorm"', phase=common.TRAIN)
    held = bn.held_blobs()
    assert all(b in held for b in bn.blobs) and len(held) > len(bn.blobs)  # its batch statistics too


def test_outside_effects_and_regenerable_tops_are_declared():
    from pycaffe_lite.layer import layer_class

    assert layer_class("Python").traits.outside_effects and layer_class("HDF5Output").traits.outside_effects
    assert not layer_class("ReLU").traits.outside_effects
    assert layer_class("BatchNorm").traits.regenerates_top and layer_class("Scale").traits.saves_input_in_place


# -- every registered layer declares its traits, and the declaration matches what the class does -----
def _registered():
    from pycaffe_lite.layer import _REGISTRY, layer_type_list

    layer_type_list()  # the package's layers (tests may register more: those are left out)
    return sorted((t, cls) for t, cls in _REGISTRY.items() if cls.__module__.startswith("pycaffe_lite.layers."))


def test_every_layer_type_declares_its_traits_in_its_own_class():
    assert [t for t, cls in _registered() if "traits" not in vars(cls)] == []


def test_a_graph_safe_declaration_needs_device_code():
    """A layer replayed from a CUDA graph must run its own GPU passes, not the CPU code on host
    copies (host reads and allocations cannot be captured)."""
    wrong = [t for t, cls in _registered() if cls.traits.graph_safe and cls.forward_gpu is Layer.forward_gpu]
    assert wrong == []


def test_fusion_roles_come_with_the_passes_they_promise():
    """Each declared role has the methods the fused pass calls; a class with those methods declares it."""
    from pycaffe_lite import layer as L

    needs = {L.CONVOLUTION: ("folded_copy", "compute_forward_relu"), L.NORM_FOLD: ("fold_convolution",),
             L.NORM_CHAIN: ("chain_forward_gpu", "chain_backward_gpu"), L.RELU_MASK: ("backward_relu_gpu",),
             L.SUM_RELU: ("chain_forward_relu_gpu", "chain_backward_relu_gpu")}
    for t, cls in _registered():
        for role, methods in needs.items():
            has = all(getattr(cls, m, None) is not None and getattr(cls, m) is not getattr(Layer, m, None)
                      for m in methods)
            assert (role in cls.traits.fuses) == has, (t, role)
        assert (cls.traits.regenerates_top
                == (cls.regenerate_top_into is not Layer.regenerate_top_into)), t


def test_traits_refuse_unknown_roles():
    import pytest

    from pycaffe_lite.layer import Traits

    with pytest.raises(ValueError, match="unknown fusion roles"):
        Traits(fuses=frozenset({"conv"}))
    with pytest.raises(ValueError, match="backward_reads"):
        Traits(backward_reads=("bottoms",))


def test_the_readme_names_every_layer_without_a_gpu_path():
    """README.md and docs/architecture.md list the layer types whose GPU mode runs their CPU code."""
    from pathlib import Path

    cpu_only = sorted(t for t, cls in _registered() if cls.forward_gpu is Layer.forward_gpu)
    root = Path(__file__).resolve().parents[2]
    for doc in ("README.md", "docs/architecture.md"):
        text = " ".join((root / doc).read_text().split())
        listed = f"{', '.join(cpu_only[:-1])} and {cpu_only[-1]}"
        assert listed in text, (doc, listed)
