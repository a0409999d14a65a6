"""Engine faults, each injected on purpose: what the client sees and what the scheduler keeps.

Every test ends by checking that nothing stays counted against an engine the gateway no
longer uses: the scheduler core's reservation and program count for it are back to zero.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from support.asgi_servers import ServerThread, serving
from support.fake_engine import FakeEngine
from support.held_requests import BIG, start_hog, wait_for
from support.polling import wait_until

from thunder_mw.engines.pool import (
    SCRAPED_SAMPLES,
    SUSPECT_RECHECK_S,
    SUSPECT_RECHECKS_S,
    Backend,
    BackendPool,
    restricted_page_target,
)
from thunder_mw.middleware.app import ThunderGateway, create_app
from thunder_mw.policies import (
    BackendChanged,
    CallFinished,
    ConnectionRefused,
    DecisionsApplied,
    Pause,
    ReleaseRequested,
    RequestArrived,
)
from thunder_mw.policies.core import RequestInfo, SchedulerCore
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Program, ProgramState, Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import BackendSettings, Convention, ServerSettings, ThunderConfig
from thunder_mw.sim.ports import free_port

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
# No growth buffer: a program idle between calls then reserves exactly its context, so "the
# reservation was freed" is an exact number.
POLICIES: list[dict[str, Any]] = [
    {"admission": {"buffer_tokens_per_program": 0, "overflow": "hold"}},
    {"state_aware_pause": {}},
    {"migration": {}},
]


class Gateway:
    """A served gateway and a window on its scheduler core (read on the gateway's loop)."""

    def __init__(self, app: ThunderGateway, server: ServerThread) -> None:
        self.app = app
        self.server = server
        self.url = server.url

    def chat(self, program_id: str, timeout: float = 10.0, **body: Any) -> httpx.Response:
        return httpx.post(
            f"{self.url}/v1/chat/completions",
            json={**CHAT, **body, "program_id": program_id},
            timeout=timeout,
        )

    def program(self, program_id: str) -> dict[str, Any]:
        view: dict[str, Any] = httpx.get(f"{self.url}/programs/{program_id}").json()
        return view

    def core(self, read: Callable[[SchedulerCore], Any]) -> Any:
        async def on_loop() -> Any:
            return read(self.app.core.scheduler.core)

        return self.server.call(on_loop())

    def accounting(self, label: str) -> dict[str, Any]:
        """What the core counts against one engine."""
        counts: dict[str, Any] = self.core(
            lambda core: {
                "reserved": core.backends[label].reserved,
                "pending_release": core.backends[label].pending_release,
                "programs": core.table.programs_on(label),
                "healthy": core.backends[label].healthy,
                "capacity": core.backends[label].capacity,
            }
        )
        return counts

    def active_on(self, label: str) -> list[str]:
        active: list[str] = self.core(
            lambda core: [
                p.program_id
                for p in core.programs()
                if p.state is ProgramState.ACTIVE and p.backend == label
            ]
        )
        return active


def _program(core: SchedulerCore, program_id: str) -> Program:
    """The core's entry for `program_id` (the test fails here if it has none)."""
    program = core.table.get(program_id)
    assert program is not None, program_id
    return program


@contextmanager
def gateway(backends: list[dict[str, Any]], **config: Any) -> Iterator[Gateway]:
    app = create_app(ThunderConfig(backends=backends, policies=POLICIES, **config))
    with serving(app) as server:
        yield Gateway(app, server)


def healthy_in_pool(gw: Gateway, label: str) -> bool:
    backends = httpx.get(f"{gw.url}/health").json()["backends"]
    healthy: bool = next(b for b in backends if b["name"] == label)["healthy"]
    return healthy


# ------------------------------------------------------------------ slow engine: first byte
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_engine_silent_past_the_first_byte_timeout_gets_a_504_and_frees_the_reservation(
    stream: bool,
) -> None:
    silent = FakeEngine(silent=True, headers_first=stream, report_capacity=False)
    with serving(silent) as es:
        with gateway([{"name": "slow", "url": es.url}], server={"first_byte_timeout_s": 0.5}) as gw:
            r = gw.chat("p", stream=stream)
            program = gw.program("p")
            assert silent.abandoned.wait(5), "the engine's call was not dropped"
            accounting = gw.accounting("slow")
    # A plain JSON error even for a stream: no event had been relayed yet.
    assert r.status_code == 504 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "upstream_timeout"
    assert "first_byte_timeout_s" in r.json()["error"]["message"]
    assert program["state"] == "active" and program["phase"] == "acting"
    assert program["in_flight"] == 0 and program["failures"] == 1
    assert program["reserved_tokens"] == 0
    assert accounting["reserved"] == 0 and accounting["pending_release"] == 0


@pytest.mark.slow  # ~3 s
def test_a_stream_slower_overall_than_the_first_byte_timeout_is_not_cut(engine: FakeEngine) -> None:
    engine.chunks, engine.chunk_delay_s = 8, 0.25  # first event after 0.25 s, the last after 2 s
    with gateway([{"name": "e", "url": engine.url}], server={"first_byte_timeout_s": 1.0}) as gw:
        r = gw.chat("p", stream=True)
    assert r.status_code == 200
    assert r.text.rstrip().endswith("data: [DONE]")


def test_a_slow_engine_stays_schedulable_after_a_first_byte_timeout() -> None:
    silent = FakeEngine(silent=True, report_capacity=False)
    with serving(silent) as es:
        with gateway([{"name": "slow", "url": es.url}], server={"first_byte_timeout_s": 0.3}) as gw:
            assert gw.chat("p").status_code == 504
            # The failure opened the circuit; the probe it triggered found /health fine.
            wait_until(lambda: healthy_in_pool(gw, "slow"), 10, message="the circuit closes again")
            again = gw.chat("p")
            accounting = gw.accounting("slow")
    assert again.status_code == 504  # scheduled on it again (not 503 "no backend")
    assert accounting["healthy"] and accounting["reserved"] == 0


# ------------------------------------------------------------------ engine refuses connections
def test_an_engine_refusing_connections_is_left_by_its_programs_and_new_ones() -> None:
    a, b = FakeEngine(), FakeEngine()
    server_a = ServerThread(a).start()
    try:
        with serving(b) as server_b:
            backends = [{"name": "a", "url": server_a.url}, {"name": "b", "url": server_b.url}]
            # No periodic probe during the test: the refused calls alone must open the circuit.
            with gateway(backends, server={"probe_interval_s": 3600}) as gw:
                for pid in ("p0", "p1", "p2", "p3"):
                    assert gw.chat(pid).status_code == 200
                on_a = gw.active_on("a")
                assert len(on_a) >= 2, "precondition: two programs placed on engine a"
                caller, idle = on_a[0], on_a[1]
                calls_on_a = len(a.received)
                server_a.stop()  # nothing listens on a's port any more

                rerouted = gw.chat(caller)
                after_refusal = gw.accounting("a")
                idle_view = gw.program(idle)
                new = gw.chat("newcomer")
                idle_next = gw.chat(idle)
                views = {pid: gw.program(pid) for pid in (caller, idle, "newcomer")}
                pool_healthy = healthy_in_pool(gw, "a")
                final = gw.accounting("a")
    finally:
        server_a.stop()
    assert rerouted.status_code == 200 and new.status_code == 200 and idle_next.status_code == 200
    assert len(a.received) == calls_on_a  # nothing reached a after it went away
    assert not pool_healthy and not after_refusal["healthy"]  # circuit open
    # The idle program left a at once: not ACTIVE there, nothing reserved, still ACTING.
    assert idle_view["state"] == "paused" and idle_view["phase"] == "acting"
    assert after_refusal["reserved"] == 0 and after_refusal["programs"] == 0
    assert all(v["backend"] == "b" and v["state"] == "active" for v in views.values())
    assert final["reserved"] == 0 and final["programs"] == 0


@pytest.mark.slow  # ~3 s
def test_a_program_held_while_its_engine_goes_away_runs_on_the_other_engine() -> None:
    slow: dict[str, Any] = {"chunks": 30, "chunk_delay_s": 0.1}  # each hog streams for about 3 s
    a, b = FakeEngine(**slow), FakeEngine(**slow)
    server_a = ServerThread(a).start()
    try:
        with serving(b) as server_b:
            # Room for one hog (about 1,020 tokens) each, not for a hog and the held call.
            backends = [
                {"name": "a", "url": server_a.url, "capacity_tokens": 1100},
                {"name": "b", "url": server_b.url, "capacity_tokens": 1100},
            ]
            with gateway(backends, server={"probe_interval_s": 0.1}) as gw:
                hogs = [start_hog(gw.url, "hog-a"), start_hog(gw.url, "hog-b")]
                assert gw.program("hog-a")["backend"] == "a"
                assert gw.program("hog-b")["backend"] == "b"
                answer: dict[str, httpx.Response] = {}
                held = threading.Thread(
                    target=lambda: answer.setdefault("r", gw.chat("held", timeout=30, **BIG))
                )
                held.start()
                wait_for(gw.url, "held", waiting=1)
                # a stops listening (refuses new connections) and lets hog-a's stream finish.
                server_a.server.should_exit = True
                wait_until(
                    lambda: not gw.accounting("a")["healthy"], 10, message="a's circuit opens"
                )
                for hog in hogs:
                    hog.join()
                held.join(timeout=30)
                program = gw.program("held")
                hog_a = gw.program("hog-a")
                accounting = gw.accounting("a")
    finally:
        server_a.stop()
    assert answer["r"].status_code == 200
    assert program["backend"] == "b" and program["state"] == "active"
    assert [r.body["messages"] for r in b.received][-1] == BIG["messages"]
    # hog-a's call ended after a was gone: it left a rather than stay counted there.
    assert hog_a["state"] == "paused" and hog_a["phase"] == "acting"
    assert accounting["reserved"] == 0 and accounting["programs"] == 0


# ------------------------------------------------------------------ engine restarts
def test_a_restarted_engine_is_rediscovered_with_its_new_capacity_and_used_again() -> None:
    port = free_port()
    before = FakeEngine(num_blocks=100, block_size=16)  # 1,600 tokens
    first = ServerThread(before, port).start()
    try:
        with gateway([{"name": "e", "url": first.url}], server={"probe_interval_s": 0.1}) as gw:
            assert gw.chat("p").status_code == 200
            assert gw.accounting("e")["capacity"] == 1600
            first.stop()
            wait_until(lambda: not gw.accounting("e")["healthy"], 10, message="the circuit opens")
            down = gw.chat("p")
            during = gw.accounting("e")

            after = FakeEngine(num_blocks=50, block_size=16)  # restarted with 800 tokens
            with serving(after, port):
                wait_until(
                    lambda: gw.accounting("e")["capacity"] == 800, 10, message="capacity re-read"
                )
                pool_view = httpx.get(f"{gw.url}/health").json()["backends"][0]
                again = gw.chat("p")
                program = gw.program("p")
                closed = gw.accounting("e")
    finally:
        first.stop()
    assert down.status_code == 503 and down.json()["error"]["code"] == "no_backend"
    assert during["reserved"] == 0 and during["programs"] == 0
    assert pool_view["healthy"] and pool_view["capacity_tokens"] == 800
    assert pool_view["capacity_source"] == "engine"
    assert again.status_code == 200 and len(after.received) == 1
    assert program["backend"] == "e" and program["state"] == "active"
    assert closed["healthy"] and closed["programs"] == 1


# ------------------------------------------------------------------ the core, driven directly
def _core() -> SchedulerCore:
    return SchedulerCore([("a", 1000), ("b", 1000)], build_pipeline(POLICIES))


def _request(core: SchedulerCore, pid: str, tokens: int, now: float) -> Any:
    ctx = AgentContext(program_id=pid, source=Convention.THUNDERAGENT)
    return core.handle(
        RequestArrived(ctx, RequestInfo(prompt_chars=0, max_tokens=tokens), now)
    ).decision


def test_core_a_call_failing_on_a_dead_engine_leaves_nothing_counted_there() -> None:
    core = _core()
    assert _request(core, "p", 600, 0.0).backend == "a"
    core.handle(BackendChanged("a", healthy=False, now=1.0))  # the call is still in flight there
    assert core.backends["a"].reserved >= 600
    core.handle(CallFinished("p", None, False, 2.0))
    program = core.table.get("p")
    assert program is not None and program.state is ProgramState.PAUSED
    assert core.backends["a"].reserved == 0 and core.table.programs_on("a") == 0
    assert _request(core, "p", 100, 3.0).backend == "b"


def test_core_refused_connection_also_unplaces_the_engines_idle_programs() -> None:
    core = _core()
    for pid in ("caller", "other", "idle"):
        _request(core, pid, 100, 0.0)
        core.handle(CallFinished(pid, Usage(50, 10), True, 0.5))
    on_a = [p.program_id for p in core.programs() if p.backend == "a"]
    assert len(on_a) == 2
    caller, idle = on_a
    _request(core, caller, 100, 1.0)
    assert core.handle(ConnectionRefused(caller, "a", 1.1)).backend == "b"
    idle_program = core.table.get(idle)
    assert idle_program is not None and idle_program.state is ProgramState.PAUSED
    assert core.backends["a"].reserved == 0 and core.table.programs_on("a") == 0


def test_core_paused_and_held_programs_of_a_dead_engine_resume_on_the_other() -> None:
    core = _core()
    assert _request(core, "paused", 200, 0.0).backend == "a"
    core.handle(CallFinished("paused", Usage(150, 50), True, 1.0))
    # as the pause stage would
    core.handle(DecisionsApplied([Pause(_program(core, "paused"))], 1.5))
    assert _request(core, "hog-a", 950, 2.0).backend == "a"
    assert _request(core, "hog-b", 950, 2.0).backend == "b"
    assert _request(core, "held", 500, 3.0).program_id == "held"  # Hold: nothing fits
    assert _request(core, "paused", 200, 3.0).program_id == "paused"  # Hold as well
    core.handle(BackendChanged("a", healthy=False, now=4.0))
    core.handle(CallFinished("hog-a", None, False, 5.0))  # its call died with the engine
    assert core.backends["a"].reserved == 0  # a has room in the books, but is down
    core.handle(ReleaseRequested("hog-b", "release", 6.0))
    placed = {p.program_id: (p.state, p.backend) for p in core.programs()}
    assert placed["held"] == (ProgramState.ACTIVE, "b")
    assert placed["paused"] == (ProgramState.ACTIVE, "b")
    assert core.table.programs_on("a") == 0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def one_engine_pool(url: str) -> AsyncIterator[tuple[BackendPool, Backend]]:
    """A started pool of the one engine at `url`, probed only at start and when told."""
    pool = BackendPool([BackendSettings(name="e", url=url)], ServerSettings(probe_interval_s=3600))
    await pool.start()
    try:
        backend = pool.get("e")
        assert backend is not None
        yield pool, backend
    finally:
        await pool.stop()


@pytest.mark.anyio
async def test_an_engine_that_ignores_the_restricted_page_is_read_whole(
    engine: FakeEngine,
) -> None:
    # The fake answers /metrics/ as /metrics, with no usage sample: the probe falls back to
    # the whole page, reads its capacity there, and asks by name no more.
    async with one_engine_pool(engine.url) as (pool, backend):
        await pool.probe(backend)
        assert backend.restricted_metrics is False
        assert backend.discovered_capacity == engine.num_blocks * engine.block_size
    asked, *then = (urlsplit(page) for page in engine.pages)
    wanted = urlsplit(restricted_page_target(SCRAPED_SAMPLES["vllm"]))
    assert (asked.path, parse_qs(asked.query)) == (wanted.path, parse_qs(wanted.query))
    assert [page.geturl() for page in then] == ["/metrics", "/metrics"]


@pytest.mark.anyio
async def test_pool_probes_an_engine_at_once_after_a_failed_call(engine: FakeEngine) -> None:
    probed = asyncio.Event()
    async with one_engine_pool(engine.url) as (pool, backend):
        pool.listeners.append(lambda backend, metrics: probed.set())
        pool.record_failure(backend, "injected")
        assert backend.healthy  # one failure makes it suspect, not down
        await asyncio.wait_for(probed.wait(), 5)
        assert backend.healthy  # the engine answers its probe: it stays in service


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("well_for_s", "dead_within_s"),
    [
        # Still well at its first probe, gone at the recheck a second later.
        (0.2, SUSPECT_RECHECK_S + 0.5),
        # On a loaded host a killed engine's API server can answer /health past the first
        # recheck: the later ones (growing intervals) still see it go.
        (SUSPECT_RECHECK_S + 0.5, SUSPECT_RECHECKS_S[1] + 0.5),
    ],
)
async def test_a_suspect_engine_that_still_answers_is_checked_again(
    well_for_s: float, dead_within_s: float
) -> None:
    """An engine being killed can answer /health for a moment after a call on it broke; a
    later look finds it gone, with no further call and no periodic probe."""
    engine = FakeEngine()
    with serving(engine) as es:
        async with one_engine_pool(es.url) as (pool, backend):
            pool.suspect(backend)
            await asyncio.sleep(well_for_s)
            still_up = backend.healthy
            engine.health_status = 503  # it dies
            await asyncio.sleep(dead_within_s)
            down = not backend.healthy
    assert still_up and down
