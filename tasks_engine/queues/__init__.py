"""Queues at runtime (docs/reference/...): paused and resumed, their limits overridden,
fleet-wide. `state` is what workers read (the claim's paused filter, the limits in effect);
`control` is what operators call (the API, `manage.py tasks queue(s)`, the admin)."""

from .control import (
    QueueView,
    check_queue_name,
    list_queues,
    pause_queue,
    resume_queue,
    set_queue_limits,
)

__all__ = [
    "QueueView",
    "check_queue_name",
    "list_queues",
    "pause_queue",
    "resume_queue",
    "set_queue_limits",
]
