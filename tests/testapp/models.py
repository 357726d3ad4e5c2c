from django.db import models


class SideEffect(models.Model):
    """One row per execution of a step body: tests count these to prove exactly-once."""

    key = models.CharField(max_length=200)
    run_id = models.UUIDField(null=True)
    worker = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.key


class Marker(models.Model):
    """A business row written with a checkpoint (atomic steps, fenced commits)."""

    key = models.CharField(max_length=200, unique=True)
    value = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return self.key
