"""YAML config, environment overrides, check-config, and `thunder-mw --config` serving for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from support.asgi_servers import serving
from support.fake_engine import FakeEngine

from thunder_mw.benchmarks.server_process import wait_until_healthy
from thunder_mw.cli.config_loader import ConfigError, load_config
from thunder_mw.cli.main import main
from thunder_mw.sim.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_cluster_config_is_valid_and_has_two_vllm_engines() -> None:
    config = load_config(ROOT / "config" / "cluster.yaml")
    assert [b.url for b in config.backends] == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    assert config.server.host == "127.0.0.1"


def test_errors_carry_their_yaml_location(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "server:\n  port: 99999\nbackends:\n  - url: http://a:1\n  - type: vllm\n    url: ftp://b\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    problems = info.value.problems
    assert any(p.startswith("server.port (line 2)") for p in problems)
    assert any(p.startswith("backends[1].url (line 6)") for p in problems)


def test_unknown_keys_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "server:\n  prot: 1\n"))
    assert info.value.problems == ["server.prot (line 2): unknown key"]


def test_non_sim_backend_needs_a_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "backends:\n  - type: vllm\n"))
    assert "backends[0]" in info.value.problems[0]


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THUNDER_MW_SERVER__PORT", "9123")
    monkeypatch.setenv("THUNDER_MW_SERVER__ADMIN_TOKEN", "tok")
    config = load_config(write(tmp_path, "server:\n  port: 8300\n  log_level: debug\n"))
    assert config.server.port == 9123
    assert config.server.admin_token is not None
    assert config.server.admin_token.get_secret_value() == "tok"
    assert config.server.log_level == "debug"


def test_check_config_prints_the_normalised_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(write(tmp_path, "backends:\n  - url: http://x:1/\n"))]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["backends"][0]["url"] == "http://x:1"
    assert printed["agent_context"]["on_missing"] == "ephemeral"


def test_check_config_reports_every_error_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "server:\n  port: x\n  host: 5\nagent_context:\n  on_missing: maybe\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "server.port (line 2)" in err and "agent_context.on_missing (line 5)" in err


def test_invalid_yaml_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(write(tmp_path, "server: [\n"))]) == 2
    assert "not valid YAML" in capsys.readouterr().err


@pytest.mark.slow  # a `thunder-mw serve` process
def test_thunder_mw_config_serves_and_cli_flags_override_the_file(tmp_path: Path) -> None:
    engine = FakeEngine()
    with serving(engine) as es:
        port = free_port()
        path = write(tmp_path, f"server:\n  port: 1\nbackends:\n  - name: e\n    url: {es.url}\n")
        proc = subprocess.Popen(
            [sys.executable, "-m", "thunder_mw.cli.main", "--config", str(path),
             "--port", str(port), "--log-level", "warning"],
            env={**os.environ, "THUNDER_MW_SERVER__ADMIN_TOKEN": "t0k"},
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_healthy(url)
            r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "program_id": "p"})
            programs = httpx.get(f"{url}/programs", headers={"Authorization": "Bearer t0k"})
            assert r.status_code == 200
            assert programs.json()["programs"][0]["program_id"] == "p"
        finally:
            proc.send_signal(signal.SIGTERM)
            # uvicorn shuts down gracefully, then re-raises the signal it caught.
            assert proc.wait(timeout=20) in (0, -signal.SIGTERM)
