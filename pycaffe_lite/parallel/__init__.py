"""Multi-GPU training: NCCL bindings (:mod:`.nccl`), rendezvous, launcher, gradient all-reduce."""
