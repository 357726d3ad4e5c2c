"""UMT project settings. Everything that varies by deployment comes from the environment."""

from __future__ import annotations

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = env.str("SECRET_KEY", default="umt-dev-only-not-secret")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "tasks_engine",
    "outbox",
    "umt",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "umt.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "umt.wsgi.application"

# Zero-setup default: an SQLite file next to manage.py. PostgreSQL for production.
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # select_for_update() is a no-op on SQLite: serialise writers with BEGIN IMMEDIATE,
    # let readers run beside the writer (WAL) and wait for the write lock instead of failing.
    # synchronous=FULL syncs the WAL on every commit: a finished step or a `done` ledger entry
    # survives a power loss. NORMAL (SQLITE_SYNCHRONOUS=normal) syncs only at checkpoints:
    # faster, but the last commits can be lost, and their steps run again (docs/SQLITE.md).
    _sync = env.str("SQLITE_SYNCHRONOUS", default="full").upper()
    if _sync not in ("FULL", "NORMAL"):
        raise ImproperlyConfigured(f"SQLITE_SYNCHRONOUS must be full or normal, not {_sync!r}")
    _db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": f"PRAGMA journal_mode=WAL; PRAGMA synchronous={_sync};",
        }
    )
    # Tests use a file too (test_<name> beside the database), so that worker processes can
    # share the test database.
    _name = Path(str(_db["NAME"]))
    _db.setdefault("TEST", {})["NAME"] = str(_name.with_name(f"test_{_name.name}"))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

TASKS_ENGINE = {
    "LEASE_SECONDS": env.float("TASKS_LEASE_SECONDS", default=30),
    "HEARTBEAT_SECONDS": None,
    "POLL_INTERVAL": env.float("TASKS_POLL_INTERVAL", default=1.0),
    "MAX_STEP_ATTEMPTS_PER_RUN": 1000,
    "NOTIFY": env.bool("TASKS_NOTIFY", default=True),
    "PREPARED_STATEMENTS": env.bool("TASKS_PREPARED_STATEMENTS", default=True),
    "GROUP_COMMIT": env.bool("TASKS_GROUP_COMMIT", default=True),
    # SQLite: an atomic step holding the only write lock longer is rolled back (0: no bound).
    "SQLITE_ATOMIC_STEP_SECONDS": env.float("TASKS_SQLITE_ATOMIC_STEP_SECONDS", default=5.0),
}

OUTBOX = {
    "MAX_ATTEMPTS": 10,
    "BACKOFF_BASE_SECONDS": 1.0,
    "BACKOFF_MAX_SECONDS": 300,
    "CLAIM_SECONDS": env.float("OUTBOX_CLAIM_SECONDS", default=60),
}

TASKS = {"default": {"BACKEND": "tasks_engine.backends.DurableBackend"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# UMT's acquisition (umt/conf.py has the defaults and what each one means).
UMT = {
    "LIBRARY_DIR": env.str("UMT_LIBRARY_DIR", default=str(BASE_DIR / "media" / "library")),
    "DOWNLOADS_DIR": env.str("UMT_DOWNLOADS_DIR", default=str(BASE_DIR / "media" / "downloads")),
    "RETENTION_SECONDS": env.float("UMT_RETENTION_SECONDS", default=7 * 24 * 3600),
    "DOWNLOAD_TIMEOUT_SECONDS": env.float("UMT_DOWNLOAD_TIMEOUT_SECONDS", default=14 * 24 * 3600),
    "DOWNLOAD_CHECK_SECONDS": env.float("UMT_DOWNLOAD_CHECK_SECONDS", default=600),
    "COPY_CHUNK_BYTES": env.int("UMT_COPY_CHUNK_BYTES", default=8 * 1024 * 1024),
    "COPY_RATE_LIMIT": env.float("UMT_COPY_RATE_LIMIT", default=0),  # bytes/s, 0: unlimited
    "PRESENCE_CHECK_SECONDS": env.float("UMT_PRESENCE_CHECK_SECONDS", default=600),
    "RETRY_INITIAL_SECONDS": env.float("UMT_RETRY_INITIAL_SECONDS", default=1.0),
    "RETRY_MAX_SECONDS": env.float("UMT_RETRY_MAX_SECONDS", default=60.0),
    "QBITTORRENT": {
        "URL": env.str("UMT_QBITTORRENT_URL", default="http://127.0.0.1:8080"),
        "USERNAME": env.str("UMT_QBITTORRENT_USERNAME", default=""),
        "PASSWORD": env.str("UMT_QBITTORRENT_PASSWORD", default=""),
        "SAVE_PATH": env.str("UMT_QBITTORRENT_SAVE_PATH", default=""),
        "PEERS": env.list("UMT_QBITTORRENT_PEERS", default=[]),
    },
}
