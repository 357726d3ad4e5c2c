from django.apps import AppConfig


class UmtConfig(AppConfig):
    name = "umt"
    verbose_name = "UMT"
