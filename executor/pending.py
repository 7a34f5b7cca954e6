"""Asynchronous sends in flight, kept to a bounded number.

gloo reports an isend as completed only once `wait()` has been called on it, however long ago its
bytes left, so a list pruned by `is_completed()` never shrinks and keeps every tensor ever sent
alive: on a long run that is every activation and every WSP update. Past `limit` outstanding sends
the oldest is waited for; in a pipeline it was received long before, so this costs nothing.
"""

from __future__ import annotations

from collections import deque

__all__ = ["PendingSends"]


class PendingSends:
    def __init__(self, limit: int = 32):
        self.limit = limit
        self._works: deque = deque()

    def add(self, work) -> None:
        self._works.append(work)
        while len(self._works) > self.limit:
            self._works.popleft().wait()

    def wait_all(self) -> None:
        while self._works:
            self._works.popleft().wait()

    def __len__(self) -> int:
        return len(self._works)
