"""Safe when exposed: a non-loopback bind needs the admin token (or an explicit, documented
opt-out), and the state store's Redis URL is a secret that no output shows."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from thunder_mw.cli import serve as serve_module
from thunder_mw.cli.config_loader import ConfigError, load_config
from thunder_mw.cli.main import main
from thunder_mw.middleware.app import ThunderMiddleware, create_app
from thunder_mw.observability.redaction import SecretRedactor, config_secrets
from thunder_mw.schemas.config import ThunderConfig

ROOT = Path(__file__).resolve().parents[2]
REDIS_PASSWORD = "r3dis-pw-6c0e"
REDIS_URL = f"rediss://gateway:{REDIS_PASSWORD}@redis.internal:6380/0"
REFUSED = "refusing to bind"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve` must refuse before uvicorn runs; if it got that far, fail instead of serving."""

    class NeverStarted:
        def __init__(self, *args: object) -> None:
            raise AssertionError("the gateway started")

    monkeypatch.setattr(serve_module, "GatewayServer", NeverStarted)


# ------------------------------------------------------------------ binding beyond loopback
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "2001:db8::7", "gw.example"])
def test_a_non_loopback_host_without_an_admin_token_is_refused(tmp_path: Path, host: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, f"server:\n  port: 8300\n  host: '{host}'\n"))
    [problem] = info.value.problems
    assert problem.startswith(f"server.host (line 3): {REFUSED} {host}, which is not a loopback")
    assert "`server.admin_token`" in problem
    assert "`server.allow_unauthenticated_admin: true`" in problem


def test_a_non_loopback_host_with_an_admin_token_is_served(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "server:\n  host: 0.0.0.0\n  admin_token: t0k\n"))
    assert config.server.host == "0.0.0.0"


def test_an_empty_admin_token_protects_nothing_so_it_counts_as_none(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=REFUSED):
        load_config(write(tmp_path, "server:\n  host: 0.0.0.0\n  admin_token: ''\n"))


def test_the_admin_token_may_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THUNDER_MW_SERVER__ADMIN_TOKEN", "t0k")
    assert load_config(write(tmp_path, "server:\n  host: '::'\n")).server.host == "::"


def test_allow_unauthenticated_admin_lets_an_exposed_host_start_without_a_token(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "server:\n  host: 0.0.0.0\n  allow_unauthenticated_admin: true\n")
    config = load_config(path)
    assert config.server.admin_token is None and config.server.allow_unauthenticated_admin


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost", "LocalHost"])
def test_loopback_hosts_need_no_token(tmp_path: Path, host: str) -> None:
    assert load_config(write(tmp_path, f"server:\n  host: '{host}'\n")).server.host == host


def test_the_refusal_holds_for_configs_built_in_code_too() -> None:
    with pytest.raises(ValueError, match=REFUSED):
        ThunderConfig(server={"host": "0.0.0.0"})


@pytest.mark.parametrize("path", sorted((ROOT / "config").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_still_loads_and_binds_loopback(path: Path) -> None:
    assert load_config(path).server.host == "127.0.0.1"


def test_check_config_reports_the_exposed_bind_with_its_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "backends:\n  - url: http://e:1\nserver:\n  host: 0.0.0.0\n")
    assert main(["check-config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"{path}: invalid configuration\n")
    assert f"  server.host (line 4): {REFUSED} 0.0.0.0, which is not a loopback" in captured.err


def test_serve_with_an_exposed_host_from_the_command_line_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_server: None
) -> None:
    path = write(tmp_path, "server:\n  port: 8300\n")
    assert main(["--config", str(path), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("command line: invalid configuration\n")
    assert f"  server.host: {REFUSED} 0.0.0.0" in err


# ------------------------------------------------------------------ the state store's URL
def redis_config(tmp_path: Path, url: str = REDIS_URL) -> Path:
    return write(tmp_path, f"state:\n  backend: redis\n  url: '{url}'\n  key_prefix: 'fleet-a:'\n")


def test_the_state_section_defaults_to_memory_with_no_url(tmp_path: Path) -> None:
    state = load_config(write(tmp_path, "{}\n")).state
    assert (state.backend, state.url, state.key_prefix) == ("memory", None, "thunder-mw:")


@pytest.mark.parametrize("scheme", ["redis", "rediss"])
def test_redis_and_rediss_urls_are_accepted(tmp_path: Path, scheme: str) -> None:
    url = REDIS_URL.replace("rediss://", f"{scheme}://")
    state = load_config(redis_config(tmp_path, url)).state
    assert state.url is not None and state.url.get_secret_value() == url


def test_a_redis_backend_needs_a_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "state:\n  backend: redis\n"))
    assert info.value.problems == ["state.url (line 1): the redis backend needs a url"]


def test_the_memory_backend_takes_no_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, f"state:\n  url: '{REDIS_URL}'\n"))
    [problem] = info.value.problems
    assert problem.startswith("state.url (line 2): the memory backend takes no url")
    assert REDIS_PASSWORD not in problem


@pytest.mark.parametrize(
    "url", [f"http://:{REDIS_PASSWORD}@r:6379", f"redis://:{REDIS_PASSWORD}@r:x"]
)
def test_a_url_that_is_not_redis_is_refused_without_echoing_it(tmp_path: Path, url: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(redis_config(tmp_path, url))
    assert info.value.problems[0].startswith("state.url (line 3): ")
    assert REDIS_PASSWORD not in str(info.value)
    with pytest.raises(ValueError) as raw:
        ThunderConfig(state={"backend": "redis", "url": url})
    assert REDIS_PASSWORD not in str(raw.value)


def test_check_config_prints_the_redis_url_with_its_password_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(redis_config(tmp_path))]) == 0
    captured = capsys.readouterr()
    printed = yaml.safe_load(captured.out)["state"]
    assert printed == {
        "backend": "redis",
        "url": "rediss://gateway:***@redis.internal:6380/0",
        "key_prefix": "fleet-a:",
        "on_unavailable": "fail_open",
        "lease_ttl_s": 5.0,
        "timeout_s": 0.5,
    }
    assert REDIS_PASSWORD not in captured.out + captured.err


def test_the_redis_password_is_masked_in_log_lines(tmp_path: Path) -> None:
    encoded = "p%40ss-4b1f"  # "p@ss-4b1f", percent-encoded as a URL needs it
    config = load_config(redis_config(tmp_path, f"redis://:{encoded}@r:6379"))
    redactor = SecretRedactor(config_secrets(config))
    rec = logging.LogRecord(
        "t",
        logging.WARNING,
        __file__,
        1,
        "redis auth failed with %s (%s)",
        ("p@ss-4b1f", encoded),
        None,
    )
    assert redactor.filter(rec)
    assert rec.getMessage() == "redis auth failed with *** (***)"


def test_the_redis_url_may_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THUNDER_MW_STATE__URL", REDIS_URL)
    config = load_config(write(tmp_path, "state:\n  backend: redis\n"))
    assert REDIS_PASSWORD in config_secrets(config)
    assert REDIS_PASSWORD not in repr(config)


def test_command_line_overrides_keep_the_redis_url(tmp_path: Path) -> None:
    config = load_config(redis_config(tmp_path), {"server": {"port": 9001}})
    assert config.state.url is not None and config.state.url.get_secret_value() == REDIS_URL


# ------------------------------------------------------------------ the redis backend runs
def test_check_config_shows_the_redis_backend_with_its_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(redis_config(tmp_path))]) == 0
    out, err = capsys.readouterr()
    printed = yaml.safe_load(out)["state"]
    assert (printed["on_unavailable"], printed["lease_ttl_s"]) == ("fail_open", 5.0)
    assert REDIS_PASSWORD not in out + err
    assert "refuses" not in err


def test_the_app_and_gateway_mode_schedule_through_the_shared_store(tmp_path: Path) -> None:
    from redis.asyncio.connection import SSLConnection

    from thunder_mw.state.redis_store import RedisStore

    config = load_config(redis_config(tmp_path))
    app = create_app(config)
    replication = app.core.scheduler.replication
    assert replication is not None and isinstance(replication.store, RedisStore)
    # rediss:// is TLS all the way (nothing connects until the gateway starts).
    assert replication.store.client.connection_pool.connection_class is SSLConnection
    assert replication.store.prefix == "fleet-a:"

    async def inner(scope: object, receive: object, send: object) -> None: ...

    middleware = ThunderMiddleware(inner, config)
    replication = middleware.core.scheduler.replication
    assert replication is not None and isinstance(replication.store, RedisStore)
