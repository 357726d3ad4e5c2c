"""Behind a transaction pooler (PgBouncer in transaction mode): each transaction may run on a
different server connection, so nothing the engine does may rely on a session.

Django's own signal for it is `DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True`
(the setting Django documents for transaction pooling); the engine reads the same one. Then:

- the worker does not `SET idle_in_transaction_session_timeout` on its sessions (the SET would
  land on one server connection and stay there for other clients): set PgBouncer's
  `idle_transaction_timeout`, or `ALTER ROLE ... SET idle_in_transaction_session_timeout`;
- LISTEN, which needs a session, goes to `TASKS_ENGINE["LISTEN_URL"]` (a direct connection to
  PostgreSQL) when it is set; without it workers and relays poll (`POLL_INTERVAL`);
- `PREPARED_STATEMENTS` must be False (PgBouncer before 1.21 keeps no prepared statements);
  `manage.py check` says so (tasks_engine.E020).
NOTIFY itself is sent inside the writer's transaction and works through the pooler."""

from __future__ import annotations

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS


def behind_transaction_pooler() -> bool:
    db = settings.DATABASES.get(DEFAULT_DB_ALIAS, {})
    return db.get("ENGINE") == "django.db.backends.postgresql" and bool(
        db.get("DISABLE_SERVER_SIDE_CURSORS")
    )
