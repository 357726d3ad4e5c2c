"""The maintenance leader's lease (tasks_engine/leader.py), one candidate at a time, in-process:
election, renewal scoped to the term, resignation, fencing of services by term, and a leader
thread that dies stops its worker."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from tasks_engine.db.sql import db_clock
from tasks_engine.models import LeaderLease
from tasks_engine.observe.logs import get_logger
from tasks_engine.services import leader as leader_mod
from tasks_engine.services import registry
from tasks_engine.services.leader import ROLE, Elector, Leader, current_leader

pytestmark = pytest.mark.django_db(transaction=True)


def expire_lease() -> None:
    """The leader died: its lease ran out (as it does SIGKILL + lease seconds later)."""
    LeaderLease.objects.filter(name=ROLE).update(expires_at=db_clock() - timedelta(seconds=1))


def test_one_candidate_is_elected_and_the_other_is_not() -> None:
    a, b = Elector("a"), Elector("b")
    assert a.refresh() and a.term == 1 and a.leading()
    assert not b.refresh() and b.term is None and not b.leading()
    assert a.refresh() and a.term == 1  # renewed, same term
    lease = current_leader()
    assert lease is not None and (lease.worker_id, lease.term) == ("a", 1)


def test_a_lapsed_lease_goes_to_another_candidate_with_a_new_term() -> None:
    a, b = Elector("a"), Elector("b")
    a.refresh()
    expire_lease()
    assert current_leader() is None
    assert b.refresh() and b.term == 2
    # The old leader's renewal names its own term: it cannot extend b's lease, and b holds it.
    assert not a.refresh() and a.term is None and not a.leading()
    row = LeaderLease.objects.get(name=ROLE)
    assert (row.worker_id, row.term) == ("b", 2)


def test_resigning_hands_over_at_once_and_a_stale_resignation_changes_nothing() -> None:
    a, b = Elector("a"), Elector("b")
    a.refresh()
    a.resign()
    assert current_leader() is None and not a.leading()
    assert b.refresh() and b.term == 2
    stale = Elector("a")
    stale.term = 1  # a's old term, as a leader that did not notice it lost the lease holds it
    stale.resign()
    lease = current_leader()
    assert lease is not None and (lease.worker_id, lease.term) == ("b", 2)


def test_a_lease_that_ended_this_millisecond_is_not_current() -> None:
    """SQLite compared the stored expiry (microseconds) with Django's Now() (milliseconds) as
    text, so a lease resigned in the same millisecond as the read still looked held: the
    resignation test above failed at random. Each round resigns and reads at once."""
    a = Elector("a")
    for _ in range(200):
        assert a.refresh()
        a.resign()
        lease = current_leader()
        assert lease is None, f"a lease that ended at {lease.expires_at} is still current"


class FakeWorker:
    def __init__(self, worker_id: str) -> None:
        self.id = worker_id
        self.log = get_logger(worker_id=worker_id)
        self.stopped = threading.Event()

    def request_stop(self) -> None:
        self.stopped.set()


@pytest.fixture
def only_services(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Replace the registry with the services a test registers."""
    monkeypatch.setattr(registry, "_SERVICES", {})
    return registry.register


def test_the_leader_runs_each_service_and_one_that_raises_is_retried(only_services: Any) -> None:
    calls: list[str] = []

    def broken() -> None:
        calls.append("broken")
        raise RuntimeError("boom")

    only_services("broken", broken, every=0.001)
    only_services("fine", lambda: calls.append("fine"), every=3600)
    leader = Leader(FakeWorker("a"))  # type: ignore[arg-type]
    leader.round()
    assert calls == ["broken", "fine"]  # the failure did not stop the next service
    leader._due["broken"] = 0.0
    leader.round()
    assert calls == ["broken", "fine", "broken"]  # retried next round; "fine" is not due yet


def test_a_leader_that_lost_its_term_runs_no_service(only_services: Any) -> None:
    calls: list[str] = []
    only_services("s", lambda: calls.append("s"), every=0.001)
    leader = Leader(FakeWorker("a"))  # type: ignore[arg-type]
    leader.round()
    assert calls == ["s"]
    expire_lease()
    assert Elector("b").refresh()  # b is elected meanwhile
    leader._due["s"] = 0.0
    leader.elector._next = 0.0  # its next renewal is due: it finds the term gone
    leader.round()
    assert calls == ["s"] and leader.elector.term is None


def test_a_leader_whose_trust_lapsed_starts_no_service_before_it_renews(
    only_services: Any,
) -> None:
    calls: list[str] = []
    only_services("s", lambda: calls.append("s"), every=0.001)
    leader = Leader(FakeWorker("a"))  # type: ignore[arg-type]
    leader.round()
    leader.elector.trusted_until = 0.0  # e.g. it stalled past its lease minus the margin
    leader._due["s"] = 0.0
    leader.run_due_services()
    assert calls == ["s"]


def test_a_dead_leader_thread_stops_the_worker(
    only_services: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_registry() -> list[registry.Service]:
        raise RuntimeError("leader bug")

    monkeypatch.setattr(leader_mod.registry, "registered", broken_registry)
    worker = FakeWorker("a")
    leader = Leader(worker)  # type: ignore[arg-type]
    leader.start()
    assert worker.stopped.wait(30)
    leader.join(30)
    assert not leader.is_alive()
    assert current_leader() is None  # it resigned on its way out
