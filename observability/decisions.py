"""Every scheduler decision (admit, pause, resume, migrate, release, reclaim) counted and logged.

Listens to `LiveScheduler.listeners`, so each action the core returns is seen exactly once:
it becomes a Prometheus counter increment, one structured log line (program id, backend and
reason as fields, for the JSON log format) and an entry in a short ring the dashboard shows.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from thunder_mw.policies.core import (
    Action,
    Paused,
    Prefill,
    ReclaimTools,
    Reject,
    Released,
    Resumed,
)
from thunder_mw.schemas.views import Decision

__all__ = ["DecisionLog"]

log = logging.getLogger("thunder_mw.decisions")


class DecisionLog:
    """Counts, logs and remembers the last `keep` decisions."""

    def __init__(
        self,
        registry: CollectorRegistry,
        released: Counter,
        *,
        log_decisions: bool = True,
        keep: int = 200,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._released = released  # the gateway's existing `thunder_mw_programs_released`
        self._log = log_decisions
        self._wall = wall_clock
        self.recent: collections.deque[Decision] = collections.deque(maxlen=keep)
        self.admissions = Counter(
            "thunder_mw_admissions",
            "Programs placed on a backend for the first time",
            ["backend"],
            registry=registry,
        )
        self.pauses = Counter(
            "thunder_mw_pauses",
            "Programs paused (their reservation handed back), by backend and reason "
            "(acting: paused at once; after_reasoning: paused when its call ended)",
            ["backend", "reason"],
            registry=registry,
        )
        self.pauses_marked = Counter(
            "thunder_mw_pauses_marked",
            "REASONING programs marked to pause once their call ends",
            ["backend"],
            registry=registry,
        )
        self.resumes = Counter(
            "thunder_mw_resumes",
            "Paused programs resumed (including migrations, excluding forced resumes)",
            ["backend"],
            registry=registry,
        )
        self.forced_resumes = Counter(
            "thunder_mw_forced_resumes",
            "Paused programs resumed by the resume timeout, whether or not they fit",
            ["backend"],
            registry=registry,
        )
        self.migrations = Counter(
            "thunder_mw_migrations",
            "Programs resumed on another backend than their last (KV recomputed there)",
            ["backend", "from_backend"],
            registry=registry,
        )
        self.rejections = Counter(
            "thunder_mw_held_rejections",
            "Held requests answered with an error instead of running, by code",
            ["code"],
            registry=registry,
        )
        self.reclaims = Counter(
            "thunder_mw_reclaim_decisions",
            "Decisions to reclaim a program's tool containers, by reason",
            ["reason"],
            registry=registry,
        )

    def on_action(self, action: Action) -> None:
        if isinstance(action, Resumed):
            if action.admitted:
                kind = "admit"
                self.admissions.labels(action.backend).inc()
            elif action.forced:
                kind = "force-resume"
                self.forced_resumes.labels(action.backend).inc()
            else:
                kind = "resume"
                self.resumes.labels(action.backend).inc()
            reason = "fits" if not action.forced else "resume_timeout"
            if action.migrated:
                assert action.previous_backend is not None
                self.migrations.labels(action.backend, action.previous_backend).inc()
                kind = "migrate" if not action.forced else kind
                reason = f"from {action.previous_backend}"
            self._record(kind, action.program_id, action.backend, reason)
        elif isinstance(action, Paused):
            if action.pending:
                self.pauses_marked.labels(action.backend).inc()
                self._record("pause-marked", action.program_id, action.backend, action.reason)
            else:
                self.pauses.labels(action.backend, action.reason).inc()
                self._record("pause", action.program_id, action.backend, action.reason)
        elif isinstance(action, Released):
            self._released.labels(action.reason).inc()
            self._record("release", action.program_id, None, action.reason)
        elif isinstance(action, ReclaimTools):
            self.reclaims.labels(action.reason).inc()
            self._record(
                "reclaim",
                action.program_id,
                None,
                f"{action.reason}: {len(action.container_ids)} container(s)",
            )
        elif isinstance(action, Prefill):
            self._record("prefill", action.program_id, action.backend, action.reason)
        elif isinstance(action, Reject):
            self.rejections.labels(action.code).inc()
            self._record("reject", action.program_id, None, action.code)

    def _record(self, decision: str, program_id: str, backend: str | None, reason: str) -> None:
        self.recent.append(Decision(self._wall(), decision, program_id, backend, reason))
        if self._log and log.isEnabledFor(logging.INFO):
            fields: dict[str, Any] = {
                "decision": decision,
                "program_id": program_id,
                "backend": backend,
                "reason": reason,
            }
            log.info(
                "%s program=%s backend=%s reason=%s",
                decision,
                program_id,
                backend or "-",
                reason,
                extra={"thunder": fields},
            )
