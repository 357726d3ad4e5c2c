"""Secrets never reach logs or stored errors (DESIGN.md, "Execution rules").

Log lines come from the real configuration (`tasks_engine.observe.logs.configure`) writing to a
captured stderr, so every processor (exception formatting, redaction, the renderer) runs.
"""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

import tasks_engine
from tasks_engine import RetryPolicy, TaskContext, workflow
from tasks_engine.definitions import registry
from tasks_engine.models import WorkflowRun
from tasks_engine.observe import logs
from tasks_engine.observe.logs import get_logger, redact_secrets
from tasks_engine.values import secrets
from tasks_engine.values.secrets import REDACTED, redact_text
from tasks_engine.values.serialization import encode_error
from tests.browser.rundata import make_run
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.one_db("log records and their redaction")


class Capture:
    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text.splitlines() if line.strip()]

    def last(self) -> dict[str, Any]:
        return self.lines()[-1]


@pytest.fixture(autouse=True)
def _engine_handler_removed() -> Iterator[None]:
    """`logs.configure(force=True)` adds the engine's stderr handler on the test's stream: gone
    after the test, so that later tests do not log into a closed buffer."""
    yield
    engine = logging.getLogger(logs.LOGGER_NAME)
    for handler in [h for h in engine.handlers if isinstance(h, logs.StderrHandler)]:
        engine.removeHandler(handler)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Capture]:
    """The project's structlog configuration, writing JSON lines to a buffer for stderr."""
    saved = structlog.get_config()
    stream = io.StringIO()  # not a terminal: the JSON renderer, as in production
    monkeypatch.setattr(sys, "stderr", stream)
    logs.configure(force=True)
    yield Capture(stream)
    structlog.configure(**saved)


def assert_absent(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text, f"{secret!r} leaked into {text!r}"


# -- URLs -------------------------------------------------------------------------------------


def test_url_credentials_are_redacted_keeping_user_and_host(captured: Capture) -> None:
    log = get_logger(component="test")
    log.info(
        "connecting to postgres://app:pg-S3cret@db.internal:5432/umt",
        database_url="postgresql+psycopg://umt:db-hunter2@10.0.0.5/umt?sslmode=require",
        cache="redis://:redis-pw-42@cache:6379/0",
        dsn="https://bob:tr0ub4dor@api.example/v1",
        anonymous="postgres://postgres@127.0.0.1:5432/umt",
    )
    line = captured.last()
    assert_absent(captured.text, "pg-S3cret", "db-hunter2", "redis-pw-42", "tr0ub4dor")
    assert line["event"] == f"connecting to postgres://app:{REDACTED}@db.internal:5432/umt"
    assert line["database_url"] == (
        f"postgresql+psycopg://umt:{REDACTED}@10.0.0.5/umt?sslmode=require"
    )
    assert line["cache"] == f"redis://:{REDACTED}@cache:6379/0"
    assert line["dsn"] == f"https://bob:{REDACTED}@api.example/v1"
    assert line["anonymous"] == "postgres://postgres@127.0.0.1:5432/umt"  # no password: kept


def test_password_with_an_at_sign_is_redacted_whole(captured: Capture) -> None:
    get_logger().info("retry", url="https://alice:p@ss@word@host.example/x")
    assert captured.last()["url"] == f"https://alice:{REDACTED}@host.example/x"
    assert_absent(captured.text, "p@ss", "ss@word")


def test_password_with_a_slash_hash_or_question_mark_is_redacted_whole(
    captured: Capture,
) -> None:
    """A password pasted into a URL unencoded (a generated one often holds `/`, `+`): it was
    kept whole, since the password stopped at the first `/`, `?` or `#` and then met no `@`
    (an outside audit). A port is still a port."""
    get_logger().info(
        "connect failed",
        slash="postgresql://umt:Zm9v/YmFy+cQ==@db.internal:5432/umt",
        hash="postgres://app:s#cret-hash@db/x",
        query="postgres://app:s?cret-query@db/x",
        port="http://127.0.0.1:8080/users/@alice",
        bare="https://example.com:443/?q=a@b",
        ipv6="http://[::1]:8080/users/@alice",
        ipv6_pw="postgres://app:v6/pw@[::1]:5432/x",
    )
    line = captured.last()
    assert_absent(captured.text, "YmFy", "cret-hash", "cret-query", "v6/pw")
    assert line["slash"] == f"postgresql://umt:{REDACTED}@db.internal:5432/umt"
    assert line["hash"] == f"postgres://app:{REDACTED}@db/x"
    assert line["query"] == f"postgres://app:{REDACTED}@db/x"
    assert line["port"] == "http://127.0.0.1:8080/users/@alice"
    assert line["bare"] == "https://example.com:443/?q=a@b"
    assert line["ipv6"] == "http://[::1]:8080/users/@alice"
    assert line["ipv6_pw"] == f"postgres://app:{REDACTED}@[::1]:5432/x"


def test_secret_query_parameters_are_redacted_and_others_kept(captured: Capture) -> None:
    get_logger().info(
        "fetched",
        url=(
            "https://api.example/items?page=2&access_token=tok-AAA&sort=name"
            "&api_key=key-BBB&signature=sig-CCC&client_secret=cs-DDD#top"
        ),
        maps="https://maps.example/geo?key=AIzaSyXYZ&q=paris",
        form="grant_type=password&password=pw-EEE&username=alice",
        s3="https://bucket.s3/obj?X-Amz-Credential=AKIA123&X-Amz-Signature=abcdef&X-Amz-Expires=60",
    )
    line = captured.last()
    assert_absent(captured.text, "tok-AAA", "key-BBB", "sig-CCC", "cs-DDD", "AIzaSyXYZ", "pw-EEE")
    assert_absent(captured.text, "AKIA123", "abcdef")
    assert line["url"] == (
        f"https://api.example/items?page=2&access_token={REDACTED}&sort=name"
        f"&api_key={REDACTED}&signature={REDACTED}&client_secret={REDACTED}#top"
    )
    assert line["maps"] == f"https://maps.example/geo?key={REDACTED}&q=paris"
    assert line["form"] == f"grant_type=password&password={REDACTED}&username=alice"
    assert "X-Amz-Expires=60" in line["s3"]


# -- Authorization and bearer tokens ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abc", f"Authorization: Bearer {REDACTED}"),
        ("authorization=Basic dXNlcjpwYXNz", f"authorization=Basic {REDACTED}"),
        (
            'headers {"Authorization": "Bearer abc", "Accept": "application/json"}',
            f'headers {{"Authorization": "Bearer {REDACTED}", "Accept": "application/json"}}',
        ),
        ("{'authorization': 'Token xyz-123'}", f"{{'authorization': 'Token {REDACTED}'}}"),
        ("Proxy-Authorization: Basic Zm9vOmJhcg==", f"Proxy-Authorization: Basic {REDACTED}"),
        (
            'Authorization: Digest username="bob", nonce="n1", response="6629fae4"',
            f"Authorization: Digest {REDACTED}",
        ),
        (
            "authorization=AWS4-HMAC-SHA256 Credential=AKIA/x, Signature=fe5f80f7",
            f"authorization=AWS4-HMAC-SHA256 {REDACTED}",
        ),
        ("Authorization: opaque-value-1", f"Authorization: {REDACTED}"),
        ("HTTP_AUTHORIZATION=Bearer abc def", f"HTTP_AUTHORIZATION=Bearer {REDACTED} def"),
        ("sent Bearer abc123 upstream", f"sent Bearer {REDACTED} upstream"),
        ("X-Api-Key: k-123", f"X-Api-Key: {REDACTED}"),
        ("Cookie: sessionid=s1; csrftoken=c2", f"Cookie: {REDACTED}"),
        ("Set-Cookie: sid=abc; Path=/; HttpOnly", f"Set-Cookie: {REDACTED}"),
    ],
)
def test_authorization_header_values_keep_only_their_scheme(
    captured: Capture, text: str, expected: str
) -> None:
    get_logger().warning(text, request=text)
    line = captured.last()
    assert (line["event"], line["request"]) == (expected, expected)
    assert redact_text(text) == expected


def test_authorization_keys_in_dicts_keep_their_scheme(captured: Capture) -> None:
    get_logger().info(
        "request",
        headers={
            "Authorization": "Bearer abc.def",
            "Accept": "text/html",
            "Cookie": "a=1; b=2",
            "x-api-key": "k-9",
        },
    )
    assert captured.last()["headers"] == {
        "Authorization": f"Bearer {REDACTED}",
        "Accept": "text/html",
        "Cookie": REDACTED,
        "x-api-key": REDACTED,
    }


def test_a_jwt_anywhere_is_redacted(captured: Capture) -> None:
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.sBfOq-LGk1dKnsd0_Fz9s"
    get_logger().info(f"id token {jwt} accepted", note=f"got {jwt}")
    line = captured.last()
    assert_absent(captured.text, jwt, "sBfOq")
    assert line["event"] == f"id token {REDACTED} accepted"


def test_a_pem_private_key_anywhere_is_redacted_whole(captured: Capture) -> None:
    """A private key's body was kept: the `private_key:` pair redacted only `-----BEGIN`, the
    first word of its value (an outside audit)."""
    pem = (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEApem1\nQ2x5pem2==\n"
        "-----END RSA PRIVATE KEY-----"
    )
    get_logger().info("loaded", note=f"private_key: {pem}\nhost: db", other=f"got {pem} ok")
    line = captured.last()
    assert_absent(captured.text, "pem1", "pem2")
    assert line["note"] == f"private_key: {REDACTED}\nhost: db"
    assert line["other"] == f"got {REDACTED} ok"
    truncated = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU"
    assert redact_text(f"key file: {truncated}") == f"key file: {REDACTED}"
    public = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQ\n-----END PUBLIC KEY-----"
    assert redact_text(public) == public


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("manage.py serve --password=cli-pw --user bob", f"--password={REDACTED} --user bob"),
        ("db.password: yaml-pw\nhost: db", f"db.password: {REDACTED}\nhost: db"),
        ("config(secret='q-pw', name='x')", f"config(secret='{REDACTED}', name='x')"),
        ('{"token": "a \\"quoted\\" one", "n": 1}', f'{{"token": "{REDACTED}", "n": 1}}'),
        ("x password='it\\'s quoted' y", f"x password='{REDACTED}' y"),
        ('password="unterminated quoted', f'password="{REDACTED}'),
        ("İstanbul token=ist-tok", f"İstanbul token={REDACTED}"),  # lower() grows "İ"
    ],
)
def test_free_text_pairs_are_redacted(text: str, expected: str) -> None:
    out = redact_text(text)
    assert expected in out
    assert_absent(out, "cli-pw", "yaml-pw", "q-pw", "quoted", "ist-tok")


def test_every_secret_word_passes_the_cheap_pre_check() -> None:
    """The pre-check skips strings without a hint: each secret name must contain one."""
    words = [*secrets.SECRET_WORDS, *secrets.SECRET_SUFFIXES, *secrets.SECRET_PREFIXES]
    words += [a + b for a, b in secrets.SECRET_PAIRS] + [*secrets.SECRET_WHOLE_KEYS]
    words += [*secrets.SECRET_QUERY_PARAMS]
    for word in words:
        assert any(hint in word for hint in secrets.NAME_HINTS), word


def test_prose_about_tokens_is_not_mangled() -> None:
    for text in (
        "missing bearer token",
        "the step passed; bypass the cache",
        "if token == expected:",
        "op_key=noop:1 key=abc step=fetch",
        "see https://docs.example/auth?page=2",
    ):
        assert redact_text(text) is text


# -- keys -------------------------------------------------------------------------------------


SECRET_KEYS = [
    "password",
    "db_password",
    "dbPassword",
    "password_hint",
    "passwd",
    "pass",
    "db_pass",
    "passphrase",
    "pwd",
    "secret",
    "client_secret",
    "clientSecret",
    "token",
    "access_token",
    "refreshToken",
    "api_key",
    "apikey",
    "apiKey",
    "X-Api-Key",
    "auth",
    "Authorization",
    "cookie",
    "Set-Cookie",
    "session",
    "sessionid",
    "session_id",
    "credentials",
    "private_key",
    "signature",
    "jwt",
    "csrftoken",
    "passkey",
    "authkey",
    "torrent_pass",
]
PLAIN_KEYS = [
    "passed",
    "bypass",
    "bypass_cache",
    "compass",
    "passenger",
    "step",
    "task",
    "key",
    "op_key",
    "idempotency_key",
    "tokenizer_name",
    "max_tokens",
    "author",
    "session_timeout",
    "dsn",
    "database_url",
    "run_id",
    "trace_id",
    "error",
]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_looking_keys_are_redacted(captured: Capture, key: str) -> None:
    get_logger().info("configured", **{key: "v4lue-X"})
    assert captured.last()[key] == REDACTED
    assert "v4lue-X" not in captured.text
    assert redact_text(f"configured {key}=v4lue-X") == f"configured {key}={REDACTED}"


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_keys_that_only_look_alike_are_kept(captured: Capture, key: str) -> None:
    get_logger().info("configured", **{key: "v4lue-X"})
    assert captured.last()[key] == "v4lue-X"
    assert redact_text(f"configured {key}=v4lue-X") == f"configured {key}=v4lue-X"


def test_secrets_are_redacted_at_any_depth(captured: Capture) -> None:
    get_logger().info(
        "config",
        settings={
            "database": {"HOST": "db", "PASSWORD": "pw-1", "OPTIONS": {"passfile": None}},
            "clients": [
                {"name": "qbittorrent", "password": "pw-2", "url": "http://admin:pw-3@qb:8080/"},
                ("tuple", {"api_key": "k-4"}, "https://x/?token=t-5"),
            ],
            "step": "fetch",
            "passed": 3,
            "token": {"nested": "whole value hidden"},
            "password_reset": None,  # "not set" is not a secret
        },
    )
    settings = captured.last()["settings"]
    assert_absent(captured.text, "pw-1", "pw-2", "pw-3", "k-4", "t-5", "whole value hidden")
    assert settings["database"] == {
        "HOST": "db",
        "PASSWORD": REDACTED,
        "OPTIONS": {"passfile": None},
    }
    assert settings["clients"][0] == {
        "name": "qbittorrent",
        "password": REDACTED,
        "url": f"http://admin:{REDACTED}@qb:8080/",
    }
    assert settings["clients"][1] == [
        "tuple",
        {"api_key": REDACTED},
        f"https://x/?token={REDACTED}",
    ]
    assert (settings["step"], settings["passed"], settings["token"]) == ("fetch", 3, REDACTED)
    assert settings["password_reset"] is None


def test_credentials_in_a_mapping_s_keys_are_redacted(captured: Capture) -> None:
    """A mapping keyed by URLs (connections per DSN, say): its keys reached the output as
    they were, passwords and all, since only values were redacted (an outside audit)."""
    get_logger().info(
        "pool stats",
        pools={"postgres://app:key-pw@db/umt": 3, "redis://cache:6379/0": 1, "plain": 2},
    )
    assert_absent(captured.text, "key-pw")
    assert captured.last()["pools"] == {
        f"postgres://app:{REDACTED}@db/umt": 3,
        "redis://cache:6379/0": 1,
        "plain": 2,
    }


def test_the_processor_keeps_container_types_and_clean_values() -> None:
    event = {"event": "x", "t": ("a", "token=b"), "n": 1, "f": 1.5, "ok": True, "none": None}
    out = redact_secrets(None, "info", event)
    assert out == {
        "event": "x",
        "t": ("a", f"token={REDACTED}"),
        "n": 1,
        "f": 1.5,
        "ok": True,
        "none": None,
    }


class Plain:
    def __repr__(self) -> str:
        return "<Plain token-free object>"


def test_objects_are_checked_by_the_text_the_renderer_prints(captured: Capture) -> None:
    exc = ConnectionError("https://bob:obj-secret@host/")
    get_logger().warning("failed", error=exc, run=Plain(), pair=("ok", "password=p2"))
    line = captured.last()
    assert_absent(captured.text, "obj-secret", "p2")
    assert line["error"] == f"ConnectionError('https://bob:{REDACTED}@host/')"
    assert line["run"] == "<Plain token-free object>"  # nothing to redact: rendered as before
    assert line["pair"] == ["ok", f"password={REDACTED}"]


def test_logged_exception_traceback_is_redacted(captured: Capture) -> None:
    log = get_logger(worker_id="w-1")
    try:
        connect("https://svc:tb-hunter2@api.example/v1?access_token=tb-tok&page=1")
    except ConnectionError:
        log.exception("call failed", step="fetch")
    line = captured.last()
    assert_absent(captured.text, "tb-hunter2", "tb-tok")
    assert line["level"] == "error" and line["step"] == "fetch"
    assert "Traceback (most recent call last)" in line["exception"]
    assert "in connect" in line["exception"]
    assert (
        f"https://svc:{REDACTED}@api.example/v1?access_token={REDACTED}&page=1"
        in (line["exception"])
    )


def connect(url: str) -> None:
    raise ConnectionError(f"cannot reach {url}")


@pytest.mark.parametrize("how", ["exception", "exc_info=exc", "exc_info=tuple"])
def test_a_hosts_chain_that_renders_exceptions_itself_gets_them_redacted(how: str) -> None:
    """A host's own structlog chain (docs/logging.md: redact_secrets is inserted before its
    last processor) may leave exceptions to its renderer, as structlog's default chain does
    (set_exc_info, then ConsoleRenderer printing the traceback): the traceback was printed
    after redaction, secrets and all (found by an outside audit)."""
    saved = structlog.get_config()
    stream = io.StringIO()
    try:
        structlog.configure(
            processors=[
                structlog.processors.add_log_level,
                structlog.dev.set_exc_info,
                structlog.dev.ConsoleRenderer(colors=False),
            ],
            logger_factory=structlog.PrintLoggerFactory(file=stream),
            cache_logger_on_first_use=False,
        )
        log = get_logger(worker_id="w-1")
        try:
            connect("postgres://app:host-tb-pw@db/x?password=host-tb-pw2")
        except ConnectionError as exc:
            if how == "exception":
                log.exception("group commit failed")
            elif how == "exc_info=exc":
                log.error("group commit failed", exc_info=exc)
            else:
                log.error("group commit failed", exc_info=sys.exc_info())
    finally:
        structlog.configure(**saved)
    text = stream.getvalue()
    assert "group commit failed" in text and "Traceback (most recent call last)" in text
    assert "in connect" in text and f"postgres://app:{REDACTED}@db/x" in text
    assert_absent(text, "host-tb-pw")


def test_console_renderer_output_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    saved = structlog.get_config()
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        logs.configure(force=True)
        get_logger().info("login", password="tty-pw", url="ftp://u:tty-url-pw@host/")
    finally:
        structlog.configure(**saved)
    text = stream.getvalue()
    assert "login" in text and REDACTED in text
    assert_absent(text, "tty-pw", "tty-url-pw")


# -- redact_text --------------------------------------------------------------------------------


def test_redact_text_returns_clean_text_unchanged_and_is_idempotent() -> None:
    clean = "worker started tasks=['noop@1'] queues=all concurrency=4\n" * 1000
    assert redact_text(clean) is clean
    dirty = "postgres://a:b@h/db token=t Authorization: Bearer x"
    once = redact_text(dirty)
    assert once == f"postgres://a:{REDACTED}@h/db token={REDACTED} Authorization: Bearer {REDACTED}"
    assert redact_text(once) == once


# -- stored errors ------------------------------------------------------------------------------


def failing(message: str) -> BaseException:
    try:
        connect(message)
    except ConnectionError as exc:
        return exc
    raise AssertionError("unreachable")


def test_encode_error_redacts_message_and_traceback() -> None:
    exc = failing("https://bob:err-pw@api.example/v1?token=err-tok Authorization: Bearer err-b")
    error = encode_error(exc)
    assert error["type"] == "builtins.ConnectionError"
    assert error["message"] == (
        f"cannot reach https://bob:{REDACTED}@api.example/v1?token={REDACTED} "
        f"Authorization: Bearer {REDACTED}"
    )
    assert "Traceback (most recent call last)" in error["traceback"]
    assert error["message"] in error["traceback"]
    for value in error.values():
        assert_absent(value, "err-pw", "err-tok", "err-b")


@pytest.mark.django_db
@pytest.mark.both_dbs  # what the database stores
def test_encode_error_replaces_nul_so_the_error_can_be_stored() -> None:
    error = encode_error(ValueError("bad byte \x00 in name\x00"))
    assert error["message"] == "bad byte \ufffd in name\ufffd"
    assert "\x00" not in error["traceback"]
    run = make_run("failed", error=error)  # PostgreSQL's jsonb refuses "\u0000"
    run.refresh_from_db()
    assert run.error == error


# -- a run's own logger -----------------------------------------------------------------------

LEAKY = "test_logs.leaky"


@pytest.fixture
def leaky() -> Iterator[None]:
    def leaky_workflow(ctx: TaskContext) -> None:
        ctx.logger.info(
            "calling the tracker",
            url="https://user:ctx-pw@tracker.example/announce?passkey=ctx-pk&port=6881",
            headers={"Authorization": "Bearer ctx-bearer", "User-Agent": "umt"},
            api_token="ctx-token",
            step="announce",
        )
        raise ConnectionError("tracker https://user:ctx-pw@tracker.example/ refused the announce")

    workflow(leaky_workflow, name=LEAKY, retry=RetryPolicy(max_attempts=1))
    yield
    registry.unregister(LEAKY, 1)


@pytest.mark.django_db
@pytest.mark.both_dbs  # what the database stores
def test_a_runs_context_logger_and_stored_error_are_redacted(
    captured: Capture, leaky: None, fake_clock: FakeClock
) -> None:
    res = tasks_engine.enqueue(LEAKY)
    assert drain(fake_clock, pairs=[(LEAKY, 1)]) == ["failed"]
    lines = captured.lines()
    assert_absent(captured.text, "ctx-pw", "ctx-pk", "ctx-bearer")
    call = next(line for line in lines if line["event"] == "calling the tracker")
    assert (call["run_id"], call["task"], call["step"]) == (str(res.run_id), LEAKY, "announce")
    assert call["url"] == (
        f"https://user:{REDACTED}@tracker.example/announce?passkey={REDACTED}&port=6881"
    )
    assert call["headers"] == {"Authorization": f"Bearer {REDACTED}", "User-Agent": "umt"}
    assert call["api_token"] == REDACTED
    failed = next(line for line in lines if line["event"] == "run failed")
    assert (
        failed["message"]
        == f"tracker https://user:{REDACTED}@tracker.example/ refused the announce"
    )
    stored = WorkflowRun.objects.get(pk=res.run_id).error
    assert stored["message"] == failed["message"]
    assert "ctx-pw" not in stored["traceback"]


def test_each_log_line_reaches_stderr_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes of `runworker --processes N` share one stderr: a line written in two parts
    (the text, then its newline) can fuse with a sibling's line, which breaks JSON-lines
    readers. (CI saw `{...}{...}` on one line from two children stopping at once.)"""

    class Writes(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def write(self, text: str) -> int:
            self.calls.append(text)
            return super().write(text)

    saved = structlog.get_config()
    stream = Writes()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        logs.configure(force=True)
        get_logger().info("worker stopping", in_flight=0)
        get_logger().info("worker stopping", in_flight=1)
    finally:
        structlog.configure(**saved)
    assert len(stream.calls) == 2, stream.calls
    assert all(call.endswith("\n") and call.count("\n") == 1 for call in stream.calls)
    assert [json.loads(call)["in_flight"] for call in stream.calls] == [0, 1]
