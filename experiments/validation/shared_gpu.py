"""What a gloo transfer through host memory holds when the ranks share one GPU, as `hetsim validate
--device cuda` runs plans on a one-GPU machine (executor.placement: copied to the host, sent over
gloo, copied onto the GPU).

    python experiments/validation/shared_gpu.py [--mib 32] [--sizes 4,8,16,32] [--device cuda] [--out FILE]

For a message of --mib MiB it measures, each the median of --repeats:
1. a GPU-to-host copy (into pageable memory, as `tensor.to("cpu")`) and a host-to-GPU copy, in one
   process, alone and while another process keeps the GPU busy with matrix products;
2. one hop of a gloo ping-pong between two processes on the GPU (copy out, send, receive, copy in),
   alone and while a third process keeps the GPU busy;
3. the busy process's matrix-product rate alone and during each of those, which says whether the
   transfers took GPU time from it;
4. the link as `hetsim validate` calibrates it (executor.calibrate.link_speed, 4 MiB there), at each
   of --sizes MiB: how the calibration depends on the message size.
The answer decides how the simulator should charge such transfers (hetsim.cluster.Node.copy_cores):
on the host's cores alone, or partly on the shared GPU. `--device cpu` runs the same steps without a
GPU (a check of this script). Writes a Markdown table to --out (default: print only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from executor.calibrate import link_speed  # noqa: E402
from executor.children import die_with_parent, next_result  # noqa: E402

GEMM = {"cuda": 4096, "cpu": 256}          # side of the busy process's square matrix products


def _side(device: str) -> int:
    return GEMM["cuda" if device.startswith("cuda") else "cpu"]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _busy(device: str, ready, stop, out) -> None:
    """Matrix products until told to stop; sends (time, products so far) samples."""
    die_with_parent()
    side = _side(device)
    x = torch.randn(side, side, device=device)
    y = x @ x
    _sync(device)
    ready.set()
    samples, done = [(time.perf_counter(), 0)], 0
    while not stop.is_set():
        for _ in range(4):
            y = x @ x
        _sync(device)
        done += 4
        samples.append((time.perf_counter(), done))
    del y
    out.put(samples)


def _copies(device: str, nbytes: int, repeats: int, out) -> None:
    die_with_parent()
    gpu = torch.randn(nbytes // 4, device=device)
    d2h, h2d = [], []
    start = None
    for k in range(repeats + 2):
        if k == 2:
            start = time.perf_counter()         # the timed copies only: not this process's start-up
        t0 = time.perf_counter()
        host = gpu.to("cpu") if device != "cpu" else gpu.clone()
        t1 = time.perf_counter()
        gpu = host.to(device) if device != "cpu" else host.clone()
        _sync(device)
        d2h.append(t1 - t0)
        h2d.append(time.perf_counter() - t1)
    out.put((start, time.perf_counter(), statistics.median(d2h[2:]), statistics.median(h2d[2:])))


def _ping(rank: int, path: str, device: str, nbytes: int, repeats: int, out) -> None:
    import torch.distributed as dist
    die_with_parent()
    torch.set_num_threads(1)                     # as every executor rank
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    buf, hops = torch.zeros(nbytes // 4, device=device), []
    start = time.perf_counter()
    for k in range(repeats + 2):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf.to("cpu"), 1)
        into = torch.empty(nbytes // 4)
        dist.recv(into, 1 - rank)
        buf = into.to(device)
        _sync(device)
        if rank == 1:
            dist.send(buf.to("cpu"), 0)
        if k >= 2:
            hops.append((time.perf_counter() - t0) / 2)
            if k == 2:
                start = t0
    if rank == 0:
        out.put((start, time.perf_counter(), statistics.median(hops)))
    dist.destroy_process_group()


def _run(ctx, target, args_list: list[tuple], what: str, timeout: float = 120.0):
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, out)) for args in args_list]
    for p in procs:
        p.start()
    try:
        return next_result(out, procs, timeout, what)
    finally:
        for p in procs:
            p.join(timeout=10)


def _rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    """Matrix products per second in [start, end], from the busy process's samples."""
    inside = [(t, n) for t, n in samples if start <= t <= end]
    if len(inside) < 2:
        return float("nan")
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / (t1 - t0)


def hops_by_size(device: str, sizes: list[int], repeats: int) -> dict[int, tuple[float, float]]:
    """(latency_s, bandwidth_Bps) per message size in MiB, as `hetsim validate` calibrates the link
    (executor.calibrate.link_speed, which it runs at 4 MiB)."""
    return {mib: link_speed(large=repeats, nbytes=mib << 20, device=device) for mib in sizes}


def measure(device: str, mib: int, repeats: int) -> dict:
    ctx = mp.get_context("spawn")
    nbytes = mib << 20
    result = {}
    for contended in (False, True):
        busy = None
        if contended:
            ready, stop, busy_out = ctx.Event(), ctx.Event(), ctx.Queue()
            busy = ctx.Process(target=_busy, args=(device, ready, stop, busy_out))
            busy.start()
            ready.wait(120)
            time.sleep(0.5)
        t_copies0, t_copies1, d2h, h2d = _run(ctx, _copies, [(device, nbytes, repeats)], "copies")
        time.sleep(0.5)
        t_alone0 = time.perf_counter()
        time.sleep(1.0)
        t_alone1 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            ping_start, ping_end, hop = _run(ctx, _ping, [(r, f"{tmp}/store", device, nbytes, repeats) for r in (0, 1)],
                                             "ping-pong")
        key = "busy" if contended else "alone"
        result[key] = {"d2h_ms": 1e3 * d2h, "h2d_ms": 1e3 * h2d, "hop_ms": 1e3 * hop}
        if busy is not None:
            stop.set()
            samples = busy_out.get(timeout=60)
            busy.join(timeout=10)
            flops = 2 * _side(device) ** 3 / 1e12
            result["gemm_tflops"] = {"alone": flops * _rate(samples, t_alone0, t_alone1),
                                     "during copies": flops * _rate(samples, t_copies0, t_copies1),
                                     "during ping-pong": flops * _rate(samples, ping_start, ping_end)}
    return result


def report(result: dict, device: str, mib: int, repeats: int, hops: dict[int, tuple[float, float]]) -> str:
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    rows = [("GPU-to-host copy (pageable), ms", "d2h_ms"), ("host-to-GPU copy, ms", "h2d_ms"),
            ("gloo hop between two ranks on the GPU (copy out, send, receive, copy in), ms", "hop_ms")]
    lines = [f"# Transfers through host memory between ranks sharing one GPU ({name})", "",
             f"`python experiments/validation/shared_gpu.py --device {device} --mib {mib} --repeats {repeats}"
             f"{' --sizes ' + ','.join(map(str, hops)) if hops else ''}`; "
             f"a {mib} MiB message, medians of {repeats}; torch {torch.__version__}.", "",
             "| measurement | alone | while another process runs matrix products |", "|---|---|---|"]
    lines += [f"| {label} | {result['alone'][k]:.2f} | {result['busy'][k]:.2f} |" for label, k in rows]
    g = result["gemm_tflops"]
    side = _side(device)
    lines += ["", f"The other process's {side}x{side} FP32 matrix products: {g['alone']:.1f} TFLOP/s with nothing else "
              f"running, {g['during copies']:.1f} during the copies, {g['during ping-pong']:.1f} during the ping-pong."]
    if hops:
        lines += ["", "The link as `hetsim validate` calibrates it (executor.calibrate.link_speed), by message size:",
                  "", "| MiB | latency us | bandwidth GB/s | one hop ms |", "|---|---|---|---|"]
        lines += [f"| {m} | {1e6 * lat:.0f} | {bw / 1e9:.2f} | {1e3 * (lat + (m << 20) / bw):.2f} |"
                  for m, (lat, bw) in hops.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=32, help="message size in MiB (default 32)")
    p.add_argument("--repeats", type=int, default=15, help="timed repeats of each (default 15)")
    p.add_argument("--sizes", default="", help="comma-separated MiB: also time a hop alone at each (e.g. 4,8,16,32)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--out", type=Path, default=None, help="write the Markdown table here too")
    args = p.parse_args(argv)
    sizes = [int(m) for m in args.sizes.split(",") if m]
    result = measure(args.device, args.mib, args.repeats)
    text = report(result, args.device, args.mib, args.repeats, hops_by_size(args.device, sizes, args.repeats))
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
