"""An async Django view that starts a run and awaits its end (tests/process/test_async.py,
with Django's AsyncClient)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

import tasks_engine


async def fetch_meta(request: HttpRequest) -> JsonResponse:
    started = await tasks_engine.aenqueue("async_basic", {"pause": 0.05})
    try:
        run = await tasks_engine.await_run(started.run_id, timeout=30)
    except TimeoutError:
        return JsonResponse({"run_id": str(started.run_id), "status": "running"}, status=202)
    return JsonResponse({"run_id": str(run.run_id), "status": run.status, "output": run.output})
