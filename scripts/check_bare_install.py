"""A fresh install as a newcomer makes it: the wheel built from this tree, installed into a
bare venv with its declared dependencies only (no extras), then `thunder-mw --help`, every
subcommand's `--help`, a tool whose extra is missing, and the demo exactly as the README
prints it, answering one chat request sent by the real OpenAI client with `extra_body` and
releasing the program. Run by scripts/test.sh (and so by CI) outside the test venv; it needs
the `openai` client in the interpreter that runs it (the test extra), never in the bare venv.

    python3 scripts/check_bare_install.py [--keep DIR]

Prints the wheel's size and file count (the CHANGELOG names them) and exits non-zero, naming
the step, on the first failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The README's first command after the install; the check fails if the README stops saying it.
DEMO_COMMAND = "thunder-mw --config config/demo.yaml"
LISTENING = re.compile(r"thunder-mw listening on (http://\S+)")
# Optional dependencies that must NOT be in the bare venv (else the check proves nothing).
EXTRAS_ABSENT = ("numpy", "matplotlib", "tokenizers", "openai", "litellm", "minisweagent")


class Failed(Exception):
    """A step of the check failed; the message names it."""


def run(cmd: list[str], *, cwd: Path | None = None, timeout: float = 600) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise Failed(f"`{' '.join(cmd)}` exited {done.returncode}:\n{tail}")
    return done.stdout + done.stderr


def source_tree(dest: Path) -> Path:
    """The files git would commit (tracked and not ignored), copied: the wheel is built from
    what a clone has, never from a stale build/ or a local .cache."""
    listed = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def build_wheel(src: Path, out: Path) -> Path:
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)],
    )
    (wheel,) = out.glob("thunder_mw-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    bad = [n for n in names if "/results/" in n or n.startswith("thunder_mw/tests/")]
    if bad:
        raise Failed(f"the wheel carries files that are not the product: {bad[:5]}")
    size_kb = wheel.stat().st_size / 1024
    print(f"wheel {wheel.name}: {size_kb:.0f} KiB, {len(names)} files")
    return wheel


def bare_venv(venv: Path, wheel: Path) -> Path:
    run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "--quiet", str(wheel)])
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    present = run([str(venv / "bin" / "python"), "-c", probe, *EXTRAS_ABSENT]).strip()
    if present != "[]":
        raise Failed(f"the bare venv has optional packages, so it proves nothing: {present}")
    return venv / "bin" / "thunder-mw"


def check_help(exe: Path) -> None:
    run([str(exe), "--help"], timeout=60)
    names = run(
        [
            str(exe.parent / "python"),
            "-c",
            "from thunder_mw.cli.main import SUBCOMMANDS as S; print(' '.join(S))",
        ]
    ).split()
    for name in names:
        text = run([str(exe), name, "--help"], timeout=60)
        if f"usage: thunder-mw {name}" not in text:
            raise Failed(f"`thunder-mw {name} --help` printed no usage line:\n{text[-1000:]}")
    print(f"--help: thunder-mw and its {len(names)} subcommands")


def check_missing_extra(exe: Path) -> None:
    """The real-engine scenario needs numpy (its step-cost fit): without the `bench` extra it
    must say so and exit 2, with no traceback."""
    done = subprocess.run(
        [str(exe), "bench", "--scenario", "vllm-cpu-real", "--resimulate", "--no-plots"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    said = done.stdout + done.stderr
    if done.returncode != 2 or "thunder-mw[bench]" not in said or "Traceback" in said:
        raise Failed(f"a missing extra was not named (exit {done.returncode}):\n{said[-2000:]}")
    print("missing extra: named, exit 2")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def readme_demo_command() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    if DEMO_COMMAND not in readme:
        raise Failed(f"README.md no longer prints {DEMO_COMMAND!r}: update this check with it")
    command = DEMO_COMMAND.split()
    # A machine with something on the demo's port (a developer's own gateway) still checks
    # the same command, on another port; CI's machine has the port free.
    if not _port_free(8300):
        command += ["--port", "0"]
    return command


def check_demo(exe: Path, src: Path) -> None:
    command = [str(exe), *readme_demo_command()[1:]]
    proc = subprocess.Popen(
        command,
        cwd=src,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    try:
        url = _await_listening(proc, lines, deadline=time.monotonic() + 60)
        _chat_and_release(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise Failed("the demo did not stop within 40 s of SIGTERM") from None
    rest = proc.stdout.read() if proc.stdout else ""
    # uvicorn re-raises SIGTERM once it has shut down, so the default exit by that signal
    # is the clean one (tests/live/test_shutdown_bounded.py pins it).
    if code not in (0, -signal.SIGTERM):
        raise Failed(f"the demo exited {code} on SIGTERM:\n{''.join(lines)}{rest}"[-3000:])
    print(f"demo: served one chat request at {url} and released it; stopped cleanly")


def _await_listening(proc: subprocess.Popen[str], lines: list[str], deadline: float) -> str:
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            lines.append(line)
            found = LISTENING.search(line)
            if found:
                return found.group(1)
            continue
        if proc.poll() is not None:
            raise Failed(f"the demo exited {proc.returncode} before serving:\n{''.join(lines)}")
        time.sleep(0.1)
    raise Failed(f"the demo printed no 'listening' line within 60 s:\n{''.join(lines)}")


def _chat_and_release(url: str) -> None:
    import httpx
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60, max_retries=0)
    answer = client.chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "Fix the failing test."}],
        extra_body={"program_id": "bare-install-check"},
        max_tokens=8,
    )
    if not answer.choices or answer.usage is None or answer.usage.completion_tokens < 1:
        raise Failed(f"the demo's answer has no completion: {answer!r}")
    programs = httpx.get(f"{url}/programs", timeout=10).json()
    if "bare-install-check" not in str(programs):
        raise Failed(f"the program is not in /programs after its call: {programs}")
    released = httpx.post(
        f"{url}/programs/release", json={"program_id": "bare-install-check"}, timeout=10
    )
    if released.status_code != 200 or released.json().get("released") is not True:
        raise Failed(f"release answered {released.status_code}: {released.text}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="work in this folder and leave it")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="thunder-mw-bare-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        src = source_tree(work / "src")
        wheel = build_wheel(src, work / "dist")
        exe = bare_venv(work / "venv", wheel)
        check_help(exe)
        check_missing_extra(exe)
        check_demo(exe, src)
    except (Failed, subprocess.TimeoutExpired) as exc:
        print(f"check_bare_install: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"check_bare_install: passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
