"""A run's timeline as lines of text, printed as it changes (the demo's view of a run)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from tasks_engine import RunView, get_run


@dataclass
class Timeline:
    """Call `poll()` repeatedly; each call writes what changed since the last one."""

    run_id: uuid.UUID
    write: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    _steps: dict[tuple[str, int], str] = field(default_factory=dict)
    _status: str = ""
    _progress: str = ""

    def poll(self) -> RunView:
        view = get_run(self.run_id)
        if view is None:
            raise LookupError(f"run {self.run_id} is gone")
        for s in view.steps:
            if self._steps.get((s.name, s.attempt)) != s.status:
                self._steps[(s.name, s.attempt)] = s.status
                self._line(f"step   {s.name:<16} {s.kind:<9} #{s.attempt} {s.status}")
        state = f"{view.status} ({view.waiting_on})" if view.waiting_on else view.status
        if state != self._status:
            self._status = state
            self._line(f"run    {state}")
        message = (view.progress or {}).get("message") or ""
        if message and message != self._progress and view.status == "running":
            self._progress = message
            self._line(f"       {message}")
        return view

    def note(self, text: str) -> None:
        """A line of the story that is not the run's own (the downloader's part)."""
        self._line(text)

    def _line(self, text: str) -> None:
        self.write(f"  +{time.monotonic() - self.started:5.1f}s  {text}")
