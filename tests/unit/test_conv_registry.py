"""The convolution engine registry (pycaffe_lite.conv.registry) drives the autotune's candidates, the
``engine`` field's meaning and the engine docs; needs no GPU."""

from __future__ import annotations

import logging

import pytest

from pycaffe_lite.conv import engines as conv_engines
from pycaffe_lite.conv import registry
from pycaffe_lite.conv.problem import ConvProblem
from pycaffe_lite.schema import caffe_pb2

BVLC_VALUES = ("DEFAULT", "CAFFE", "CUDNN")
ENUM = caffe_pb2.ConvolutionParameter.Engine


class DummyEngine(registry.Engine):
    """Two variants, forward only, for 1x1 kernels."""

    passes = ("forward",)
    requirement = "a 1x1 kernel"

    def __init__(self, size: int) -> None:
        self.name = f"dummy-{size}"

    @classmethod
    def variants(cls):
        return (cls(1), cls(2))

    def supports(self, prob):
        return prob.kernel == (1, 1)


@pytest.fixture
def dummy():
    before = dict(registry.ENGINES)
    cls = registry.register_engine("DUMMY_TEST", order=25, summary="a test's stand-in")(DummyEngine)
    try:
        yield cls
    finally:
        registry.unregister_engine(cls)
    assert registry.ENGINES == before


def test_registering_an_engine_makes_it_a_candidate(dummy):
    names = ("dummy-1", "dummy-2")
    for value in BVLC_VALUES:  # every value that lets the autotune pick
        assert set(names) <= set(registry.candidates(value))
        assert set(names) <= set(conv_engines.ENGINE_CANDIDATES[value])
    assert registry.candidates("DUMMY_TEST") == names
    assert conv_engines.ENGINE_CANDIDATES["DUMMY_TEST"] == names
    assert "DUMMY_TEST" in set(conv_engines.ENGINE_CANDIDATES)
    # placed by its order: after winograd (20), before depthwise (30)
    order = list(registry.ENGINES)
    assert order.index("winograd") < order.index("dummy-1") < order.index("dummy-2") < order.index("depthwise")
    assert "- ``DUMMY_TEST``: dummy-1, dummy-2: a test's stand-in" in registry.describe()
    prob = ConvProblem(2, 4, 5, 5, 8, 1, (1, 1), (0, 0), (1, 1), (1, 1), "<f4")
    assert all(registry.ENGINES[n].supports(prob) for n in names)


def test_unregistering_removes_every_trace(dummy):
    registry.unregister_engine(dummy)
    assert not any(n.startswith("dummy") for n in registry.ENGINES)
    assert not any(n.startswith("dummy") for n in registry.candidates("DEFAULT"))
    assert registry.candidates("DUMMY_TEST") == ()
    with pytest.raises(KeyError):
        conv_engines.ENGINE_CANDIDATES["DUMMY_TEST"]
    assert "DUMMY_TEST" not in set(conv_engines.ENGINE_CANDIDATES)


def test_register_refuses_bvlc_values_and_duplicate_names():
    with pytest.raises(ValueError, match="lets the autotune pick any engine"):
        registry.register_engine("CAFFE", order=1)

    class Clash(registry.Engine):
        name = "gemm"

    with pytest.raises(ValueError, match="registered twice"):
        registry.register_engine("CLASH_TEST", order=99)(Clash)
    assert type(registry.ENGINES["gemm"]).__name__ == "GemmEngine"


def test_every_engine_value_in_the_proto_has_engines_and_back():
    """Each of pycaffe-lite's Engine values forces the engines registered under it; each registered
    engine's value exists in caffe.proto (so a prototxt can name it)."""
    proto_values = set(ENUM.keys())
    ours = proto_values - set(BVLC_VALUES)
    assert ours == {e.enum for e in registry.ENGINES.values()}
    for value in ours:
        assert registry.candidates(value), value
    assert registry.candidates("GEMM") == ("gemm",)
    for value in BVLC_VALUES:  # CAFFE and CUDNN mean what DEFAULT means
        assert registry.candidates(value) == tuple(registry.ENGINES)


def test_engine_order_and_docs_come_from_the_registry():
    assert list(registry.ENGINES)[0] == "gemm"  # the fallback is timed first
    assert [e.order for e in registry.ENGINES.values()] == sorted(e.order for e in registry.ENGINES.values())
    doc = conv_engines.__doc__ or ""
    for name in registry.ENGINES:  # every engine, the tensor-core ones included
        assert name in doc, name
    for value in set(ENUM.keys()) - set(BVLC_VALUES):
        assert f"``{value}``" in doc


def test_caffe_and_cudnn_are_said_once_in_the_log(monkeypatch, caplog):
    monkeypatch.setattr(conv_engines, "_noted_fields", set())
    with caplog.at_level(logging.INFO, logger="pycaffe_lite"):
        for layer in ("conv1", "conv2", "conv3"):
            assert conv_engines.field_candidates("CAFFE", layer) == tuple(registry.ENGINES)
        conv_engines.field_candidates("DEFAULT", "conv4")
        conv_engines.field_candidates("GEMM", "conv5")
    said = [r.getMessage() for r in caplog.records if "autotune pick" in r.getMessage()]
    assert len(said) == 1 and "engine: CAFFE" in said[0] and "'conv1'" in said[0] and "GEMM" in said[0]
