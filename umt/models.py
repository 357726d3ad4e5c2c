"""UMT's business tables: what to acquire (AcquisitionPlan) and what the library holds."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

MAX_RETENTION_SECONDS = 100 * 365 * 24 * 3600  # a timedelta holds far more; no plan needs more


class AcquisitionPlan(models.Model):
    """One thing to acquire. Creating it (`umt.acquisition.plan_acquisition`) publishes an
    outbox event in the same transaction; its route starts the `acquire` workflow."""

    class Client(models.TextChoices):
        FOLDER = "folder", "Folder (something else writes the file)"
        QBITTORRENT = "qbittorrent", "qBittorrent"

    class Status(models.TextChoices):
        PLANNED = "planned"  # created; the workflow has not submitted it yet
        DOWNLOADING = "downloading"  # handed to the download client
        PAUSED = "paused"  # the client holds the unfinished download paused (the user paused it)
        COPYING = "copying"  # download done; copying into the library
        COPIED = "copied"  # the library holds the file (a LibraryItem exists)
        REGISTERED = "registered"  # the item is registered; the source is kept for retention
        DONE = "done"  # the source was cleaned up
        FAILED = "failed"  # the run failed (`failure` says why and whether the download is kept)

    title = models.CharField(max_length=300)
    client = models.CharField(max_length=20, choices=Client.choices, default=Client.FOLDER)
    source = models.CharField(
        max_length=2000,
        help_text="qBittorrent: a magnet link or the path of a .torrent file. "
        "Folder: the file's name in the downloads folder.",
    )
    retention_seconds = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(MAX_RETENTION_SECONDS)],
        help_text="Keep the source this long after copying (default: UMT).",
    )
    files = models.CharField(
        max_length=500,
        blank=True,
        help_text="Which files of a multi-file download to take: comma-separated glob patterns "
        "(empty: every video file).",
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PLANNED)
    failure = models.TextField(blank=True, help_text="Why the run failed (secrets redacted).")
    info_hash = models.CharField(
        max_length=64,
        blank=True,
        db_index=True,
        help_text="qBittorrent's torrent id: the v1 info hash, or the truncated v2 hash.",
    )
    download_hashes = models.CharField(
        max_length=300, blank=True, help_text="Every hash form the client may list it under."
    )
    download_ref = models.CharField(max_length=2000, blank=True, help_text="The client's handle.")
    download_dir = models.CharField(
        max_length=2000,
        blank=True,
        help_text="The folder UMT chose for this plan's download (it did not exist before): "
        "cleanup deletes only files of a torrent UMT added there.",
    )
    retries = models.PositiveIntegerField(
        default=0, help_text="How often the failed plan was retried (its run's fresh passes)."
    )
    run_id = models.UUIDField(null=True, blank=True, help_text="The acquire workflow run.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"


class LibraryItem(models.Model):
    """A complete, verified file in the library (one per file a plan takes). Written only by the
    fenced copy commit."""

    plan = models.ForeignKey(AcquisitionPlan, on_delete=models.PROTECT, related_name="items")
    title = models.CharField(max_length=300)
    path = models.CharField(max_length=2000, unique=True)
    size = models.BigIntegerField()
    hash_algorithm = models.CharField(
        max_length=20, help_text="What made content_hash: xxh3_128 (sha256 for older copies)."
    )
    content_hash = models.CharField(
        max_length=64, help_text="The file's hash (hex), verified equal to the source's."
    )
    registered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.title


# Plans that still need their download (the files must not be deleted under them).
ACTIVE_STATUSES = (
    AcquisitionPlan.Status.PLANNED,
    AcquisitionPlan.Status.DOWNLOADING,
    AcquisitionPlan.Status.PAUSED,
    AcquisitionPlan.Status.COPYING,
    AcquisitionPlan.Status.COPIED,
    AcquisitionPlan.Status.REGISTERED,
)


class ClientLogin(models.Model):
    """UMT's failed logins at a download client (one row per client address), shared by every
    worker: qBittorrent bans an address after a few failed logins (5 by default), so UMT backs
    off after each and stops short of that (`umt.downloads.logins`). New credentials in UMT's
    settings (another `credentials` fingerprint) start the count afresh."""

    client_url = models.CharField(max_length=500, unique=True)
    credentials = models.CharField(
        max_length=64, help_text="A keyed hash of the username and password (never the password)."
    )
    failures = models.PositiveIntegerField(default=0, help_text="Failed logins in a row.")
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text="No login is tried before this."
    )
    last_error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.client_url}: {self.failures} failed login(s)"
