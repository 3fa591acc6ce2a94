"""Device-resident datasets: batches gathered on the device equal the host reader's order."""

from __future__ import annotations

import numpy as np
import pytest

from pycaffe_lite.blob import Blob

pytestmark = pytest.mark.gpu


def test_batches_wrap_in_order_and_seek(gpu_mode):
    from pycaffe_lite.data.device_cache import DeviceBatches

    rng = np.random.default_rng(0)
    data = rng.standard_normal((7, 2, 3)).astype(np.float32)
    labels = np.arange(7, dtype=np.float32)
    cache = DeviceBatches(data, labels, batch=3, start=5)
    top, lab = Blob((3, 2, 3), np.float32), Blob((3,), np.float32)
    order = []
    for _ in range(4):
        cache.next_batch(top.mutable_gpu_data(), lab.mutable_gpu_data())
        idx = [(5 + 3 * len(order) + k) % 7 for k in range(3)]
        np.testing.assert_array_equal(top.data, data[idx])
        np.testing.assert_array_equal(lab.data, labels[idx])
        order.append(idx)
    assert cache.position() == (5 + 12) % 7
    cache.seek(1)
    cache.next_batch(top.mutable_gpu_data(), None)
    np.testing.assert_array_equal(top.data, data[[1, 2, 3]])
