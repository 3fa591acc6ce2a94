"""LossLayer base: normalization modes, the legacy ``normalize`` precedence, ignore_label, label
checks (CPU raise, GPU device flag raised at the loss read), label backprop refused, loss-weight
scaling, the two-stage device reduction. Exercised through a probe loss whose own math is trivial:
``loss = Σ_counted x / normalizer`` over (N, D) scores with (N, D) class labels in [0, 3)."""

import numpy as np
import pytest
from pycaffe_lite.layers.loss_layer import LossLayer, Norm

from pycaffe_lite.blob import Blob
from pycaffe_lite.errors import NetError, ShapeError
from pycaffe_lite.gpu import backend
from pycaffe_lite.testing.gradient_check import GradientChecker
from pycaffe_lite.testing.layer_testing import blobs, empty_blobs, layer_param

_FWD = """const int l = static_cast<int>(label[i]);
  const bool skip = has_ignore && l == ignore_label;
  valid[i] = skip ? Dtype(0) : Dtype(1);
  loss[i] = skip ? Dtype(0) : x[i];
  if (!skip && (l < 0 || l >= classes)) {
    loss[i] = Dtype(__int_as_float(0x7fffffff)); status[1] = 1; status[2] = label[i]; }"""


class ProbeLoss(LossLayer):
    type = "ProbeLoss"
    default_normalization = Norm.VALID
    uses_ignore_label = True

    def layer_setup(self, bottom, top):
        super().layer_setup(bottom, top)
        self.buf = Blob((), self.dtype)  # GPU: data = per-item loss, diff = valid flags

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.classes = 3
        self.buf.reshape(bottom[0].shape)

    def _valid(self, bottom):
        return self.class_labels(bottom[1].cpu_data().reshape(bottom[0].shape))[1]

    def forward_cpu(self, bottom, top):
        valid = self._valid(bottom)
        top[0].mutable_cpu_data()[...] = bottom[0].cpu_data()[valid].sum() / self.normalizer(int(valid.sum()))

    def backward_cpu(self, top, propagate_down, bottom):
        valid = self._valid(bottom)
        bottom[0].mutable_cpu_diff()[...] = valid * self.grad_scale(top, int(valid.sum()))

    def forward_gpu(self, bottom, top):
        n, loss, valid = bottom[0].count, self.buf.mutable_gpu_data(), self.buf.mutable_gpu_diff()
        backend.elementwise("probe_loss_fwd", "const Dtype* x, const Dtype* label, const int classes, "
                            "const int has_ignore, const int ignore_label, Dtype* loss, Dtype* valid, "
                            "Dtype* status", _FWD, self.dtype)(
            n, bottom[0].gpu_data(), bottom[1].gpu_data(), self.classes, int(self.has_ignore_label),
            self.ignore_label, loss, valid, self.gpu_status())
        self.gpu_reduce(n, loss, top, valid if self.has_ignore_label else None)

    def backward_gpu(self, top, propagate_down, bottom):
        backend.elementwise("probe_loss_bwd", "const Dtype* valid, const Dtype* w, const Dtype* norm, Dtype* dx",
                            "dx[i] = valid[i] * w[0] / norm[0]", self.dtype)(
            bottom[0].count, self.buf.gpu_diff(), top[0].gpu_diff(), self.gpu_norm(),
            bottom[0].mutable_gpu_diff())


class FixedProbeLoss(ProbeLoss):  # a Caffe loss with a fixed normalizer: loss_param is ignored
    default_normalization = None
    uses_ignore_label = False


class StrictProbeLoss(ProbeLoss):  # InfogainLoss-style: the legacy ``normalize`` is refused
    accepts_normalize = False


def probe(text="", cls=ProbeLoss):
    param = layer_param(f"name: 'probe' type: 'ProbeLoss' {text}")
    return cls(param, dtype=np.float64)


def case(shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    labels = rng.integers(0, 3, shape).astype(float)
    labels.flat[:2] = 2  # at least two positions carry label 2 (ignored when ignore_label: 2)
    return x, labels


def run(layer, x, labels, weight=None):
    bottom, top = blobs([x, labels]), empty_blobs(1)
    layer.setup(bottom, top)
    if weight is not None:
        top[0].diff[...] = weight
    loss = layer.forward(bottom, top)
    layer.backward(top, [True, False], bottom)
    return loss, bottom, top


def expected(x, labels, mode_name, ignore=None):
    valid = labels != ignore if ignore is not None else np.ones(labels.shape, bool)
    norm = {"FULL": labels.size, "VALID": valid.sum(), "BATCH_SIZE": x.shape[0], "NONE": 1}[mode_name]
    norm = max(norm, 1)
    return x[valid].sum() / norm, valid / norm


@pytest.mark.parametrize("mode_name", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("ignore", [None, 2])
def test_normalization_modes(mode, mode_name, ignore):
    x, labels = case()
    ign = f"ignore_label: {ignore}" if ignore is not None else ""
    _, bottom, top = run(probe(f"loss_param {{ normalization: {mode_name} {ign} }}"), x, labels)
    loss, grad = expected(x, labels, mode_name, ignore)
    assert top[0].shape == ()
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, grad, rtol=1e-12)


@pytest.mark.parametrize("text,mode_name", [
    ("", "VALID"),  # the layer's default
    ("loss_param { normalize: true }", "VALID"),
    ("loss_param { normalize: false }", "BATCH_SIZE"),
    ("loss_param { normalize: false normalization: FULL }", "FULL"),  # normalization wins
    ("loss_param { normalize: true normalization: NONE }", "NONE"),
])
def test_legacy_normalize_precedence(mode, text, mode_name):
    x, labels = case()
    layer = probe(text[:-1] + " ignore_label: 1 }" if text else "loss_param { ignore_label: 1 }")
    _, _, top = run(layer, x, labels)
    assert layer.normalization == getattr(Norm, mode_name)
    np.testing.assert_allclose(top[0].data, expected(x, labels, mode_name, ignore=1)[0], rtol=1e-12)


def test_fixed_normalizer_ignores_loss_param(mode):
    x, labels = case()
    layer = probe("loss_param { normalization: FULL normalize: true ignore_label: 2 }", FixedProbeLoss)
    _, _, top = run(layer, x, labels)
    assert layer.normalization == Norm.BATCH_SIZE and not layer.has_ignore_label
    np.testing.assert_allclose(top[0].data, expected(x, labels, "BATCH_SIZE")[0], rtol=1e-12)


def test_legacy_normalize_refused_where_caffe_refuses_it():
    with pytest.raises(NetError, match="normalize is deprecated"):
        run(probe("loss_param { normalize: true normalization: VALID }", StrictProbeLoss), *case())


def test_all_ignored_divides_by_one(mode):
    x = np.ones((2, 3))
    _, bottom, top = run(probe("loss_param { ignore_label: 0 }"), x, np.zeros((2, 3)))
    assert top[0].data == 0.0 and np.all(bottom[0].diff == 0)


@pytest.mark.parametrize("weight", [1.0, 2.5, -0.5])
def test_loss_weight_scales_loss_and_gradient(mode, weight):
    x, labels = case(seed=1)
    text = "" if weight == 1.0 else f"loss_weight: {weight}"
    layer = probe(text)
    loss, bottom, top = run(layer, x, labels)
    assert layer.loss(0) == weight and top[0].diff == weight
    ref, grad = expected(x, labels, "VALID")
    np.testing.assert_allclose(loss, weight * ref, rtol=1e-12)  # forward returns the weighted loss
    np.testing.assert_allclose(top[0].data, ref, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, weight * grad, rtol=1e-12)


def test_labels_refuse_backprop(mode):
    layer = probe()
    assert layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    _, bottom, top = run(layer, *case())
    with pytest.raises(NetError, match=r"cannot backpropagate to label inputs \(bottom 1\)"):
        layer.backward(top, [True, True], bottom)


@pytest.mark.parametrize("bad", [3.0, -1.0])
def test_label_out_of_range_raises_at_the_loss_read(mode, bad):
    x, labels = case()
    labels[1, 2] = bad
    layer = probe()
    bottom, top = blobs([x, labels]), empty_blobs(1)
    layer.setup(bottom, top)
    with pytest.raises(NetError, match=rf"label {int(bad)} out of range: labels must lie in \[0, 3\)"):
        layer.forward(bottom, top)  # GPU: the device flag, read once the loss is read
    labels[1, 2] = 0  # a good pass clears the flag
    bottom[1].data[...] = labels
    np.testing.assert_allclose(layer.forward(bottom, top), expected(x, labels, "VALID")[0], rtol=1e-12)


def test_ignored_label_may_lie_out_of_range(mode):
    x, labels = case()
    labels[0, 1] = -1
    _, _, top = run(probe("loss_param { ignore_label: -1 }"), x, labels)
    np.testing.assert_allclose(top[0].data, expected(x, labels, "VALID", ignore=-1)[0], rtol=1e-12)


def test_first_dimensions_must_match():
    with pytest.raises(ShapeError, match="same first dimension"):
        probe().setup(blobs([np.zeros((2, 3)), np.zeros((3, 2))]), empty_blobs(1))


def test_gradient(mode):
    x, labels = case((4, 5), seed=3)
    layer = probe("loss_param { ignore_label: 1 normalization: VALID }")
    GradientChecker(1e-3, 1e-6).check(layer, blobs([x, labels]), empty_blobs(1), check_bottom=[0])


@pytest.mark.gpu
@pytest.mark.parametrize("text", ["loss_param { ignore_label: 2 }", "loss_param { normalization: FULL }"])
def test_many_block_reduction(gpu_mode, text):
    # 1000 x 700 items: several hundred first-stage blocks, integer sums exact in float64
    rng = np.random.default_rng(4)
    x = rng.integers(-3, 4, (1000, 700)).astype(float)
    labels = rng.integers(0, 3, x.shape).astype(float)
    ignore = 2 if "ignore" in text else None
    _, bottom, top = run(probe(text), x, labels, weight=1.5)
    loss, grad = expected(x, labels, "VALID" if ignore else "FULL", ignore)
    np.testing.assert_allclose(top[0].data, loss, rtol=1e-13)
    np.testing.assert_allclose(bottom[0].diff, 1.5 * grad, rtol=1e-13)
