"""Ours against ours: the zoo nets timed from two checkouts, in one run on one device.

    python benchmarks/zoo_ab.py --before PATH [--after .] [--modes solver,pycaffe,published]
                                [--nets resnet50,...] [--batch 32] [--iters 10] [--out FILE.md]

Each (mode, net) runs ``zoo.py``'s worker (our side only: one subprocess per measurement, as
``zoo.py`` isolates them) from the ``--before`` checkout and from the ``--after`` one, alternating
which goes first from net to net and mode to mode so that a drift of the device's clocks does not favour one side.
The table gives both trees' median iteration ms, batch-1 forward ms and device memory, and the
after / before ratios. A refactor that should not change speed passes when the ratios sit at 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from zoo import DEFAULT_NETS, MODES, RESULT_TAG  # noqa: E402  (beside this file)


def measure(tree: Path, mode: str, net: str, args: argparse.Namespace) -> dict:
    """One worker of ``tree``'s zoo.py; its result dict or ``{"error": why}``."""
    cmd = [sys.executable, str(tree / "benchmarks" / "zoo.py"), "--worker", "ours", "--nets", net, "--mode", mode,
           "--batch", str(args.batch), "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--latency-iters", str(args.latency_iters)] + ["--tf32"] * args.tf32 + ["--cpu"] * args.cpu
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    return {"error": ((proc.stderr or proc.stdout).strip().splitlines() or [f"exit {proc.returncode}"])[-1][:200]}


def _num(res: dict, *keys: str) -> float | None:
    value: object = res
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _cell(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _ratio(after: float | None, before: float | None) -> str:
    return "-" if after is None or not before else f"{after / before:.3f}x"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, type=Path, help="the checkout to compare against")
    ap.add_argument("--after", default=HERE.parent, type=Path, help="the checkout measured (default: this one)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--nets", default=DEFAULT_NETS)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--latency-iters", type=int, default=30)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (smoke test; no memory figures)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", help="append the markdown table to this file")
    args = ap.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    lines = ["| mode | net | before ms | after ms | after/before | b1 before | b1 after | b1 ratio | "
             "MiB before | MiB after |", "|---|---|---|---|---|---|---|---|---|---|"]
    failed = 0
    for mi, mode in enumerate(args.modes.split(",")):
        for ni, net in enumerate(args.nets.split(",")):
            order = ("before", "after") if (mi + ni) % 2 == 0 else ("after", "before")  # a checkerboard
            res = {}
            for side in order:
                start = time.perf_counter()
                res[side] = measure(trees[side], mode, net, args)
                print(f"{mode} {net} {side}: {res[side].get('train_ms', res[side].get('error'))} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
            failed += sum("error" in r for r in res.values())
            b, a = res["before"], res["after"]
            tb, ta = _num(b, "train_ms"), _num(a, "train_ms")
            lb, la = _num(b, "latency_ms"), _num(a, "latency_ms")
            mb, ma = (None if v is None else v / 2**20 for v in (_num(b, "memory", "device"), _num(a, "memory", "device")))
            lines.append(f"| {mode} | {net} | {_cell(tb)} | {_cell(ta)} | {_ratio(ta, tb)} | {_cell(lb, '.3f')} | "
                         f"{_cell(la, '.3f')} | {_ratio(la, lb)} | {_cell(mb, '.0f')} | {_cell(ma, '.0f')} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
