"""What a secret looks like, and how it is masked: in log events (observe/logs.py), in
stored errors and progress (serialization.encode_error) and on the operator's pages.
`redact_text` is for free text such as error messages and tracebacks; `mask_secrets` for any
value (mappings by their keys, then every string inside); `redact_secrets`, the structlog
processor in observe/logs.py, applies `redact_mapping` to every event.

Secret-looking keys. A key is split into word parts on `_`, `-`, `.`, spaces and camelCase
(`X-Api-Key` -> x, api, key; `accessToken` -> access, token) and is secret when

- a part is one of `SECRET_WORDS` (password, passwd, pass, passphrase, pwd, secret, token,
  auth, authorization, cookie, credential(s), session id, signature, sig, jwt, csrf, and the
  passkey/authkey of torrent trackers' URLs, ...). Whole parts only, so `passed`, `bypass`,
  `compass`, `tokenizer_name`, `author` and `step` are not secret, while `password_hint`,
  `db_pass` and `auth_method` are: one secret part is enough, whatever the others say;
- a part ends with a secret word run together (`SECRET_SUFFIXES`: `dbpassword`,
  `clientsecret`, `accesstoken`, `xapikey`), or starts with password/passwd/passphrase;
- two adjacent parts form a secret pair (`SECRET_PAIRS`: api key, private key, access key,
  session id, ...), or the whole key is `session`. A bare `key` is not secret (idempotency and
  op keys are logged), nor is a plural `tokens` (a count, as in `max_tokens`), nor `dsn` or
  `database_url`: their passwords are redacted by the URL rule below, keeping host and name.

The value of a secret key is replaced by `[redacted]` whatever its type (a nested dict or list
included), except `None`, which says "not set" and is kept. Under an authorization key a
string keeps its scheme: `{"Authorization": "Bearer abc"}` -> `"Bearer [redacted]"`.

Strings (every string value and mapping key, nested ones included, and `redact_text`):

- credentials in URLs: `scheme://user:password@host` -> `scheme://user:[redacted]@host`
  (the user is kept; a URL with a user and no password is left alone; a password pasted
  unencoded, holding `@`, `/`, `?` or `#`, is redacted whole);
- `name=value` and `name: value` pairs (also quoted, as in `"name": "value"` or a dict's repr)
  whose name is a secret-looking key: the value becomes `[redacted]`. In a query string
  (`?` or `&` before the name) a bare `key` also counts (`?key=<Google API key>`);
- `Authorization: Bearer abc`, `authorization=Basic abc`, `"Authorization": "Bearer abc"`:
  the scheme is kept, the credentials redacted (credentials given as parameters, as
  `Digest username="u", response="..."`, all of them to the line's end); a `Cookie:`
  header's value to the line's end;
- a tracker's passkey in an announce URL's path: the segment right before `announce` or
  `scrape`, or right after `announce/`, whatever its length; a magnet's percent-encoded `tr=`
  (`ws=`, `as=`, `xs=`) is decoded and checked by every rule here (docs/logging.md);
- a bare `Bearer <token>` anywhere, anything shaped like a JWT (`eyJ...`.`eyJ...`.`...`), and
  a PEM private key (`-----BEGIN ... PRIVATE KEY-----` to its END line) whole.

Every string first passes a cheap pre-check (one compiled search for hints such as `pass`,
`token`, `key`, `auth` or `://`); only strings that contain a hint run the rules above.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

REDACTED = "[redacted]"

SECRET_WORDS = frozenset(
    {
        "password",
        "passwords",
        "passwd",
        "pass",
        "passphrase",
        "passkey",
        "authkey",
        "pwd",
        "secret",
        "secrets",
        "token",
        "apikey",
        "auth",
        "oauth",
        "authorization",
        "authorisation",
        "cookie",
        "cookies",
        "sessionid",
        "sessid",
        "credential",
        "credentials",
        "creds",
        "signature",
        "sig",
        "jwt",
        "bearer",
        "csrf",
        "xsrf",
        "privkey",
        "privatekey",
        "secretkey",
        "accesskey",
    }
)
SECRET_SUFFIXES = (
    "password",
    "passwd",
    "passphrase",
    "passkey",
    "authkey",
    "secret",
    "token",
    "apikey",
    "cookie",
)
SECRET_PREFIXES = ("password", "passwd", "passphrase")
SECRET_PAIRS = frozenset(
    {
        ("api", "key"),
        ("private", "key"),
        ("priv", "key"),
        ("access", "key"),
        ("signing", "key"),
        ("encryption", "key"),
        ("master", "key"),
        ("session", "id"),
        ("session", "key"),
    }
)
SECRET_WHOLE_KEYS = frozenset({"session"})
# Query parameters: everything above, plus a bare `key` (`?key=...` is how Google and others
# pass API keys). Other parameters are kept: redacting every query value (the old behaviour)
# turned `?page=2&sort=name` into noise that hid what a request was, and hid nothing secret.
SECRET_QUERY_PARAMS = frozenset({"key", "rsskey"})  # rsskey: private trackers
AUTH_WORDS = frozenset({"authorization", "authorisation", "auth"})
AUTH_SCHEMES = (
    r"(?:bearer|basic|digest|token|negotiate|ntlm|hoba|mutual|apikey|jwt|dpop|aws4-hmac-sha256)"
)

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# Every secret name contains one of these (lower case); a string without any of them (the
# common case) is returned as it is after one search of its lower-cased copy (about 10x faster
# than a case-insensitive search of the string itself).
NAME_HINTS = (
    "pass",
    "pwd",
    "secret",
    "token",
    "auth",
    "key",
    "cookie",
    "sess",
    "cred",
    "sig",
    "jwt",
    "csrf",
    "xsrf",
    "bearer",
)
_NAME_HINT = re.compile("|".join(NAME_HINTS))
# `%2f%2f`: a percent-encoded URL (a magnet's `tr=`), whose passkey may sit in its path.
_HINT = re.compile("|".join((*NAME_HINTS, "://", "%2f%2f", "eyj")))
# The password runs to the `@` before the host; one holding `/`, `?` or `#` (pasted unencoded)
# too, unless what follows the colon is a port (digits, then the path, query or fragment). A user
# holds no `[`: `http://[::1]:8080/a@b` has no credentials.
_URL_CREDENTIALS = re.compile(
    r"(?i)\b(?P<head>[a-z][a-z0-9+.\-]*://[^\s:/?#@\[\]\"'<>]*:)"
    r"(?P<password>[^\s/?#\"'<>]*|(?!\d*[/?#])[^\s\"'<>]*)@"
)
# A name followed by `=` or `:` (not `==`, `://` or `::`), perhaps quoted: `"name": `. Leading
# dashes belong to the name: `--password=x` on a command line.
_NAME_SEP = re.compile(r"""(?P<name>[\w.\-]+)["']?[ \t]*(?:=(?!=)|:(?![:/]))[ \t]*""")
# A quoted value: up to its closing quote (or the line's end), backslash escapes included.
_QUOTED = r"""(?P<q>["'])(?P<qsecret>(?:\\.|(?!(?P=q))[^\n\\])*)"""
_VALUE = re.compile(rf"""{_QUOTED}|(?P<secret>[^\s&#,;"'<>]+)""")
_AUTH_VALUE = re.compile(
    rf"""(?P<q>["'])(?:{AUTH_SCHEMES}[ \t]+)?(?P<qsecret>(?:\\.|(?!(?P=q))[^\n\\])*)
       |(?:{AUTH_SCHEMES}[ \t]+(?=[^\s"']))?(?P<secret>[^\s&#,;"'<>]+)""",
    re.I | re.X,
)
# Credentials as a list of auth-params after the scheme (`Digest username="u", response="…"`,
# `AWS4-HMAC-SHA256 Credential=…, Signature=…`): all of them, to the line's end.
_AUTH_PARAMS = re.compile(
    rf"(?i){AUTH_SCHEMES}[ \t]+(?=[\w\-]+[ \t]*=(?!=)[^\s=])(?P<secret>[^\r\n]+)"
)
_HEADER_LINE_VALUE = re.compile(rf"""{_QUOTED}|(?P<secret>[^\r\n"']+)""")
_SCHEME_PREFIX = re.compile(rf"(?i){AUTH_SCHEMES}[ \t]+(?=\S)")
_BARE_BEARER = re.compile(
    r"(?i)\b(?P<head>bearer[ \t]+)"
    r"(?!(?:token|tokens|auth|authentication|authorization|header|scheme|realm)\b)"
    r"(?P<secret>[A-Za-z0-9\-._~+/]+=*)"
)
# A PEM private key, from its BEGIN line to its END line (or the text's end, when cut).
_PEM_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S
)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_\-]{4,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*")


@functools.lru_cache(maxsize=4096)
def _key_parts(key: str) -> tuple[str, ...]:
    return tuple(part.lower() for part in _WORD.findall(key))


@functools.lru_cache(maxsize=4096)
def is_secret_key(key: str) -> bool:
    """Whether values under `key` are secret (see the module docstring for the rule)."""
    parts = _key_parts(key)
    if not parts:
        return False
    if "".join(parts) in SECRET_WHOLE_KEYS:
        return True
    for i, part in enumerate(parts):
        if (
            part in SECRET_WORDS
            or part.endswith(SECRET_SUFFIXES)
            or part.startswith(SECRET_PREFIXES)
            or (i and (parts[i - 1], part) in SECRET_PAIRS)
        ):
            return True
    return False


def _is_auth_key(key: str) -> bool:
    return any(part in AUTH_WORDS for part in _key_parts(key))


def _is_cookie_key(key: str) -> bool:
    return any(part in ("cookie", "cookies") for part in _key_parts(key))


def redact_text(text: str) -> str:
    """`text` with URL credentials, secret `name=value` pairs and bearer tokens redacted.

    Returns `text` itself (the same object) when there is nothing to redact.
    """
    if len(text) < 4:
        return text
    low = text.lower()
    if _HINT.search(low) is None:
        return text
    out = text
    if "PRIVATE KEY-----" in out:  # first: the pairs below would take its first word only
        out = _PEM_PRIVATE_KEY.sub(REDACTED, out)
        if out is not text:
            low = out.lower()
    if "://" in out:
        previous = out
        out = _URL_CREDENTIALS.sub(_url_credentials, out)
        if out is not previous:
            low = out.lower()
    if "=" in out or ":" in out:
        out = _redact_pairs(out, low)
    if "bearer" in low:
        out = _BARE_BEARER.sub(_bearer, out)
    if "announce" in low or "scrape" in low:
        out = _TRACKER_PATH_KEY.sub(_tracker_path_key, out)
    if "%3d" in low or "%2f" in low:
        out = _ENCODED_QUERY.sub(_encoded_query, out)
    if "eyJ" in out:
        out = _JWT.sub(REDACTED, out)
    return text if out == text else out


# Private trackers put the user's passkey in the announce URL's path (`/<key>/announce`,
# `/announce/<key>`) or query; a magnet's `tr=` carries the URL percent-encoded. The segment
# next to `announce`/`scrape` is masked whatever its length: passkeys may be short, and a
# public tracker's announce URL has no such segment (`udp://host:1337/announce`).
_SEGMENT = r"[^/\s?#&\"'<>\[\]]+"
_TRACKER_PATH_KEY = re.compile(
    rf"(?i)(?P<before>://[^/\s]+/(?:[^/\s?#]+/)*?){_SEGMENT}"
    r"(?=/(?:announce|scrape)(?:\.php)?(?:[/?#&\s\"'<>]|$))"
    rf"|(?P<after>/(?:announce|scrape)(?:\.php)?/){_SEGMENT}"
)
_ENCODED_QUERY = re.compile(r"(?i)\b(tr|ws|as|xs)=([^&\s\"'<>]+)")


def _tracker_path_key(m: re.Match[str]) -> str:
    return (m["before"] or m["after"]) + REDACTED


def _encoded_query(m: re.Match[str]) -> str:
    """A percent-encoded URL (a magnet's tracker): redacted as its decoded form would be."""
    value = unquote(m.group(2))
    redacted = redact_text(value)
    return m.group(0) if redacted is value else f"{m.group(1)}={quote(redacted, safe=':/[]')}"


def _is_name_char(char: str) -> bool:
    return char.isalnum() or char in "_.-"


def _url_credentials(m: re.Match[str]) -> str:
    if not m["password"]:
        return m[0]
    return f"{m['head']}{REDACTED}@"


def _bearer(m: re.Match[str]) -> str:
    return m["head"] + REDACTED


def _redact_pairs(text: str, low: str) -> str:
    """Redact the value after every secret-looking `name=` / `name:` in `text`.

    Only names around a hint (see `NAME_HINTS`) are looked at: `low` is `text.lower()`.
    """
    if len(low) != len(text):  # lower() changed the length (rare non-ASCII): scan every name
        low = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
    pieces: list[str] = []
    last = pos = 0
    for found in _NAME_HINT.finditer(low):
        hint = found.start()
        if hint < pos:
            continue
        start = hint
        while start > pos and _is_name_char(text[start - 1]):
            start -= 1
        m = _NAME_SEP.match(text, start)
        if m is None:  # no separator after this word: skip the rest of it
            pos = found.end()
            while pos < len(text) and _is_name_char(text[pos]):
                pos += 1
            continue
        pos = m.end()
        name = m["name"]
        in_query = start > 0 and text[start - 1] in "?&;"
        if not (is_secret_key(name) or (in_query and name.lower() in SECRET_QUERY_PARAMS)):
            continue
        is_header_line = not in_query and text[m.end("name") : m.end()].lstrip("\"' \t")[:1] == ":"
        if is_header_line and _is_cookie_key(name):
            pattern = _HEADER_LINE_VALUE
        elif _is_auth_key(name):
            pattern = _AUTH_PARAMS if _AUTH_PARAMS.match(text, pos) else _AUTH_VALUE
        else:
            pattern = _VALUE
        v = pattern.match(text, pos)
        if v is None:
            continue
        group = "qsecret" if v.groupdict().get("q") else "secret"
        secret = v[group]
        if not secret or secret.startswith(REDACTED):
            pos = max(pos, v.end())
            continue
        pieces.append(text[last : v.start(group)])
        pieces.append(REDACTED)
        last = v.end(group)
        pos = max(pos, v.end())
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


def _redact_secret_value(key: str, value: Any) -> Any:
    """The replacement for the value of a secret-looking key."""
    if value is None:
        return None
    if isinstance(value, str) and _is_auth_key(key):
        scheme = _SCHEME_PREFIX.match(value)
        if scheme is not None:
            return scheme[0] + REDACTED
    return REDACTED


def _redact_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return redact_mapping(value)
    kind = type(value)
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        items = [_redact_value(v) for v in value]
        return items if kind is list else kind(items)
    # Renderers print other objects (an exception, a model, a named tuple) by their repr:
    # check that text instead, and keep the object when there is nothing to redact in it.
    text = repr(value)
    redacted = redact_text(text)
    return value if redacted is text else redacted


def redact_mapping(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, value in mapping.items():
        name = key if isinstance(key, str) else str(key)
        # A key is printed too: one holding credentials (a DSN keying a mapping) is redacted.
        out[redact_text(key) if name is key else key] = (
            _redact_secret_value(name, value) if is_secret_key(name) else _redact_value(value)
        )
    return out


def mask_secrets(value: Any) -> Any:
    """`value` (a run's input, output, progress, a step's output, a fact's payload, an op's
    result) as operators may see it: the rules above applied through nested dicts and lists.
    For display only (the admin, `tasks inspect`); the workflow and the API keep the real
    values. Returns `value` itself when there is nothing to mask in a string or a scalar."""
    return _redact_value(value)
