"""UMT project settings. Everything that varies by deployment comes from the environment."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import django
import environ
from django.core.exceptions import ImproperlyConfigured

from umt import secret_key

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

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
    "axes",  # admin login throttling (below)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes requires
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
# The engine's tables on a database of their own (docs/DATABASES.md): TASKS_DATABASE_URL names
# it (alias "tasks"); the router sends the engine's models there, the rest stays on "default".
if env.str("TASKS_DATABASE_URL", default=""):
    DATABASES["tasks"] = env.db("TASKS_DATABASE_URL")
DATABASE_ROUTERS = ["tasks_engine.db.routers.EngineRouter"]


def _sqlite_settings(db: dict) -> None:  # type: ignore[type-arg]
    if db["ENGINE"] != "django.db.backends.sqlite3":
        return
    # select_for_update() is a no-op on SQLite: serialise writers with BEGIN IMMEDIATE,
    # let readers run beside the writer (WAL) and wait for the write lock instead of failing.
    # synchronous=FULL syncs the WAL on every commit: a finished step or a `done` ledger entry
    # survives a power loss. NORMAL (SQLITE_SYNCHRONOUS=normal) syncs only at checkpoints:
    # faster, but the last commits can be lost, and their steps run again (docs/SQLITE.md).
    sync = env.str("SQLITE_SYNCHRONOUS", default="full").upper()
    if sync not in ("FULL", "NORMAL"):
        raise ImproperlyConfigured(f"SQLITE_SYNCHRONOUS must be full or normal, not {sync!r}")
    db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": f"PRAGMA journal_mode=WAL; PRAGMA synchronous={sync};",
        }
    )
    # Tests use a file too (test_<name> beside the database), so that worker processes can
    # share the test database.
    name = Path(str(db["NAME"]))
    db.setdefault("TEST", {})["NAME"] = str(name.with_name(f"test_{name.name}"))


for _alias_db in DATABASES.values():
    _sqlite_settings(_alias_db)

# No constant default (umt/secret_key.py): SECRET_KEY from the environment, else a random key
# made on first start and kept, readable by its owner only, beside the SQLite database (or at
# UMT_SECRET_KEY_FILE). Several hosts serving one site need the same SECRET_KEY: set it.
_key_dir = (
    Path(str(_db["NAME"])).parent if _db["ENGINE"] == "django.db.backends.sqlite3" else BASE_DIR
)
SECRET_KEY = secret_key.load(
    env.str("SECRET_KEY", default=""),
    Path(env.str("UMT_SECRET_KEY_FILE", default=str(_key_dir / ".umt_secret_key"))),
)

# Production behind a TLS reverse proxy (docs/PRODUCTION.md): UMT_TLS_PROXY=true trusts the
# proxy's X-Forwarded-Proto, redirects plain HTTP and sends cookies over HTTPS only. HSTS is an
# opt-in (UMT_HSTS_SECONDS), since browsers remember it long after a mistake.
TLS_PROXY = env.bool("UMT_TLS_PROXY", default=False)
if TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("UMT_SSL_REDIRECT", default=TLS_PROXY)
SESSION_COOKIE_SECURE = env.bool("UMT_SECURE_COOKIES", default=TLS_PROXY)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env.int("UMT_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("UMT_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("UMT_HSTS_PRELOAD", default=False)
# Joining the browsers' preload list is a deliberate act for a whole registrable domain, not a
# setting of one host: check --deploy does not ask for it here (UMT_HSTS_PRELOAD opts in).
SILENCED_SYSTEM_CHECKS = ["security.W021"]
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# Admin login throttling (django-axes): after UMT_LOGIN_FAILURE_LIMIT failed logins for one
# username from one address, that pair is locked out for UMT_LOGIN_LOCKOUT_HOURS (an attacker
# cannot lock the owner out from elsewhere). Unlock early: manage.py axes_reset_username NAME.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("UMT_LOGIN_FAILURE_LIMIT", default=5)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_COOLOFF_TIME = timedelta(hours=env.float("UMT_LOGIN_LOCKOUT_HOURS", default=1.0))
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False  # no banner on every manage.py command
if TLS_PROXY:
    # The client's address as the proxy saw it (the proxy appends it to X-Forwarded-For);
    # without a proxy only REMOTE_ADDR counts, so a client cannot pick its own address.
    AXES_IPWARE_META_PRECEDENCE_ORDER = ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR")
    AXES_IPWARE_PROXY_COUNT = env.int("UMT_PROXY_COUNT", default=1)
    AXES_IPWARE_PROXY_ORDER = "right-most"

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
    # SQLite: an atomic step holding the only write lock longer is rolled back (0: no bound).
    "SQLITE_ATOMIC_STEP_SECONDS": env.float("TASKS_SQLITE_ATOMIC_STEP_SECONDS", default=5.0),
}
if "tasks" in DATABASES:
    TASKS_ENGINE["DATABASE"] = "tasks"
_engine_db = DATABASES[str(TASKS_ENGINE.get("DATABASE", "default"))]
if _engine_db["ENGINE"] == "django.db.backends.postgresql":
    # PostgreSQL-only settings (manage.py check warns about them on SQLite, which ignores them).
    TASKS_ENGINE |= {
        "NOTIFY": env.bool("TASKS_NOTIFY", default=True),
        "PREPARED_STATEMENTS": env.bool("TASKS_PREPARED_STATEMENTS", default=True),
        "GROUP_COMMIT": env.bool("TASKS_GROUP_COMMIT", default=True),
    }
    # Behind PgBouncer in transaction mode (docs/operations/poolers.md): Django's own switch
    # for transaction pooling, no prepared statements, LISTEN on a direct URL (or polling).
    if env.bool("DATABASE_TRANSACTION_POOLER", default=False):
        _engine_db["DISABLE_SERVER_SIDE_CURSORS"] = True
        TASKS_ENGINE["PREPARED_STATEMENTS"] = env.bool("TASKS_PREPARED_STATEMENTS", default=False)
    if env.str("TASKS_LISTEN_URL", default=""):
        TASKS_ENGINE["LISTEN_URL"] = env.str("TASKS_LISTEN_URL")

OUTBOX = {
    "MAX_ATTEMPTS": 10,
    "BACKOFF_BASE_SECONDS": 1.0,
    "BACKOFF_MAX_SECONDS": 300,
    "CLAIM_SECONDS": env.float("OUTBOX_CLAIM_SECONDS", default=60),
}

if django.VERSION >= (6, 0):  # Django's tasks framework (django.tasks) is new in 6.0
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
    "CLEANUP_RETRY_SECONDS": env.float("UMT_CLEANUP_RETRY_SECONDS", default=60.0),
    "CLEANUP_RETRY_MAX_SECONDS": env.float("UMT_CLEANUP_RETRY_MAX_SECONDS", default=6 * 3600),
    "CLEANUP_ATTEMPTS": env.int("UMT_CLEANUP_ATTEMPTS", default=60),
    "QBITTORRENT": {
        "URL": env.str("UMT_QBITTORRENT_URL", default="http://127.0.0.1:8080"),
        "USERNAME": env.str("UMT_QBITTORRENT_USERNAME", default=""),
        "PASSWORD": env.str("UMT_QBITTORRENT_PASSWORD", default=""),
        "SAVE_PATH": env.str("UMT_QBITTORRENT_SAVE_PATH", default=""),
        "PEERS": env.list("UMT_QBITTORRENT_PEERS", default=[]),
        "LOGIN_ATTEMPTS": env.int("UMT_QBITTORRENT_LOGIN_ATTEMPTS", default=3),
        "LOGIN_BACKOFF_SECONDS": env.float("UMT_QBITTORRENT_LOGIN_BACKOFF_SECONDS", default=60.0),
    },
}
