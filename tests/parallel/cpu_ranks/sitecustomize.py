"""Test shim (on PYTHONPATH only in tests/parallel/test_cpu_ranks.py): lets ``pycaffe-lite train
--gpu 0,1`` run its ranks on the CPU, with gradients averaged through the rendezvous instead of
NCCL, so the launcher, rendezvous, data sharding, agreed Ctrl-C and failure handling are tested
on machines without GPUs."""

import os

if os.environ.get("PYCAFFE_LITE_TEST_CPU_RANKS") == "1":
    import numpy as np

    from pycaffe_lite import common
    from pycaffe_lite.commands import train
    from pycaffe_lite.parallel import launch

    class HostAverage:
        """solver callback: gradients averaged over the ranks through the rendezvous (float64 JSON)."""

        def __init__(self, rendezvous, params):
            self.rendezvous, self.params = rendezvous, params

        def on_start(self):
            pass

        def on_gradients_ready(self):
            mine = [p.cpu_diff().ravel().tolist() for p in self.params]
            everyone = self.rendezvous.allgather(mine)
            for i, p in enumerate(self.params):
                p.mutable_cpu_diff()[...] = np.mean([np.array(r[i]) for r in everyone], axis=0).reshape(p.shape)

    def attach(self, solver):
        params = solver.net.learnable_params
        root = self.rendezvous.allgather([p.cpu_data().ravel().tolist() for p in params])[0]
        for p, values in zip(params, root):
            p.mutable_cpu_data()[...] = np.array(values).reshape(p.shape)
        solver.add_callback(HostAverage(self.rendezvous, params))

    launch._device_count = lambda: 2
    launch.RankSession.attach = attach
    train.use_device = lambda device, autotune_cache=None: common.set_mode_cpu()
