"""Agents against a gateway, and headless Chromium looking at its dashboard.

Load on a running gateway (the README's demo), to watch its dashboard:

    python -m thunder_mw.lab.dashboard_demo --url http://127.0.0.1:8300 [--programs 30]

The README screenshot (and the dashboard's browser test uses the same pieces):

    python -m thunder_mw.lab.dashboard_demo [--config config/demo.yaml]
        [--programs 30] [--after-s 22] [--output docs/dashboard.png]

starts the gateway on the demo config (two simulated engines), runs `--programs` agent
programs through it (growing contexts, tool pauses, streaming and non-streaming calls),
and screenshots /dashboard after `--after-s` seconds. Chromium is the system binary
(Debian's `chromium`; scripts/setup_chromium.sh), driven by its command line: no browser
download and no driver package needed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx

__all__ = ["CHROMIUM_NAMES", "WORDS", "agent", "chromium", "drive", "find_chromium", "main"]

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Words of ~4 characters: the simulator counts about four characters per token.
WORDS = ("tool", "diff", "file", "line", "pass", "fail", "test", "code", "data", "repo")


def find_chromium() -> str | None:
    explicit = os.environ.get("THUNDER_MW_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(
    url: str,
    *,
    screenshot: Path | None = None,
    window: tuple[int, int] = (1400, 900),
    budget_ms: int = 4000,
    timeout_s: float = 90.0,
    binary: str | None = None,
) -> str:
    """Loads `url` headless, lets its scripts run for `budget_ms` of virtual time, and returns
    the DOM as rendered then (or writes a screenshot). Raises on a missing browser."""
    exe = binary or find_chromium()
    if exe is None:
        raise FileNotFoundError("no Chromium binary (install Debian's `chromium`)")
    with tempfile.TemporaryDirectory(prefix="thunder-mw-chromium-") as profile:
        args = [
            exe,
            "--headless",
            "--no-sandbox",  # root in a container: the sandbox cannot start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={window[0]},{window[1]}",
            f"--virtual-time-budget={budget_ms}",
        ]
        args.append(f"--screenshot={screenshot}" if screenshot else "--dump-dom")
        done = subprocess.run(
            [*args, url], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def _text(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(tokens))


async def agent(
    client: httpx.AsyncClient,
    program_id: str,
    rng: random.Random,
    *,
    calls: int,
    growth_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
    tool_s: tuple[float, float],
    system: str,
    release: bool = True,
) -> None:
    """One agent run: every call resends the whole conversation plus a tool's output."""
    messages = [{"role": "system", "content": system}]
    for k in range(calls):
        messages.append({"role": "user", "content": _text(rng, rng.randint(*growth_tokens))})
        body: dict[str, Any] = {
            "model": "sim-model",
            "messages": messages,
            "max_tokens": rng.randint(*output_tokens),
            "ignore_eos": True,
            "program_id": program_id,
        }
        if k % 2:
            body["stream"] = True
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_raw():
                    pass
            answer = _text(rng, body["max_tokens"])
        else:
            r = await client.post("/v1/chat/completions", json=body)
            choices = r.json().get("choices") or [{}]
            answer = (choices[0].get("message") or {}).get("content") or ""
        messages.append({"role": "assistant", "content": answer})
        await asyncio.sleep(rng.uniform(*tool_s))  # the tool call
    if release:
        await client.post("/programs/release", json={"program_id": program_id})


async def drive(
    base_url: str,
    programs: int,
    *,
    seed: int = 0,
    calls: int = 8,
    growth_tokens: tuple[int, int] = (900, 2200),
    output_tokens: tuple[int, int] = (150, 400),
    tool_s: tuple[float, float] = (0.5, 4.0),
    stagger_s: float = 0.4,
    headers: dict[str, str] | None = None,
) -> None:
    """`programs` agents, started `stagger_s` apart, each of `calls` calls."""
    rng = random.Random(seed)
    system = _text(random.Random(seed + 1), 1500)
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, headers=headers) as client:

        async def started(i: int) -> None:
            await asyncio.sleep(i * stagger_s)
            await agent(
                client,
                f"agent-{i:02d}",
                random.Random(rng.random()),
                calls=calls,
                growth_tokens=growth_tokens,
                output_tokens=output_tokens,
                tool_s=tool_s,
                system=system,
            )

        await asyncio.gather(*(started(i) for i in range(programs)))


def _screenshot_demo(config_path: str, programs: int, after_s: float, output: Path) -> None:
    import threading

    import uvicorn

    from thunder_mw.cli.config_loader import load_config
    from thunder_mw.middleware.app import create_app

    config = load_config(config_path, {"server": {"port": 0}})
    config.tools.docker.enabled = False  # the screenshot is about scheduling
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the gateway did not start")
        threading.Event().wait(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"

    def load_until_stopped() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the gateway stops under it at the end
            asyncio.run(drive(url, programs))

    load = threading.Thread(target=load_until_stopped, daemon=True)
    load.start()
    try:
        threading.Event().wait(after_s)
        output.parent.mkdir(parents=True, exist_ok=True)
        chromium(f"{url}/dashboard", screenshot=output, window=(1440, 900), budget_ms=3000)
        print(f"wrote {output} ({output.stat().st_size // 1024} KiB)")
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description="Screenshot the dashboard of the demo under load")
    parser.add_argument("--url", help="only drive load on this running gateway")
    parser.add_argument("--token", help="the gateway's server.admin_token, if set")
    parser.add_argument("--config", default="config/demo.yaml")
    parser.add_argument("--programs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--after-s", type=float, default=22.0)
    parser.add_argument("--output", type=Path, default=Path("docs/dashboard.png"))
    args = parser.parse_args()
    if args.url:
        headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
        asyncio.run(drive(args.url.rstrip("/"), args.programs, seed=args.seed, headers=headers))
        return 0
    _screenshot_demo(args.config, args.programs, args.after_s, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
