"""Workers that time their work together keep each other company until the last one is done.

Profiling workers share their host's memory bandwidth and caches, as the ranks they predict
will. But their slices are rarely equal (Facebook's first slice, with its 4,714-feature input
dropout, took 8.8 s against the second's 5.1 s), and a worker whose timed epochs end first
leaves the slower one timing its last epochs alone, up to the 1.2x faster that this 2-core
machine runs one busy process than two. Run with a :class:`Together`, a worker that has timed
its epochs says so (a Dask ``Event`` per piece of work) and, if no other piece of its own is
still to finish, keeps running untimed epochs until every piece has said so.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LINGER_LIMIT_S", "Together", "together"]

#: The longest a worker keeps busy for the others (a safety valve: the client also releases
#: every worker when profiling fails).
LINGER_LIMIT_S = 600.0


@dataclass
class Together:
    """One piece of work among ``names`` (one Dask ``Event`` each), at ``mine``; ``mates`` are
    the pieces its worker runs (itself included).

    Called after each epoch once the piece's timed epochs are over: the first call says this
    piece is done; each call answers whether the worker may stop. A piece that is not the last
    of its worker's to finish stops at once (its worker has another piece to run, and Dask may
    run a worker's pieces in any order: lingering would hold the others up); the last one keeps
    its worker busy until every piece is done (or for :data:`LINGER_LIMIT_S` at most).
    """

    names: tuple[str, ...]
    mine: int
    mates: tuple[int, ...]
    _waiting: list[str] = field(default_factory=list, repr=False)
    _since: float = field(default=0.0, repr=False)

    def __call__(self) -> bool:
        from distributed import Event

        if not self._since:
            Event(self.names[self.mine]).set()
            self._since = time.perf_counter()
            if not all(Event(self.names[j]).is_set() for j in self.mates):
                return True  # a piece of this worker's is still to run, or running
            self._waiting = [n for n in self.names if n != self.names[self.mine]]
        while self._waiting and Event(self._waiting[0]).is_set():
            self._waiting.pop(0)
        return not self._waiting or time.perf_counter() - self._since > LINGER_LIMIT_S

    def release(self, client: Any) -> None:
        """Let every worker stop (``client``'s call, when profiling fails)."""
        from distributed import Event

        for name in self.names:
            Event(name, client=client).set()

    def forget(self, client: Any) -> None:
        """Drop the events from ``client``'s scheduler (once every piece has returned)."""
        from distributed import Event

        for name in self.names:
            Event(name, client=client).clear()


def together(owners: list[str]) -> list[Together]:
    """One :class:`Together` per piece of work, ``owners[i]`` the worker running piece ``i``."""
    run = uuid.uuid4().hex[:12]
    names = tuple(f"gnnpipe-together-{run}-{i}" for i in range(len(owners)))
    mates = {owner: tuple(i for i, o in enumerate(owners) if o == owner) for owner in owners}
    return [Together(names, i, mates[owner]) for i, owner in enumerate(owners)]
