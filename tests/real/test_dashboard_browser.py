"""The dashboard in a real browser (headless Chromium) while programs are paused on simulated
engines; a screenshot of it is kept under test-artifacts/."""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.asgi_servers import ServerThread, serving, serving_gateway
from support.fake_engine import FakeEngine
from support.polling import wait_until

from thunder_mw.lab.dashboard_demo import chromium, find_chromium
from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
REQUIRE_REAL_ENV = "THUNDER_MW_REQUIRE_REAL"
SIM = {"time_scale": 0.4, "model_name": "sim-model"}  # a 900-token call takes ~13 s
TIGHT_POLICIES = [
    {"admission": {"buffer_tokens_per_program": 64, "overflow": "hold"}},
    {"state_aware_pause": {}},
    {"migration": {}},
    {"gc_hooks": {}},
]


@pytest.fixture(scope="module")
def browser() -> str:
    path = find_chromium()
    if path is None:
        reason = "no Chromium binary (scripts/setup_chromium.sh installs Debian's chromium)"
        if os.environ.get(REQUIRE_REAL_ENV) == "1":
            pytest.fail(f"{reason} ({REQUIRE_REAL_ENV}=1 forbids skipping)")
        pytest.skip(reason)
    return path


def chat(program_id: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"{program_id} " * 40}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "program_id": program_id,
        **extra,
    }


def programs(gw: ServerThread) -> dict[str, dict[str, Any]]:
    return {p["program_id"]: p for p in httpx.get(f"{gw.url}/programs").json()["programs"]}


class Scenario:
    """Two simulated engines the scheduler plans at 1,000 KV tokens each. Four programs run
    a short call each; then one program per engine starts a long streaming call that needs
    nearly all of its engine, so the others are paused and their next requests wait."""

    def __init__(self, gw: ServerThread) -> None:
        self.gw = gw
        self.threads: list[threading.Thread] = []
        self.waiters: list[str] = []

    def run(self, body: dict[str, Any]) -> None:
        def go() -> None:
            asyncio.run(self._post(body))

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        self.threads.append(thread)

    async def _post(self, body: dict[str, Any]) -> None:
        async with httpx.AsyncClient(base_url=self.gw.url, timeout=120) as client:
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_raw():
                    pass

    def start(self) -> None:
        for i in range(4):
            r = httpx.post(f"{self.gw.url}/v1/chat/completions", json=chat(f"p{i}", 4), timeout=60)
            assert r.status_code == 200, r.text
        by_backend: dict[str, list[str]] = {}
        for pid, p in sorted(programs(self.gw).items()):
            by_backend.setdefault(p["backend"], []).append(pid)
        hogs = [pids[0] for pids in by_backend.values()]
        self.waiters = [pid for pids in by_backend.values() for pid in pids[1:]]
        for hog in hogs:
            self.run(chat(hog, 900, stream=True))
        wait_until(
            lambda: all(programs(self.gw)[h]["in_flight"] for h in hogs),
            20,
            message="hogs running",
        )
        for waiter in self.waiters:
            self.run(chat(waiter, 4))

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=120)


@pytest.fixture(scope="module")
def loaded_gateway() -> Iterator[tuple[ServerThread, Scenario]]:
    config = ThunderConfig(
        backends=[
            {"name": f"sim-{i}", "type": "sim", "capacity_tokens": 1000, "sim": SIM}
            for i in range(2)
        ],
        policies=TIGHT_POLICIES,
    )
    with serving(create_app(config)) as gw:
        scenario = Scenario(gw)
        scenario.start()
        wait_until(
            lambda: any(p["state"] == "paused" and p["waiting"] for p in programs(gw).values()),
            20,
            message="a paused program with a held request",
        )
        yield gw, scenario
        scenario.join()


def test_the_dashboard_renders_engines_and_paused_programs_in_chromium(
    browser: str, loaded_gateway: tuple[ServerThread, Scenario]
) -> None:
    gw, scenario = loaded_gateway
    dom = chromium(f"{gw.url}/dashboard", binary=browser, budget_ms=3000)
    assert 'data-backend="sim-0"' in dom and 'data-backend="sim-1"' in dom
    queued = set(re.findall(r'<tr data-program="([^"]+)"', dom))
    assert queued & set(scenario.waiters), f"no paused program in the queue table: {queued}"
    assert "reserved " in dom and "/ 1,000 tok" in dom  # capacity and reservation rendered
    assert re.search(r'<span class="tag t-pause">pause</span>', dom)  # a decision listed


def test_a_screenshot_of_the_loaded_dashboard_is_kept(
    browser: str, loaded_gateway: tuple[ServerThread, Scenario]
) -> None:
    gw, _ = loaded_gateway
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    chromium(f"{gw.url}/dashboard", binary=browser, screenshot=shot, budget_ms=3000)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


# ------------------------------------------------------------------ with an admin token
@pytest.fixture
def guarded() -> Iterator[ServerThread]:
    with serving_gateway(FakeEngine(), {"name": "e0"}, server={"admin_token": "s3cret"}) as gw:
        yield gw


def test_with_a_token_the_page_takes_it_once_and_polls_with_a_header(
    browser: str, guarded: ServerThread
) -> None:
    dom = chromium(f"{guarded.url}/dashboard?token=s3cret", binary=browser, budget_ms=2000)
    assert 'data-backend="e0"' in dom


def test_the_page_without_its_token_is_refused(guarded: ServerThread) -> None:
    assert httpx.get(f"{guarded.url}/dashboard").status_code == 401
    assert httpx.get(f"{guarded.url}/dashboard?token=wrong").status_code == 401


def test_only_the_page_accepts_the_token_in_its_url(guarded: ServerThread) -> None:
    assert httpx.get(f"{guarded.url}/dashboard?token=s3cret").status_code == 200
    assert httpx.get(f"{guarded.url}/dashboard/state?token=s3cret").status_code == 401
    authorized = {"Authorization": "Bearer s3cret"}
    assert httpx.get(f"{guarded.url}/dashboard/state", headers=authorized).status_code == 200
