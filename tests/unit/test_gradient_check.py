"""The gradient checker itself: passes correct layers, catches wrong bottom and param gradients."""

import numpy as np
import pytest

from pycaffe_lite.layer import Layer, register_layer
from pycaffe_lite.testing.gradient_check import GradientChecker, GradientCheckError
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, make_layer


@register_layer("TestOnlyScaleBias")
class ScaleBiasLayer(Layer):
    """y = w * x + c (w, c scalar params); ``bug`` selects a deliberately wrong backward."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1
    bug = ""

    def layer_setup(self, bottom, top):
        self.blobs = [self.make_param_blob((1,)), self.make_param_blob((1,))]
        self.blobs[0].data[...] = 1.7
        self.blobs[1].data[...] = -0.3

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        w, c = self.blobs[0].cpu_data()[0], self.blobs[1].cpu_data()[0]
        top[0].mutable_cpu_data()[...] = w * bottom[0].cpu_data() + c

    def backward_cpu(self, top, propagate_down, bottom):
        dy, x = top[0].cpu_diff(), bottom[0].cpu_data()
        w = self.blobs[0].cpu_data()[0]
        if propagate_down[0]:
            factor = 1.01 * w if self.bug == "bottom" else w
            dx = dy * factor
            if self.bug == "one_element":
                dx = dx.copy()
                dx.flat[3] += 0.1
            bottom[0].mutable_cpu_diff()[...] = dx
        if self.param_propagate_down[0]:
            dw = np.sum(dy * x) * (0.0 if self.bug == "param" else 1.0)
            self.blobs[0].mutable_cpu_diff()[...] += dw
        if self.param_propagate_down[1]:
            self.blobs[1].mutable_cpu_diff()[...] += np.sum(dy)


@register_layer("TestOnlyBadAbs")
class BadAbsLayer(Layer):
    """y = |x| whose backward is wrong only at x == 0 (it claims slope 5 there)."""

    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)

    def forward_cpu(self, bottom, top):
        top[0].mutable_cpu_data()[...] = np.abs(bottom[0].cpu_data())

    def backward_cpu(self, top, propagate_down, bottom):
        x = bottom[0].cpu_data()
        slope = np.where(x == 0, 5.0, np.sign(x))
        bottom[0].mutable_cpu_diff()[...] = top[0].cpu_diff() * slope


def _scale_layer(bug=""):
    layer = make_layer('type: "TestOnlyScaleBias"')
    layer.bug = bug
    return layer


def _x(shape=(2, 3)):
    return np.random.default_rng(0).standard_normal(shape)


def test_correct_layer_passes_and_counts_elements():
    n = GradientChecker().check(_scale_layer(), blobs([_x()]), empty_blobs(1))
    assert n == 6 + 2  # every bottom element and both scalar params


@pytest.mark.parametrize("bug,where", [("bottom", "bottom 0"), ("param", "param 0"), ("one_element", "bottom 0[3]")])
def test_wrong_backward_is_caught(bug, where):
    with pytest.raises(GradientCheckError) as exc:
        GradientChecker().check(_scale_layer(bug), blobs([_x()]), empty_blobs(1))
    msg = str(exc.value)
    assert where in msg and "TestOnlyScaleBias" in msg
    if bug == "one_element":
        assert "1 of 8" in msg


def test_small_error_passes_with_loose_threshold():
    # a 1% error in the bottom gradient is within a 5% threshold
    GradientChecker(threshold=5e-2).check(_scale_layer("bottom"), blobs([_x()]), empty_blobs(1))


def test_check_bottom_and_params_selection():
    # With the bottom excluded, only the params are checked: a wrong bottom gradient goes unseen.
    n = GradientChecker().check(_scale_layer("bottom"), blobs([_x()]), empty_blobs(1), check_bottom=[])
    assert n == 2
    n = GradientChecker().check(_scale_layer("param"), blobs([_x()]), empty_blobs(1), check_params=False)
    assert n == 6


def test_kink_skipping():
    x = np.array([[0.0, 1.0, -2.0], [0.0, 0.5, -0.7]])
    with pytest.raises(GradientCheckError, match="2 of 6"):
        GradientChecker().check(make_layer('type: "TestOnlyBadAbs"'), blobs([x]), empty_blobs(1))
    n = GradientChecker(kink=0.0, kink_range=1e-6).check(make_layer('type: "TestOnlyBadAbs"'), blobs([x]), empty_blobs(1))
    assert n == 4


def test_top_filter_excludes_tops():
    # Split has several tops: only the selected one enters the objective, and gradients still agree.
    layer = make_layer('type: "Split"')
    n = GradientChecker().check(layer, blobs([_x()]), empty_blobs(2), top_filter=lambda k: k == 1)
    assert n == 6
