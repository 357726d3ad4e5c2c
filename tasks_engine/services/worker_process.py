"""What the worker rows and the leader read of a `runworker` process: worker/loop.py's
`Worker`, a room above this one, seen through a protocol so that no import points up."""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, Protocol


class WorkerProcess(Protocol):
    id: str
    pairs: list[tuple[str, int]]
    queues: list[str] | None
    log: Any

    @property
    def concurrency(self) -> int: ...

    def held(self) -> Sized: ...

    def request_stop(self) -> None: ...
