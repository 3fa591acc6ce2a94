"""Fixtures shared by the layer tests."""

import sys

import pytest

# Interp backward_tiling's knobs forced to extremes: one-row bands, column tiles a few top columns
# wide, one-column chunks of T
INTERP_TILINGS = {"default": {}, "thin_bands": {"MIN_TILES": 1 << 30}, "narrow": {"TILE_BYTES": 256},
                  "chunks": {"TILE_BYTES": 64, "TILE_ROWS": 1}}


@pytest.fixture(params=list(INTERP_TILINGS))
def interp_tiling(request, monkeypatch):
    """layers/interp.py with one of INTERP_TILINGS set (the module is returned)."""
    from pycaffe_lite.testing.layer_testing import make_layer

    module = sys.modules[type(make_layer('type: "Interp" interp_param { zoom_factor: 2 }')).__module__]
    for name, value in INTERP_TILINGS[request.param].items():
        monkeypatch.setattr(module, name, value)
    return module
