"""UMT's own workflows. `hello` is the smallest example; `acquire` comes with its models."""

from __future__ import annotations

import time
from datetime import timedelta

from pydantic import BaseModel

from tasks_engine import RetryPolicy, TaskContext, workflow


class IngestInput(BaseModel):
    title: str
    size_mb: int = 10
    retention_seconds: float = 1.0


@workflow(name="ingest_demo", version=1, input=IngestInput, queue="default",
          step_retry=RetryPolicy(max_attempts=3, initial_interval=0.5))
def ingest_demo(ctx: TaskContext) -> dict:
    """A small pipeline for the demo: prepare, "copy" in chunks with progress, sleep, clean up."""
    inp: IngestInput = ctx.input
    plan = ctx.step.run("prepare", lambda: {"title": inp.title, "chunks": 5})

    def copy() -> dict:
        for i in range(plan["chunks"]):
            ctx.raise_if_canceled()
            time.sleep(0.05)
            ctx.progress(i + 1, plan["chunks"], f"copied {i + 1}/{plan['chunks']} chunks")
        return {"bytes": inp.size_mb * 1024 * 1024}

    copied = ctx.step.run("copy-file", copy)
    ctx.step.sleep("retention", timedelta(seconds=inp.retention_seconds))
    ctx.step.run("cleanup", lambda: {"removed": True})
    ctx.logger.info("ingested", title=inp.title)
    return {"title": inp.title, "bytes": copied["bytes"]}
