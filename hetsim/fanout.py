"""Fan-out: map a picklable function over items on Dask distributed, results in item order.

    rows = fan_out(run_point, points, workers=4)                         # a LocalCluster on this machine
    rows = fan_out(run_point, points, scheduler="tcp://10.0.0.5:8786")   # a cluster the user runs

Results come back in the order of `items` whatever the number of workers or the order they finish,
so a sweep or a plan search gives the same output on one core or many. Small jobs run in this
process: starting a LocalCluster costs about two seconds, more than a few simulations take.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Protocol, Sequence

from hetsim.errors import HetsimError

__all__ = ["fan_out", "check_address", "INLINE_BELOW", "CONNECT_TIMEOUT_S"]

# Fewer items than this run in-process (when no scheduler is named): a cluster would not pay off.
INLINE_BELOW = 4
# How long to try reaching a scheduler the user named before saying it cannot be reached.
CONNECT_TIMEOUT_S = 10


class Bar(Protocol):
    def update(self, n: int = 1) -> object: ...


def fan_out(fn: Callable[[Any], Any], items: Sequence[Any], *, workers: int | None = None,
            scheduler: str | None = None, bar: Bar | None = None,
            inline_below: int = INLINE_BELOW) -> list[Any]:
    """[fn(item) for item in items], run on Dask workers; `bar.update(1)` as each one finishes.

    `scheduler`: the address of a running Dask scheduler; otherwise a LocalCluster of `workers`
    processes (default: every core) is started and stopped here. An exception in `fn` propagates.
    """
    items = list(items)
    workers = workers or os.cpu_count() or 1
    if scheduler is None and (workers <= 1 or len(items) < inline_below):
        return _inline(fn, items, bar)
    from distributed import Client
    if scheduler is not None:
        with _connect(scheduler) as client:
            return _gather(client, fn, items, bar)
    with _local_cluster(min(workers, len(items))) as cluster, Client(cluster, set_as_default=False) as client:
        return _gather(client, fn, items, bar)


def check_address(address: str) -> None:
    """Refuse, before any work, a scheduler address Dask cannot parse (e.g. one without a port)."""
    from distributed.comm.addressing import parse_address, parse_host_port
    try:
        scheme, location = parse_address(address)
        if scheme in ("tcp", "tls"):
            parse_host_port(location)
    except ValueError as exc:
        raise HetsimError(f"--scheduler {address!r}: {exc}; expected an address like tcp://10.0.0.5:8786") from None


def _connect(address: str):
    from distributed import Client
    check_address(address)
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except OSError as exc:
        raise HetsimError(f"--scheduler {address}: cannot reach a Dask scheduler there ({exc})") from None


def _inline(fn: Callable[[Any], Any], items: list[Any], bar: Bar | None) -> list[Any]:
    out = []
    for item in items:
        out.append(fn(item))
        if bar is not None:
            bar.update(1)
    return out


def _local_cluster(workers: int):
    from distributed import LocalCluster
    # One thread per worker process: the simulator is pure Python, so threads would share one GIL.
    return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                        silence_logs=logging.ERROR)


def _gather(client, fn: Callable[[Any], Any], items: list[Any], bar: Bar | None) -> list[Any]:
    from distributed import as_completed
    # pure=False: equal items are still separate tasks (Dask would otherwise hash and merge them).
    futures = client.map(fn, items, pure=False)
    for future in as_completed(futures, loop=client.loop):
        if future.status == "error":
            break                          # its exception is raised by result() below
        if bar is not None:
            bar.update(1)
    try:
        return [f.result() for f in futures]
    finally:
        client.cancel(futures)
