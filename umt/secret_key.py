"""The deployment's SECRET_KEY: from the environment, or made once and kept in a private file.

There is no constant default: a key that anyone can read in the repository lets them sign
session cookies, password-reset tokens and messages for every deployment that kept it. With
no `SECRET_KEY` in the environment, the first start writes a random key to a file readable
only by its owner (beside the SQLite database, or at `UMT_SECRET_KEY_FILE`), and every later
start (and every other process on the host) reads the same one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

# What the project shipped as its default until this module existed: refused outright, so a
# deployment that set it on purpose (copied from an old README) cannot keep a public key.
WELL_KNOWN = frozenset({"umt-dev-only-not-secret"})
MIN_LENGTH = 32


def load(environ_value: str | None, key_file: Path) -> str:
    if environ_value:
        return _checked(environ_value, "the SECRET_KEY environment variable")
    return _read_or_create(key_file)


def _checked(key: str, where: str) -> str:
    key = key.strip()
    if key in WELL_KNOWN:
        raise ImproperlyConfigured(
            f"{where} holds the key published in UMT's repository; anyone could forge sessions"
            " with it. Unset it (a private key is then generated) or set a new random one."
        )
    if len(key) < MIN_LENGTH:
        raise ImproperlyConfigured(
            f"{where} is {len(key)} characters long; use at least {MIN_LENGTH} random ones"
        )
    return key


def _read_or_create(path: Path) -> str:
    if not path.exists():
        _create(path)
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ImproperlyConfigured(
            f"{path} (the secret key) is readable by other users (mode {stat.filemode(mode)});"
            f" run: chmod 600 {path}"
        )
    return _checked(path.read_text(encoding="ascii"), str(path))


def _create(path: Path) -> None:
    """Write a new key so that no process ever reads a partial file: into a private temporary
    file first, then linked into place, which fails if another process got there first (its
    key is then the one everybody uses)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_urlsafe(50) + "\n")
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
