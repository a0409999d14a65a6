"""The peer routers of the live benchmark (vLLM's router, SGLang's gateway) start here in
front of simulated engines and carry an agent's call through, each seeing the program id
the way its own documentation asks (benchmarks/peers.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from thunder_mw.benchmarks import peers
from thunder_mw.benchmarks.des import ClusterConfig
from thunder_mw.benchmarks.engine_counters import delta, read_counters
from thunder_mw.benchmarks.live import steady_metrics
from thunder_mw.benchmarks.replay import CallRecord, ProgramRecord, ReplayResult, render

pytestmark = pytest.mark.peers

# Set by .ci/run (scripts/test.sh installs the `peers` extra): a missing peer is a failure.
REQUIRE_REAL_ENV = "THUNDER_MW_REQUIRE_REAL"
PEER_SYSTEMS = [name for name, s in peers.SYSTEMS.items() if s.kind != "thunder-mw"]
CLUSTER = ClusterConfig(engines=2, kv_tokens=8192, max_model_len=4096, profile="h100-8b")
MAX_TOKENS = 4


def _installed(kind: str) -> None:
    try:
        peers.peer_executable(kind)
    except peers.PeerMissing as exc:
        if os.environ.get(REQUIRE_REAL_ENV) == "1":
            pytest.fail(f"{exc} ({REQUIRE_REAL_ENV}=1 forbids skipping)")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def engines() -> Iterator[list[str]]:
    """Two `thunder-mw sim-engine` processes (vLLM flavour), fast-forwarded."""
    with peers.sim_engines(CLUSTER, time_scale=200.0) as urls:
        yield urls


def _call(url: str, system: peers.System, program_id: str, index: int = 0) -> httpx.Response:
    fields, headers = system.identity(program_id, index, False)
    body = {
        "model": "sim-model",
        "prompt": render(list(range(64))) + render([hash(program_id) % 1000, index]),
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        **fields,
    }
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)


def _generated(engines: list[str], before: list[dict[str, float]]) -> list[float]:
    return [
        delta(b, read_counters([u], timeout_s=5))["generation_tokens"]
        for u, b in zip(engines, before, strict=True)
    ]


@pytest.mark.parametrize("name", PEER_SYSTEMS)
def test_each_peer_carries_a_program_call_to_an_engine(engines: list[str], name: str) -> None:
    system = peers.SYSTEMS[name]
    _installed(system.kind)
    before = [read_counters([u], timeout_s=5) for u in engines]
    with peers.start_router(system, engines, CLUSTER, time_scale=200.0) as router:
        response = _call(router.url, system, "prog-carried")
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == MAX_TOKENS
    assert sum(_generated(engines, before)) == MAX_TOKENS


def test_vllm_router_program_scheduler_sees_the_program_id(engines: list[str]) -> None:
    system = peers.SYSTEMS["vllm-router/program"]
    _installed(system.kind)
    with peers.start_router(system, engines, CLUSTER, time_scale=200.0) as router:
        assert _call(router.url, system, "prog-seen").status_code == 200
        diagnostics = httpx.get(f"{router.url}/scheduling/diagnostics", timeout=10).json()
    assert diagnostics["enabled"] is True
    programs = [p for rank in diagnostics["ranks"] for p in rank.get("programs") or ()]
    assert [p["root_program_id"] for p in programs] == ["prog-seen"]
    assert {r["configured_token_capacity"] for r in diagnostics["ranks"]} == {CLUSTER.kv_tokens}


def test_smg_consistent_hashing_keeps_a_program_on_one_engine(engines: list[str]) -> None:
    system = peers.SYSTEMS["smg/consistent_hashing"]
    _installed(system.kind)
    before = [read_counters([u], timeout_s=5) for u in engines]
    with peers.start_router(system, engines, CLUSTER, time_scale=200.0) as router:
        for index in range(6):
            assert _call(router.url, system, "prog-keyed", index).status_code == 200
    assert sorted(_generated(engines, before)) == [0, 6 * MAX_TOKENS]


def test_a_missing_peer_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("thunder_mw.benchmarks.peers.shutil.which", lambda name: None)
    monkeypatch.setattr(peers, "_beside_python", lambda name: None)
    with pytest.raises(peers.PeerMissing, match=r"thunder-mw\[peers\]"):
        peers.peer_executable("smg")
    assert peers.missing_peers() == list(peers.PEER_PACKAGES)


def test_steady_window_runs_from_the_first_wave_turning_over_to_the_last_start() -> None:
    # A closed loop of 4 (warm-up: 2 programs, half of it): programs end at 10 and 20
    # (window opens at 20, the 2nd end) and the last one starts at 30; only calls done
    # inside (20, 30] count.
    def program(pid: str, start: float, end: float, calls: list[float]) -> ProgramRecord:
        record = ProgramRecord(pid, True, start, done_at=end)
        record.calls = [CallRecord(pid, i, t, done_at=t, status=200) for i, t in enumerate(calls)]
        return record

    result = ReplayResult(
        0.0,
        40.0,
        [
            program("a", 0.0, 10.0, [5.0, 10.0]),
            program("b", 0.0, 20.0, [15.0, 20.0]),
            program("c", 10.0, 35.0, [21.0, 25.0, 35.0]),
            program("d", 30.0, 40.0, [40.0]),
        ],
    )
    steady = steady_metrics(result, time_scale=2.0, concurrency=4)
    assert steady == {"steps_per_min_steady": 6.0, "steady_window_s": 20.0, "warmup_s": 40.0}
