from django.apps import AppConfig


class UmtConfig(AppConfig):
    name = "umt"
    verbose_name = "UMT"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers UMT's system checks)
