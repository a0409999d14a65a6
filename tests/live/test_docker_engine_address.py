"""The tool manager reaches the Docker engine at tools.docker.engine_url (else DOCKER_HOST)
and nowhere else: not through an HTTP(S)_PROXY from the environment."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from thunder_mw.tools.docker_engine import DockerEngine


class _Recorder(ThreadingHTTPServer):
    def __init__(self, answer_as_engine: bool) -> None:
        self.paths: list[str] = []
        self.answer_as_engine = answer_as_engine
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        if not self.server.answer_as_engine:
            self.send_error(502)
            return
        body = json.dumps({"ApiVersion": "1.43", "Version": "24.0.7"}).encode()
        if self.path.endswith("/_ping"):
            body = b"OK"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def recorder(answer_as_engine: bool) -> Iterator[_Recorder]:
    server = _Recorder(answer_as_engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def engine_and_decoy(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[_Recorder, _Recorder]]:
    """A fake engine, and a decoy named by every environment variable that could divert."""
    with recorder(True) as engine, recorder(False) as decoy:
        proxy = decoy.url.replace("tcp://", "http://")
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        yield engine, decoy


def test_the_configured_url_wins_over_docker_host_and_proxies(
    engine_and_decoy: tuple[_Recorder, _Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, decoy = engine_and_decoy
    monkeypatch.setenv("DOCKER_HOST", decoy.url)
    docker_engine = DockerEngine(engine.url, max_calls=1, timeout_s=5)
    try:
        assert docker_engine.ping() == "24.0.7"
    finally:
        docker_engine.close()
    assert engine.paths and decoy.paths == []


def test_docker_host_is_used_when_no_url_is_configured(
    engine_and_decoy: tuple[_Recorder, _Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, decoy = engine_and_decoy
    monkeypatch.setenv("DOCKER_HOST", engine.url)
    docker_engine = DockerEngine(None, max_calls=1, timeout_s=5)
    try:
        assert docker_engine.ping() == "24.0.7"
    finally:
        docker_engine.close()
    assert engine.paths and decoy.paths == []
