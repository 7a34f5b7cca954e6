"""Failure detection: a heartbeat per rank in the rendezvous store, a watchdog thread, and a
diagnosis that names the rank that died or hung, so no rank waits forever.

- Every rank's watchdog writes `hb/<rank>` = (time, current action, since when, host, pid) every interval.
- A rank whose blocking operation fails (gloo reports a reset connection at once, or a timeout after
  `timeout_s`) waits two intervals, reads the heartbeats and names the culprit: a rank whose heartbeat
  stopped died, or is stopped (SIGSTOP, a debugger: its process, when on this host, is in state T);
  else a stage rank stuck at one action for longer than the timeout hung. Every rank is looked at,
  its own peers first: the peer a rank waits on may itself be waiting on the stopped one (a parameter
  server waits on every stage). Servers (parameter servers, the sdpipe scheduler) report no actions,
  so only their heartbeats count. The first
  diagnosis is published under `failed`; every watchdog that sees it exits its rank at once (the
  hung rank included), so all ranks exit within about timeout_s + a few intervals.
- A rank also exits when its launcher process is gone.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Callable

from hetsim.errors import HetsimError

__all__ = ["ExecutorError", "Health", "process_state"]


class ExecutorError(HetsimError):
    """A run failed; the message names the rank at fault."""


class Health:
    def __init__(self, store, rank: int, describe: Callable[[int], str], *, timeout_s: float,
                 position: Callable[[], tuple[str, float]], on_exit: Callable[[str], None],
                 interval_s: float = 0.5, world_size: int = 0, servers: frozenset[int] = frozenset()):
        self.store, self.rank, self.describe = store, rank, describe
        self.world_size, self.servers = world_size, servers
        self.timeout_s, self.interval_s = timeout_s, interval_s
        self.position, self.on_exit = position, on_exit
        self._ppid = os.getppid()
        self._stop = threading.Event()
        self._diagnosing = False
        self._thread = threading.Thread(target=self._loop, name="executor-watchdog", daemon=True)

    def start(self) -> None:
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _beat(self) -> None:
        action, since = self.position()
        self.store.set(f"hb/{self.rank}", f"{time.time()}|{action}|{since}|{socket.gethostname()}|{os.getpid()}")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._beat()
                if not self._diagnosing and self.store.check(["failed"]):
                    self._exit(f"{self.describe(self.rank)} stopped: {self.store.get('failed').decode()}")
                if os.getppid() != self._ppid:
                    self._exit(f"{self.describe(self.rank)} stopped: its launcher exited")
            except Exception as exc:             # the store itself is gone: the run is over
                if not self._stop.is_set():
                    self._exit(f"{self.describe(self.rank)} stopped: rendezvous store unreachable ({exc})")

    def _exit(self, message: str) -> None:
        if self._stop.is_set():
            return
        self.on_exit(message)
        print(f"executor: error: {message}", file=sys.stderr, flush=True)
        os._exit(1)

    def _read(self, peer: int) -> tuple[float, str, float, str, int] | None:
        key = f"hb/{peer}"
        if not self.store.check([key]):
            return None
        t, action, since, host, pid = self.store.get(key).decode().split("|")
        return float(t), action, float(since), host, int(pid)

    def culprit(self, peers: list[int]) -> str:
        """Which rank died, is stopped or hung, from the heartbeats (call after a failed operation)."""
        time.sleep(3 * self.interval_s)           # a dead rank's heartbeat must go stale first
        now, hung = time.time(), None
        order = [*peers, *(r for r in range(self.world_size) if r != self.rank and r not in peers)]
        for peer in order:
            beat = self._read(peer)
            if beat is None:
                return f"{self.describe(peer)} died (it never sent a heartbeat)"
            t, action, since, host, pid = beat
            if now - t > 2.5 * self.interval_s:
                return (f"{self.describe(peer)} {_silent(host, pid)} (no heartbeat for {now - t:.1f} s; "
                        f"last reported action {action})")
            if hung is None and peer not in self.servers and now - since > 0.5 * self.timeout_s:
                hung = f"{self.describe(peer)} hung (at action {action} for {now - since:.1f} s)"
        return hung or f"no peer among ranks {peers} looks dead or hung"

    def failure(self, peers: list[int], waiting_at: str, exc: BaseException) -> ExecutorError:
        """The error this rank raises: the first published diagnosis (the root cause), or its own."""
        # Keep beating while diagnosing: peers diagnosing the same failure would take a silent
        # heartbeat for a death. Another rank's diagnosis must not end this one before it is published.
        self._diagnosing = True
        mine = self.culprit(peers)
        self.stop()
        try:
            root = self.store.compare_set("failed", "", mine).decode() or mine
        except Exception:
            root = mine
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return ExecutorError(f"{self.describe(self.rank)} stopped at {waiting_at}: {root} [{detail}]")


def _silent(host: str, pid: int) -> str:
    """Why a rank's heartbeat stopped, as far as this host can tell: its process is gone, or stopped."""
    if host != socket.gethostname():
        return "died or is stopped"
    state = process_state(pid)
    if state is None:
        return "died"
    if state in ("T", "t"):
        return f"is stopped (process {pid} in state {state}: SIGSTOP or a debugger)"
    if state in ("Z", "X"):
        return "died"
    return f"stopped sending heartbeats (process {pid} alive, state {state})"


def process_state(pid: int) -> str | None:
    """The state letter of a process on this host (R, S, D, T stopped, t traced, Z, ...), or None when
    it is gone or /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
