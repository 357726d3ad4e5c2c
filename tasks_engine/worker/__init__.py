"""The worker: a claim loop, slot threads that execute runs, and one heartbeat for all leases."""

from .loop import Worker, WorkerConfig

__all__ = ["Worker", "WorkerConfig"]
