"""No credential reaches a log line, check-config's output or an admin answer."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.fake_engine import FakeEngine
from support.polling import wait_until

from thunder_mw.cli.config_loader import load_config
from thunder_mw.observability.redaction import SecretRedactor, config_secrets
from thunder_mw.sim.ports import free_port

CLIENT_KEY = "sk-client-7f3a9c1e"
ENGINE_KEY = "engine-key-b84d02aa"
ADMIN_TOKEN = "admin-token-5e61c7d9"
SECRETS = (CLIENT_KEY, ENGINE_KEY, ADMIN_TOKEN)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "program_id": "agent-1"}


def write_config(tmp_path: Path, engine_url: str, port: int, log_format: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        f"server:\n  port: {port}\n  log_level: debug\n  admin_token: {ADMIN_TOKEN}\n"
        f"backends:\n  - name: e\n    url: {engine_url}\n    api_key: {ENGINE_KEY}\n"
        f"observability:\n  access_log: true\n  log_format: {log_format}\n"
    )
    return path


def exercise(url: str) -> dict[str, str]:
    """Every kind of request that carries a credential; returns the admin answers' bodies."""
    client_auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
    admin_auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=client_auth).is_success
    stream = {**CHAT, "stream": True}
    assert httpx.post(f"{url}/v1/chat/completions", json=stream, headers=client_auth).is_success
    assert httpx.get(f"{url}/programs", headers=client_auth).status_code == 401
    answers = {
        "health": httpx.get(f"{url}/health").text,
        "programs": httpx.get(f"{url}/programs", headers=admin_auth).text,
        "dashboard": httpx.get(f"{url}/dashboard?token={ADMIN_TOKEN}").text,
        "dashboard_state": httpx.get(f"{url}/dashboard/state", headers=admin_auth).text,
        "metrics": httpx.get(f"{url}/metrics", headers=admin_auth).text,
    }
    release = {"program_id": "agent-1"}
    assert httpx.post(f"{url}/programs/release", json=release, headers=admin_auth).is_success
    return answers


def wait_until_up(url: str, process: subprocess.Popen[bytes]) -> None:
    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError("gateway exited during start-up")
        return httpx.get(f"{url}/health", timeout=1).status_code == 200

    # Polling a child process: there is no event to await.
    wait_until(
        up, 60, interval_s=0.1, message="the gateway to start", ignoring=(httpx.TransportError,)
    )


@pytest.mark.slow  # `thunder-mw` processes
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_debug_logs_with_access_log_hold_no_secret(
    engine: FakeEngine, tmp_path: Path, log_format: str
) -> None:
    port = free_port()
    config = write_config(tmp_path, engine.url, port, log_format)
    process = subprocess.Popen(
        [sys.executable, "-m", "thunder_mw.cli.main", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process)
        answers = exercise(url)
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0].decode()
    assert engine.last().headers["authorization"] == f"Bearer {ENGINE_KEY}"  # it was used
    assert "/dashboard?token=***" in output  # the access log was on, and masked
    assert "1 backend(s)" in output  # the gateway's own log lines were captured
    for secret in SECRETS:
        assert secret not in output
        for name, body in answers.items():
            assert secret not in body, name


@pytest.mark.slow  # `thunder-mw` processes
def test_check_config_prints_secrets_masked(engine: FakeEngine, tmp_path: Path) -> None:
    config = write_config(tmp_path, engine.url, free_port(), "text")
    result = subprocess.run(
        [sys.executable, "-m", "thunder_mw.cli.main", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "admin_token: '**********'" in result.stdout
    for secret in SECRETS:
        assert secret not in result.stdout + result.stderr


def test_secrets_still_load_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THUNDER_MW_SERVER__ADMIN_TOKEN", ADMIN_TOKEN)
    path = tmp_path / "c.yaml"
    path.write_text(f"backends:\n  - url: http://127.0.0.1:1\n    api_key: {ENGINE_KEY}\n")
    config = load_config(path)
    assert sorted(config_secrets(config)) == sorted([ADMIN_TOKEN, ENGINE_KEY])
    assert ADMIN_TOKEN not in repr(config) and ENGINE_KEY not in repr(config)


def test_backend_urls_with_credentials_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("backends:\n  - url: http://user:pw-9d1c@127.0.0.1:1\n")
    with pytest.raises(Exception) as info:
        load_config(path)
    assert "api_key" in str(info.value) and "pw-9d1c" not in str(info.value)


# ------------------------------------------------------------------ the filter itself
def record(
    msg: str, args: tuple[object, ...] = (), exc: BaseException | None = None
) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc else None
    return logging.LogRecord("t", logging.INFO, __file__, 1, msg, args, exc_info)


def formatted(rec: logging.LogRecord) -> str:
    assert SecretRedactor([ENGINE_KEY]).filter(rec)
    return logging.Formatter("%(message)s").format(rec)


def test_a_known_secret_in_an_argument_is_masked() -> None:
    assert formatted(record("key %s used", (ENGINE_KEY,))) == "key *** used"


def test_authorization_values_are_masked() -> None:
    text = formatted(record("got headers %s", ({"authorization": "Bearer sk-unknown-1"},)))
    assert "sk-unknown-1" not in text and "***" in text


def test_access_log_arguments_stay_a_tuple() -> None:
    rec = record('%s - "%s %s HTTP/%s" %d', ("1.2.3.4", "GET", "/d?token=t0k", "1.1", 200))
    assert formatted(rec) == '1.2.3.4 - "GET /d?token=*** HTTP/1.1" 200'


def test_exception_text_is_masked() -> None:
    try:
        raise RuntimeError(f"engine refused {ENGINE_KEY}")
    except RuntimeError as exc:
        text = formatted(record("failed", exc=exc))
    assert ENGINE_KEY not in text and "engine refused ***" in text
