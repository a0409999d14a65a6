"""KV-aware placement of new programs: where their shared prefix is already cached.

A new program (or a context-less request, an ephemeral program of its own) has no home
engine; the migration stage would put it on the engine with the most room. This stage puts
it where its prefix already is — the system prompt of its kind (`RequestInfo.prefix_key`:
the request's system message live, the session type's in the benchmark harness), and for a
sub-agent without one of its own, its parent program's — weighing the prefill that saves
against the load there, as the `kv_aware` baseline (Dynamo's KvRouter, SGLang's cache-aware
policy) does per request, from the same approximate index (policies/prefix_index.py).
Only engines that admit the program are candidates: the load limits are the admission
stage's. Programs with a home engine are left to the migration stage's rules.
"""

from __future__ import annotations

from thunder_mw.policies.prefix_index import PrefixIndex
from thunder_mw.policies.program_table import ProgramState
from thunder_mw.policies.stage_contract import Decisions, Stage, StageView
from thunder_mw.policies.views import BackendView, ProgramView

# Re-exported: stage authors and older code import these names from here.
from thunder_mw.schemas.stage_params import KvPlacementParams as KvPlacementParams
from thunder_mw.schemas.stage_params import StageParams as StageParams

__all__ = ["KvPlacement"]


class KvPlacement(Stage):
    """Places programs that have no home engine by room plus cached prefix; list it before
    the `migration` stage (the first stage with an answer places the program)."""

    name = "kv_placement"
    Params = KvPlacementParams
    params: KvPlacementParams

    def __init__(self, params: StageParams | None = None) -> None:
        super().__init__(params)
        self.index: PrefixIndex | None = None
        self._cold: dict[str, float | None] = {}

    def bind(self, view: StageView) -> Decisions:
        self.index = PrefixIndex(
            lambda label: view.backends[label].capacity if label in view.backends else None,
            self.params.index_fraction,
        )
        return ()

    def prefix_of(self, view: StageView, program: ProgramView) -> tuple[str | None, int]:
        """The program's prefix key and tokens; a sub-agent without one shares its parent's."""
        if program.prefix_key is not None:
            return program.prefix_key, program.prefix_tokens
        parent = view.program(program.parent_program_id) if program.parent_program_id else None
        if parent is not None and parent.prefix_key is not None:
            return parent.prefix_key, parent.prefix_tokens
        return None, 0

    def place(self, view: StageView, program: ProgramView, now: float) -> str | None:
        if program.backend is not None or self.index is None:
            return None  # it has a home: the migration stage's rules
        fitting = [b for b in view.healthy_backends() if view.admits(program, b, now)]
        if not fitting:
            return None
        for backend in fitting:
            self._sync_cold(backend)
        key, _ = self.prefix_of(view, program)
        parent = view.program(program.parent_program_id) if program.parent_program_id else None
        parent_home = parent.backend if parent is not None else None
        weight = self.params.overlap_weight
        index = self.index

        def score(backend: BackendView) -> tuple[float, int, bool, str]:
            overlap = index.overlap(backend.label, key) if key is not None else 0
            return (
                -(view.room(backend) + weight * overlap),
                -overlap,
                backend.label != parent_home,
                backend.label,
            )

        return min(fitting, key=score).label

    def _remember(self, view: StageView, program: ProgramView) -> None:
        key, tokens = self.prefix_of(view, program)
        backend = view.backends.get(program.backend) if program.backend else None
        if key is not None and tokens > 0 and backend is not None and self.index:
            self._sync_cold(backend)
            self.index.remember(backend.label, key, tokens)

    def on_resumed(
        self, view: StageView, program: ProgramView, previous: str | None, now: float
    ) -> Decisions:
        self._remember(view, program)
        return ()

    def on_request(self, view: StageView, program: ProgramView, now: float) -> Decisions:
        if program.state is ProgramState.ACTIVE:
            self._remember(view, program)  # refreshes the prefix's recency where it runs
        return ()

    def _sync_cold(self, backend: BackendView) -> None:
        if self.index is not None and self._cold.get(backend.label) != backend.cold_since:
            # A weight update flushed its cache: it holds none of the prefixes any more.
            self._cold[backend.label] = backend.cold_since
            if backend.cold_since is not None:
                self.index.forget_backend(backend.label)
