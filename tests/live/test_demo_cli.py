"""`thunder-mw` alone serves the built-in demo and says where it listens; a taken port is
reported before anything starts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from thunder_mw.benchmarks.server_process import wait_until_healthy
from thunder_mw.cli.main import main
from thunder_mw.sim.ports import free_port


@pytest.mark.slow  # a `thunder-mw` process
def test_thunder_mw_alone_serves_the_built_in_demo_and_says_where_it_listens(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "THUNDER_MW_SERVER__PORT": str(port),  # the demo's 8300 may be another run's
        "THUNDER_MW_TOOLS__DOCKER__ENABLED": "false",
    }
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        # No arguments at all, from a directory that holds no config: the packaged demo.
        proc = subprocess.Popen(
            [sys.executable, "-m", "thunder_mw.cli"], cwd=tmp_path, env=env, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process=proc, log_path=log)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = log.read_text().splitlines()
    listening = [line for line in lines if "listening on" in line]
    assert listening == [
        f"{listening[0].split(' INFO ')[0]} INFO thunder_mw: thunder-mw listening on {url} "
        f"(dashboard: {url}/dashboard); Ctrl-C or SIGTERM stops it"
    ], lines
    assert any("built-in demo (config/demo.yaml) on SIMULATED engines" in line for line in lines)
    assert sum("embedded simulated engine" in line for line in lines) == 2
    # uvicorn's own lines are the gateway's alone: once each, at the gateway's level (INFO).
    assert sum("Started server process" in line for line in lines) == 1, lines
    assert sum("Shutting down" in line for line in lines) == 1, lines


def test_the_serve_help_says_what_runs_without_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "without it: the built-in demo, config/demo.yaml" in " ".join(
        capsys.readouterr().out.split()
    )


@pytest.mark.slow  # a `thunder-mw` process
def test_a_taken_port_is_reported_before_any_engine_is_probed(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ran = subprocess.run(
            [sys.executable, "-m", "thunder_mw.cli", "--port", str(port)],
            cwd=tmp_path,
            env={**os.environ, "THUNDER_MW_TOOLS__DOCKER__ENABLED": "false"},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert ran.returncode == 1
    assert (
        f"cannot listen on http://127.0.0.1:{port}: Address already in use (server.host, "
        "server.port; `--port N` picks another)"
    ) in ran.stderr
    # Nothing was started or probed: no embedded engine, no health line.
    assert "embedded simulated engine" not in ran.stderr
    assert "healthy" not in ran.stderr
