"""What a gloo all-reduce and a point-to-point round trip cost on this host right after the ranks
computed or slept, against the same calls back to back (experiments/validation/results/tp_cpu: the
tensor-parallel plans' all-reduces take several times their bytes' time).

    python experiments/validation/collective_gap.py [--bytes 393216] [--ranks 2] [--out FILE.md]

Each rank (one torch thread) repeats: wait out the gap (none, a sleep, or a busy spin of the same
length on every rank), then time one call; the table gives each rank's median over the repeats.
393216 bytes is one all-reduce of experiments/validation/plans/tp2_gpt.json's GPT (sequence 32,
minibatch 4, width 768, FP32).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from executor.calibrate import busy_wait
from executor.children import die_with_parent, next_result

GAPS = (("back to back", None, 0.0), ("after 29 ms asleep", "sleep", 0.029), ("after 29 ms busy", "spin", 0.029),
        ("after 5 ms busy", "spin", 0.005))


def _gap(kind: str | None, seconds: float) -> None:
    if kind == "sleep":
        time.sleep(seconds)
    elif kind == "spin":
        busy_wait(seconds)


def _rank(rank: int, n: int, nbytes: int, repeats: int, path: str, results) -> None:
    import torch
    import torch.distributed as dist
    die_with_parent()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=n)
    t = torch.ones(nbytes // 4)
    for _ in range(20):
        dist.all_reduce(t)
    out = {}
    for call in ("all-reduce", "p2p round trip"):
        for label, kind, seconds in GAPS:
            times = []
            for _ in range(repeats):
                dist.barrier()
                _gap(kind, seconds)
                start = time.perf_counter()
                if call == "all-reduce":
                    dist.all_reduce(t)
                elif rank == 0:
                    dist.send(t, 1)
                    dist.recv(t, 1)
                elif rank == 1:
                    dist.recv(t, 0)
                    dist.send(t, 0)
                times.append(time.perf_counter() - start)
            out[(call, label)] = statistics.median(times) * 1e3
    results.put((rank, out))
    dist.destroy_process_group()


def measure(n: int, nbytes: int, repeats: int) -> dict[int, dict]:
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    path = f"/tmp/collective_gap_{time.time_ns()}"
    procs = [ctx.Process(target=_rank, args=(r, n, nbytes, repeats, path, results)) for r in range(n)]
    for p in procs:
        p.start()
    try:
        got = dict(next_result(results, procs, 600.0, "collective_gap") for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
    Path(path).unlink(missing_ok=True)
    return got


def table(got: dict[int, dict], n: int, nbytes: int) -> str:
    lines = [f"{n} ranks, {nbytes} bytes, median ms per call (rank 0 / rank 1)", "",
             "| call | " + " | ".join(label for label, _, _ in GAPS) + " |", "|---|" + "---|" * len(GAPS)]
    for call in ("all-reduce", "p2p round trip"):
        cells = [" / ".join(f"{got[r][(call, label)]:.2f}" for r in sorted(got) if r < 2) for label, _, _ in GAPS]
        lines.append(f"| {call} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=393216)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--out", default=None, help="also append the table to this markdown file")
    args = p.parse_args(argv)
    text = table(measure(args.ranks, args.bytes, args.repeats), args.ranks, args.bytes)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
