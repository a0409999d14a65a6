"""The Docker tool manager: adopts the containers programs name, reclaims them when programs end.

Safety first: a container is adopted only if it matches the selector and nobody else owns
it, ownership and reclaims are journalled before they are acted on, and only journalled
containers are ever stopped or removed. Docker calls run on worker threads (DockerEngine);
a failing call is retried with backoff from the sweep loop and reported in /health.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from thunder_mw.policies.core import Action, ReclaimTools, Released
from thunder_mw.policies.tool_selector import BUILTIN_HOOKS, Selector, reclaim_steps, retry_delay_s
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import DockerToolSettings, SandboxTemplate
from thunder_mw.schemas.views import ContainerView, SandboxView
from thunder_mw.tools._journal import Entry, ToolJournal
from thunder_mw.tools.docker_engine import (
    ContainerGone,
    ContainerInfo,
    CustomHook,
    DockerEngine,
    EngineDown,
    load_hook,
)
from thunder_mw.tools.refusal import ToolRefused

__all__ = ["DEFAULT_HOOKS", "TEMPLATE_LABEL", "DockerTools"]

log = logging.getLogger("thunder_mw.tools")

TEMPLATE_LABEL = "thunder-mw.template"
_DISK_EVERY_SWEEPS = 5
DEFAULT_HOOKS = ("stop", "remove")


class DockerTools:
    def __init__(
        self,
        settings: DockerToolSettings,
        is_live: Callable[[str], bool],
        clock: Callable[[], float] = time.monotonic,
        on_reclaimed: Callable[[str], None] | None = None,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.selector = Selector(settings.selector_label, settings.selector_name_prefix)
        self.is_live = is_live
        self.clock = clock
        self.on_reclaimed = on_reclaimed or (lambda reason: None)
        self.on_failure = on_failure or (lambda: None)
        self.engine = DockerEngine(
            settings.engine_url, settings.max_concurrent_calls, settings.call_timeout_s
        )
        self.journal = ToolJournal(settings.journal_path)
        self.templates = {t.name: t for t in settings.templates}
        self.custom: dict[str, CustomHook] = {
            h: load_hook(h) for h in settings.reclaim or () if h not in BUILTIN_HOOKS
        }
        self.enabled = False
        self.disabled_reason: str | None = "not started"
        self.engine_up = False
        self.engine_version: str | None = None
        self.last_error: str | None = None
        self.adoptions_deferred = 0
        self.disk_bytes = 0
        self.disk_containers = 0
        # Every container the gateway is responsible for, by journal key.
        self._entries: dict[str, Entry] = {}
        self._by_program: dict[str, set[str]] = {}
        # Refs (ids or names, as clients spell them) already adopted: the hot path's cache.
        self._refs: dict[str, set[str]] = {}
        self._ending: dict[str, tuple[str, tuple[str, ...] | None]] = {}
        self._ready: dict[str, list[Entry]] = {name: [] for name in self.templates}
        self._filling: dict[str, int] = dict.fromkeys(self.templates, 0)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._sweeps = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Probes the engine, reloads the journal, and resumes what a previous run left."""
        try:
            self.engine_version = await self.engine.call(self.engine.ping)
            self.engine_up = True
        except EngineDown as exc:
            self.last_error = str(exc)
            if self.settings.enabled == "auto":
                self.disabled_reason = f"no Docker engine answers ({exc})"
                log.warning("Docker tool manager disabled: %s", self.disabled_reason)
                self.engine.close()
                return
            log.warning("Docker engine down at start-up; will retry: %s", exc)
        for custom in self.custom:
            log.info("custom reclaim hook %s loaded", custom)
        entries = await self.journal.open()
        self.enabled, self.disabled_reason = True, None
        now = self.clock()
        for e in entries:
            self._track(e)
            if e.state == "owned":
                e.unseen_since = now  # its program gets the grace period to come back
            elif e.state in ("pool", "creating"):
                # Nobody was handed it: nothing to keep.
                e.state, e.hooks, e.reason = "reclaiming", ["remove"], "pool"
        if entries:
            await self.journal.put(*[e for e in entries if e.state == "reclaiming"])
            log.info(
                "tool journal: %d container(s) from a previous run (%d to reclaim)",
                len(entries),
                sum(1 for e in entries if e.state == "reclaiming"),
            )
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="thunder-mw-tools")
        self._refill()
        log.info(
            "Docker tool manager on: engine %s, selector %s, journal %s",
            self.engine_version or "(down)",
            self.selector.describe(),
            self.settings.journal_path,
        )

    async def stop(self) -> None:
        """Reclaims the warm pool; owned containers stay journalled for the next start."""
        if not self.enabled:
            return
        self.enabled = False
        self.disabled_reason = "stopped"
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        pool = [e for ready in self._ready.values() for e in ready]
        for ready in self._ready.values():
            ready.clear()
        if pool:
            for e in pool:
                e.state, e.hooks, e.reason = "reclaiming", ["remove"], "pool"
            await self.journal.put(*pool)
            self._tasks.update(asyncio.ensure_future(self._reclaim(e)) for e in pool)
        if self._tasks:
            # Fills under way finish (and their containers are journalled); what does not
            # finish in time stays journalled and is reclaimed on the next start.
            await asyncio.wait(self._tasks, timeout=self.settings.call_timeout_s)
        pending = [e for e in self._entries.values() if e.state == "pool"]
        if pending:
            await asyncio.gather(*(self._reclaim(e) for e in pending if not e.busy))
        await self.journal.close()
        self.engine.close()

    # ------------------------------------------------------------------ adoption (the gate)
    async def adopt(self, ctx: AgentContext) -> None:
        program_id = ctx.program_id
        known = self._refs.get(program_id)
        if known is not None and known.issuperset(ctx.docker_ids):
            return
        if not self.enabled:
            return
        todo = [(i, ref) for i, ref in enumerate(ctx.docker_ids) if not known or ref not in known]
        found = await asyncio.gather(
            *(self.engine.call(self.engine.inspect, ref) for _, ref in todo),
            return_exceptions=True,
        )
        vetted: list[tuple[str, ContainerInfo]] = []
        for (i, ref), info in zip(todo, found, strict=True):
            param = f"docker_ids[{i}]"
            if isinstance(info, ContainerGone):
                raise ToolRefused(400, f"no container {ref!r}", param, "container_not_found")
            if isinstance(info, BaseException):
                # Engine down: the request is served; the container stays unmanaged (never
                # touched) and adoption is tried again on the program's next request.
                self._engine_failed(info)
                self.adoptions_deferred += 1
                continue
            if not self.selector.matches(info.labels, info.name):
                raise ToolRefused(
                    403,
                    f"container {ref!r} is not a managed sandbox (it needs "
                    f"{self.selector.describe()})",
                    param,
                    "container_not_managed",
                )
            entry = self._entries.get(info.id)
            if entry is not None and (entry.state != "owned" or entry.program_id != program_id):
                raise ToolRefused(409, _conflict(ref, entry), param, _conflict_code(entry))
            vetted.append((ref, info))
        # Claimed in memory before the first await, so a concurrent request sees the owner.
        new: list[Entry] = []
        for _, info in vetted:
            if info.id not in self._entries:
                entry = Entry(info.id, info.name, program_id, "owned", image_id=info.image_id)
                self._track(entry)
                new.append(entry)
        if new:
            try:
                await self.journal.put(*new)
            except Exception as exc:
                for entry in new:
                    self._untrack(entry)
                log.exception("tool journal write failed")
                raise ToolRefused(
                    503, f"the tool journal cannot record ownership: {exc}", "docker_ids", "journal"
                ) from None
            log.info("adopt program=%s containers=%s", program_id, ",".join(e.name for e in new))
        if not vetted:
            # Nothing adopted (the engine is down): an empty entry would outlive the program,
            # since only a program that owns containers is looked up when it ends.
            return
        refs = self._refs.setdefault(program_id, set())
        for ref, info in vetted:
            refs.update((ref, info.id, info.name))

    # ------------------------------------------------------------------ reclaim triggers
    def on_action(self, action: Action) -> None:
        """LiveScheduler listener: a program that ends loses its containers."""
        if isinstance(action, Released):
            self.end_program(action.program_id, action.reason, None)
        elif isinstance(action, ReclaimTools):
            self.end_program(action.program_id, action.reason, action.hooks)

    def end_program(self, program_id: str, reason: str, hooks: tuple[str, ...] | None) -> None:
        """Schedules the reclaim of everything `program_id` owns, with `tools.docker.reclaim`,
        else the gc_hooks stage's list, else stop and remove."""
        if not self.enabled or program_id not in self._by_program:
            return
        first = program_id not in self._ending
        previous = self._ending.get(program_id, (reason, None))[1]
        self._ending[program_id] = (reason, hooks if hooks is not None else previous)
        if first:
            # Released and ReclaimTools arrive in one batch: act once, after both.
            asyncio.get_running_loop().call_soon(self._start_reclaim, program_id)

    def _start_reclaim(self, program_id: str) -> None:
        reason, hooks = self._ending.pop(program_id)
        if self.is_live(program_id):
            return  # released and back already (a new request): the containers stay its own
        self._refs.pop(program_id, None)
        entries = [
            self._entries[k]
            for k in self._by_program.get(program_id, ())
            if self._entries[k].state == "owned"
        ]
        if not entries:
            return
        chosen = list(self.settings.reclaim or hooks or DEFAULT_HOOKS)
        for e in entries:
            e.state, e.hooks, e.reason = "reclaiming", chosen, reason
        self._spawn(self._journal_then_reclaim(entries))

    async def _journal_then_reclaim(self, entries: list[Entry]) -> None:
        await self.journal.put(*entries)
        await asyncio.gather(*(self._reclaim(e) for e in entries))

    def release_unknown(self, program_id: str) -> int:
        """A release naming a program the scheduler does not know (handed sandboxes before
        its first request): reclaims what it owns; returns how many."""
        n = sum(
            1 for k in self._by_program.get(program_id, ()) if self._entries[k].state == "owned"
        )
        if n:
            self.end_program(program_id, "release", None)
        return n

    async def _reclaim(self, e: Entry) -> None:
        if e.busy or e.key not in self._entries:
            return
        e.busy = True
        steps, drop_image = reclaim_steps(e.hooks, self.settings.remove_images)
        try:
            for step in steps:
                if step not in BUILTIN_HOOKS and step not in self.custom:
                    self.custom[step] = load_hook(step)  # named by the gc_hooks stage
            if e.key.startswith("name:"):
                await self.engine.call(self.engine.force_remove, e.name)
            else:
                await self.engine.call(
                    self.engine.reclaim,
                    e.key,
                    steps,
                    self.custom,
                    e.program_id or "",
                    e.reason or "",
                    self.settings.stop_timeout_s,
                )
            if drop_image and e.image_id and "remove" in steps:
                await self.engine.call(self.engine.remove_image_if_unused, e.image_id)
        except Exception as exc:
            e.attempts += 1
            e.last_error = f"{type(exc).__name__}: {exc}"
            e.next_attempt_at = self.clock() + retry_delay_s(
                e.attempts, self.settings.retry_max_interval_s
            )
            self.on_failure()
            if isinstance(exc, EngineDown):
                self._engine_failed(exc)
            log.warning(
                "reclaim of %s (program %s) failed, attempt %d, retrying: %s",
                e.name,
                e.program_id,
                e.attempts,
                e.last_error,
            )
            with contextlib.suppress(Exception):
                await self.journal.put(e)
            return
        finally:
            e.busy = False
        self._untrack(e)
        await self.journal.delete(e.key)
        self.on_reclaimed(e.reason or "unknown")
        log.info("reclaimed %s program=%s reason=%s", e.name, e.program_id, e.reason)

    # ------------------------------------------------------------------ the sweep loop
    async def _sweep_loop(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("tool sweep failed")
            await asyncio.sleep(self.settings.sweep_interval_s)

    async def sweep(self) -> None:
        """Retries due reclaims, ends orphans past their grace, refills pools, reads disk."""
        now = self.clock()
        orphans: dict[str, list[Entry]] = {}
        for e in list(self._entries.values()):
            if e.state == "reclaiming" and not e.busy and e.next_attempt_at <= now:
                self._spawn(self._reclaim(e))
            elif e.state == "owned" and e.program_id is not None:
                if self.is_live(e.program_id) or e.program_id in self._ending:
                    e.unseen_since = None
                elif e.unseen_since is None:
                    e.unseen_since = now
                elif now - e.unseen_since >= self.settings.grace_period_s:
                    orphans.setdefault(e.program_id, []).append(e)
        for program_id in orphans:
            log.info("program %s is gone: reclaiming its containers", program_id)
            self.end_program(program_id, "orphaned", None)
        if self._sweeps % _DISK_EVERY_SWEEPS == 0 or not self.engine_up:
            await self._read_disk()
        self._sweeps += 1
        self._refill()

    async def _read_disk(self) -> None:
        try:
            self.disk_bytes, self.disk_containers = await self.engine.call(
                self.engine.managed_disk_bytes,
                self.settings.selector_label,
                self.settings.selector_name_prefix,
            )
        except EngineDown as exc:
            self._engine_failed(exc)
            return
        if not self.engine_up:
            log.info("Docker engine answers again")
        self.engine_up = True

    def _engine_failed(self, exc: BaseException) -> None:
        self.engine_up = False
        self.last_error = f"{type(exc).__name__}: {exc}"

    # ------------------------------------------------------------------ warm pool
    async def hand_out(self, program_id: str, template_name: str) -> SandboxView:
        """A started sandbox for `program_id`: from the warm pool, else started now."""
        if not self.enabled:
            raise ToolRefused(404, "the Docker tool manager is off", "template", "tools_disabled")
        template = self.templates.get(template_name)
        if template is None:
            raise ToolRefused(
                404,
                f"no sandbox template {template_name!r} (known: {sorted(self.templates)})",
                "template",
                "template_not_found",
            )
        started = self.clock()
        ready = self._ready[template.name]
        warm = bool(ready)
        if ready:
            entry = ready.pop(0)
            entry.state, entry.program_id = "owned", program_id
            self._index(entry)
            await self.journal.put(entry)
        else:
            try:
                entry = await self._create(template, program_id)
            except EngineDown as exc:
                self._engine_failed(exc)
                raise ToolRefused(
                    503, f"cannot start a sandbox: {exc}", "template", "engine_unavailable"
                ) from None
        self._refill()
        if self.is_live(program_id):
            self._refs.setdefault(program_id, set()).update((entry.key, entry.name))
        log.info(
            "sandbox %s -> program %s (%s)", entry.name, program_id, "warm" if warm else "cold"
        )
        return SandboxView(
            program_id=program_id,
            container_id=entry.key,
            name=entry.name,
            template=template.name,
            warm=warm,
            ready_s=round(self.clock() - started, 4),
        )

    async def _create(self, template: SandboxTemplate, program_id: str | None) -> Entry:
        prefix = self.settings.selector_name_prefix or "thunder-mw-"
        name = f"{prefix}{template.name}-{uuid.uuid4().hex[:12]}"
        entry = Entry(
            f"name:{name}",
            name,
            program_id,
            "creating",
            template=template.name,
            hooks=["remove"],
            reason="pool",
        )
        self._track(entry)
        await self.journal.put(entry)  # a crash from here on leaves a name to remove
        labels = {**self.selector.labels(), TEMPLATE_LABEL: template.name}
        try:
            info = await self.engine.call(self.engine.create, template, name, labels)
        except Exception:
            entry.state = "reclaiming"  # the sweep removes whatever half-exists
            raise
        old = entry.key
        self._untrack(entry)
        entry.key, entry.image_id = info.id, info.image_id
        entry.state = "owned" if program_id is not None else "pool"
        entry.hooks, entry.reason = [], None
        self._track(entry)
        await self.journal.rekey(old, entry)
        return entry

    def _refill(self) -> None:
        if not self.enabled or not self.engine_up:
            return
        for name, template in self.templates.items():
            missing = template.pool_size - len(self._ready[name]) - self._filling[name]
            for _ in range(max(0, missing)):
                self._filling[name] += 1
                self._spawn(self._fill_one(template))

    async def _fill_one(self, template: SandboxTemplate) -> None:
        try:
            entry = await self._create(template, None)
        except Exception as exc:
            self._engine_failed(exc)
            log.warning("warm pool %s: cannot start a sandbox: %s", template.name, exc)
            return
        finally:
            self._filling[template.name] -= 1
        if self.enabled:
            self._ready[template.name].append(entry)
        else:
            entry.state, entry.hooks, entry.reason = "reclaiming", ["remove"], "pool"
            await self._reclaim(entry)

    # ------------------------------------------------------------------ bookkeeping
    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _track(self, e: Entry) -> None:
        self._entries[e.key] = e
        self._index(e)

    def _index(self, e: Entry) -> None:
        if e.program_id is not None:
            self._by_program.setdefault(e.program_id, set()).add(e.key)

    def _untrack(self, e: Entry) -> None:
        self._entries.pop(e.key, None)
        if e.program_id is not None:
            keys = self._by_program.get(e.program_id)
            if keys is not None:
                keys.discard(e.key)
                if not keys:
                    del self._by_program[e.program_id]

    # ------------------------------------------------------------------ visibility
    def containers_of(self, program_id: str) -> list[ContainerView]:
        return [_view(self._entries[k]) for k in sorted(self._by_program.get(program_id, ()))]

    def counts(self) -> dict[str, int]:
        counts = {"owned": 0, "reclaiming": 0, "pool": 0, "creating": 0}
        for e in self._entries.values():
            counts[e.state] = counts.get(e.state, 0) + 1
        return counts

    def status(self) -> dict[str, Any]:
        if not self.enabled:
            return {"enabled": False, "reason": self.disabled_reason}
        failing = [e for e in self._entries.values() if e.state == "reclaiming" and e.attempts]
        return {
            "enabled": True,
            "engine_up": self.engine_up,
            "engine_version": self.engine_version,
            "selector": self.selector.describe(),
            "containers": self.counts(),
            "pool_ready": {name: len(r) for name, r in self._ready.items()},
            "reclaims_failing": [_view(e) for e in failing[:20]],
            "adoptions_deferred": self.adoptions_deferred,
            "disk_bytes": self.disk_bytes,
            "last_error": self.last_error,
        }


def _view(e: Entry) -> ContainerView:
    view = ContainerView(id=e.key, name=e.name, state=e.state)
    if e.template:
        view.template = e.template
    if e.state == "reclaiming":
        view.reason = e.reason
        view.attempts = e.attempts
        view.last_error = e.last_error
    return view


def _conflict(ref: str, e: Entry) -> str:
    if e.state == "owned":
        return f"container {ref!r} is owned by program {e.program_id!r}"
    if e.state == "reclaiming":
        return f"container {ref!r} is being reclaimed (its program {e.program_id!r} ended)"
    return (
        f"container {ref!r} belongs to the warm sandbox pool; ask POST /programs/{{id}}/sandboxes"
    )


def _conflict_code(e: Entry) -> str:
    return {"owned": "container_owned", "reclaiming": "container_reclaiming"}.get(
        e.state, "container_in_pool"
    )
