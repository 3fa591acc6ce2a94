"""The convolution family: geometry (``geometry``, ``problem``), the CPU path (``cpu``), the GPU engines,
each a module beside its kernels that registers itself (``registry``; ``gemm`` with ``im2col``,
``implicit`` and ``tensorcore`` sharing ``tiling``, ``winograd``, ``depthwise``, ``direct``), and running
them with the per-shape autotune (``engines``, choices on disk in ``autotune_file``). See
docs/convolution.md."""
