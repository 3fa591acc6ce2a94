"""Our own script doing what BVLC's python/train.py does, through ``import caffe`` only.

One process per GPU (multiprocessing); the parent makes the NCCL id; each child sets its device,
GPU mode, solver count/rank and multiprocess, builds an SGDSolver, optionally restores, joins NCCL,
broadcasts, registers NCCL as solver callback (rank 0 with --timing: per-layer Timer hooks and
timing callbacks around it) and, with layer_wise_reduce, as after_backward hook; then steps
max_iter iterations.
"""

import argparse
from multiprocessing import Process

import caffe


def add_timing(solver, nccl):
    n = len(solver.net.layers)
    fwd, bwd = [caffe.Timer() for _ in range(n)], [caffe.Timer() for _ in range(n)]
    whole, reduce_ = caffe.Timer(), caffe.Timer()

    def report():
        if solver.iter % solver.param.display == 0:
            names = solver.net._layer_names
            lines = [f"forward {i} {names[i]}: {fwd[i].ms:.2f}" for i in range(n)]
            lines += [f"backward {i} {names[i]}: {bwd[i].ms:.2f}" for i in reversed(range(n))]
            caffe.log("\n".join([*lines, f"total: {whole.ms:.2f}", f"all-reduce: {reduce_.ms:.2f}"]))

    solver.net.before_forward(lambda i: fwd[i].start())
    solver.net.after_forward(lambda i: fwd[i].stop())
    solver.net.before_backward(lambda i: bwd[i].start())
    solver.net.after_backward(lambda i: bwd[i].stop())
    solver.add_callback(lambda: whole.start(), lambda: (whole.stop(), reduce_.start()))
    solver.add_callback(nccl)
    solver.add_callback(lambda: "", lambda: (reduce_.stop(), report()))


def worker(proto, snapshot, gpus, timing, uid, rank):
    caffe.set_device(gpus[rank])
    caffe.set_mode_gpu()
    caffe.set_solver_count(len(gpus))
    caffe.set_solver_rank(rank)
    caffe.set_multiprocess(True)
    solver = caffe.SGDSolver(proto)
    if snapshot:
        solver.restore(snapshot)
    nccl = caffe.NCCL(solver, uid)
    nccl.bcast()
    if timing and rank == 0:
        add_timing(solver, nccl)
    else:
        solver.add_callback(nccl)
    if solver.param.layer_wise_reduce:
        solver.net.after_backward(nccl)
    solver.step(solver.param.max_iter)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--solver", required=True)
    ap.add_argument("--snapshot")
    ap.add_argument("--gpus", type=int, nargs="+", default=[0])
    ap.add_argument("--timing", action="store_true")
    args = ap.parse_args()
    uid = caffe.NCCL.new_uid()
    caffe.init_log()
    caffe.log(f"Using devices {args.gpus}")
    procs = [Process(target=worker, args=(args.solver, args.snapshot, args.gpus, args.timing, uid, r), daemon=True)
             for r in range(len(args.gpus))]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    raise SystemExit(max(abs(p.exitcode or 0) for p in procs))


if __name__ == "__main__":
    main()
