from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (  # noqa: F401 - workflows in more modules
            async_workflows,
            bench_workflows,
            flow_workflows,
            leader_probe,
            observe_workflows,
            promise_workflows,
            retry_workflows,
            sqlite_workflows,
            timeout_workflows,
            wait_workflows,
        )
