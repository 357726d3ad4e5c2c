"""Operator actions in Django's admin log: who did what to which object, and why.

Every operator action (cancel, retry, schedule pause/resume, outbox retry) records a
`LogEntry` here, so it shows in the object's history page with the user and the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry


def record(user: Any, objects: Iterable[Any], action: str, reason: str = "") -> None:
    """One admin log entry per object: `action` (for example "Canceled") and the reason."""
    objs = list(objects)
    if not objs or user is None or not getattr(user, "pk", None):
        return
    message = f"{action}: {reason}" if reason else action
    LogEntry.objects.log_actions(
        user_id=user.pk, queryset=objs, action_flag=CHANGE, change_message=message
    )
