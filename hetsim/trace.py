"""Chrome/Perfetto trace JSON, written the same way for predictions and measurements.

One process row per node with one thread row per GPU (compute and wait spans), and one counter row
per link (bandwidth in use, GB/s). Open in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetsim.outputs import write_text

__all__ = ["TraceWriter", "load_trace"]


class TraceWriter:
    def __init__(self, kind: str = "prediction"):
        self.kind = kind
        self.events: list[dict[str, Any]] = []
        self._pids: dict[str, int] = {}
        self._tids: dict[tuple[str, str], int] = {}

    def _pid(self, process: str) -> int:
        if process not in self._pids:
            pid = self._pids[process] = len(self._pids) + 1
            self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                "args": {"name": process}})
            self.events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                                "args": {"sort_index": pid}})
        return self._pids[process]

    def row(self, process: str, thread: str) -> tuple[int, int]:
        """Declare a row (rows appear in the order first declared); returns (pid, tid)."""
        pid = self._pid(process)
        key = (process, thread)
        if key not in self._tids:
            tid = self._tids[key] = len(self._tids) + 1
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                "args": {"name": thread}})
        return pid, self._tids[key]

    def span(self, process: str, thread: str, name: str, start_s: float, dur_s: float,
             cat: str = "compute", args: dict[str, Any] | None = None) -> None:
        pid, tid = self.row(process, thread)
        event = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                 "ts": start_s * 1e6, "dur": dur_s * 1e6}
        if args:
            event["args"] = args
        self.events.append(event)

    def counter(self, process: str, name: str, t_s: float, values: dict[str, float]) -> None:
        self.events.append({"ph": "C", "name": name, "pid": self._pid(process), "tid": 0,
                            "ts": t_s * 1e6, "args": values})

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "TraceWriter":
        """A trace read back (trace.json), its rows known again so that more can be added."""
        trace = cls(doc.get("otherData", {}).get("kind", "prediction"))
        trace.events = list(doc["traceEvents"])
        names = {}
        for e in trace.events:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                names[e["pid"]] = e["args"]["name"]
                trace._pids[e["args"]["name"]] = e["pid"]
        for e in trace.events:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                trace._tids[names[e["pid"]], e["args"]["name"]] = e["tid"]
        return trace

    def to_dict(self) -> dict[str, Any]:
        return {"traceEvents": self.events, "displayTimeUnit": "ms",
                "otherData": {"producer": "hetsim", "kind": self.kind}}

    def write(self, path: str | Path) -> None:
        write_text(path, json.dumps(self.to_dict(), separators=(",", ":")) + "\n")


def load_trace(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
