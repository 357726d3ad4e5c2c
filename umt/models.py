"""UMT's business tables: what to acquire (AcquisitionPlan) and what the library holds."""

from __future__ import annotations

from django.db import models


class AcquisitionPlan(models.Model):
    """One thing to acquire. Creating it (`umt.acquisition.plan_acquisition`) publishes an
    outbox event in the same transaction; its route starts the `acquire` workflow."""

    class Client(models.TextChoices):
        FOLDER = "folder", "Folder (something else writes the file)"
        QBITTORRENT = "qbittorrent", "qBittorrent"

    class Status(models.TextChoices):
        PLANNED = "planned"  # created; the workflow has not submitted it yet
        DOWNLOADING = "downloading"  # handed to the download client
        COPYING = "copying"  # download done; copying into the library
        COPIED = "copied"  # the library holds the file (a LibraryItem exists)
        REGISTERED = "registered"  # the item is registered; the source is kept for retention
        DONE = "done"  # the source was cleaned up

    title = models.CharField(max_length=300)
    client = models.CharField(max_length=20, choices=Client.choices, default=Client.FOLDER)
    source = models.CharField(
        max_length=2000,
        help_text="qBittorrent: a magnet link or the path of a .torrent file. "
        "Folder: the file's name in the downloads folder.",
    )
    retention_seconds = models.FloatField(
        null=True, blank=True, help_text="Keep the source this long after copying (default: UMT)."
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PLANNED)
    info_hash = models.CharField(
        max_length=64, blank=True, db_index=True, help_text="BitTorrent v1 info hash (hex)."
    )
    download_ref = models.CharField(max_length=2000, blank=True, help_text="The client's handle.")
    run_id = models.UUIDField(null=True, blank=True, help_text="The acquire workflow run.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"


class LibraryItem(models.Model):
    """A complete, verified file in the library. Written only by the fenced copy commit."""

    plan = models.OneToOneField(AcquisitionPlan, on_delete=models.PROTECT, related_name="item")
    title = models.CharField(max_length=300)
    path = models.CharField(max_length=2000, unique=True)
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    registered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.title
