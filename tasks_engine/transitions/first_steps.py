"""What this process has learned of each workflow's first step, so that a claim can start it.

A fresh run (first claim, no history) of most workflows begins with the same function step:
a Django `@task` always (its one step), most workflows too. Once a run of a workflow has
begun with function step `name`, this worker's claims on PostgreSQL insert that step's first
attempt in the claim's own statement (`claim_prestart` in queries/postgresql.sql): the step
start is committed when the slot receives the run (with the claim: a crash of the server may
take both back, worker/loop.py), and the slot skips the start's round trip and its wait for a
commit (`StepBase._start` takes the attempt instead of inserting one).

A guess that turns out wrong (a run that begins with another step, a sleep, a wait, or ends
without any step) deletes the unused attempt before anything else is written for the run, and
the workflow is never guessed again by this process. Nothing is shared between processes: a
wrong guess costs one extra statement, once per workflow and process.
"""

from __future__ import annotations

import json
import threading

_lock = threading.Lock()
_first: dict[str, str] = {}  # "name@version" -> its first step's name
_unpredictable: set[str] = set()
_published: tuple[str, dict[str, str]] = ("{}", {})  # the claim's parameter, and its dict


def key(task: str, version: int) -> str:
    """A workflow's key in the guesses (and in the claim's JSON parameter)."""
    return f"{task}@{version}"


def guess(task: str, version: int) -> str | None:
    return _first.get(key(task, version))


def published() -> tuple[str, dict[str, str]]:
    """The guesses, as the claim's JSON parameter and as the dict it was made from (one pair:
    a claim reads what it sent). ("{}", {}): none, the claim inserts nothing."""
    return _published


def learn(task: str, version: int, first_step: str | None) -> None:
    """A fresh run of the workflow began with function step `first_step` (None: with anything
    else, which is not guessed)."""
    name = key(task, version)
    if _first.get(name) == first_step or name in _unpredictable:
        return
    with _lock:
        if first_step is None:
            _unpredictable.add(name)
            _first.pop(name, None)
        else:
            _first[name] = first_step
        _publish()


def forget(task: str, version: int) -> None:
    """A guess was wrong: never guess this workflow again in this process."""
    learn(task, version, None)


def reset() -> None:
    """Forget everything (tests)."""
    with _lock:
        _first.clear()
        _unpredictable.clear()
        _publish()


def _publish() -> None:
    global _published
    _published = (json.dumps(_first, sort_keys=True), dict(_first))
