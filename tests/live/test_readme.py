"""README is for a newcomer: short, it names the two commands that get one started, and its
usage examples work as printed against the demo, with or without a Docker engine."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from thunder_mw.benchmarks.server_process import wait_until_healthy
from thunder_mw.sim.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DEMO = ROOT / "config" / "demo.yaml"
MAX_LINES = 170  # a front door (~150 lines); results and diagnoses live in docs/benchmarks.md


def test_readme_stays_a_front_door() -> None:
    lines = README.read_text().count("\n")
    assert lines < MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "thunder-mw --config config/demo.yaml" in text
    assert "bash scripts/test.sh" in text


def test_readme_links_every_page_of_docs() -> None:
    text = README.read_text()
    pages = sorted(p.name for p in (README.parent / "docs").glob("*.md"))
    missing = [name for name in pages if f"docs/{name}" not in text]
    assert not missing, f"README.md does not link {missing}"


# ---------------------------------------------------------------------------- the examples run


def _blocks(language: str, section: str) -> list[str]:
    """The README's fenced `language` blocks under the `## section` heading."""
    text = README.read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", body, re.S)


def _demo_command() -> list[str]:
    (block,) = [b for b in _blocks("bash", "The two commands") if "config/demo.yaml" in b]
    command = block.strip().split("&& ")[-1]  # after the `pip install -e .`
    assert command == "thunder-mw --config config/demo.yaml"
    return [sys.executable, "-m", "thunder_mw.cli", *shlex.split(command)[1:]]


@pytest.fixture(params=["without Docker", "with Docker"])
def docker_state(request: pytest.FixtureRequest) -> str:
    if request.param == "with Docker":
        request.getfixturevalue("docker_client")  # the real engine, or a skip (CI: a failure)
    return str(request.param)


@pytest.mark.slow  # the demo, as its own `thunder-mw` process
def test_the_readme_usage_examples_work_as_printed(docker_state: str, tmp_path: Path) -> None:
    demo_url = "http://127.0.0.1:{port}".format(**yaml.safe_load(DEMO.read_text())["server"])
    (client_example, *_) = _blocks("python", "Usage")
    (release_example,) = [b for b in _blocks("bash", "Usage") if "/programs/release" in b]
    command, expected = release_example.strip().splitlines()
    assert demo_url in client_example and demo_url in command
    # The one liberty taken: a free port instead of the demo's 8300 (another run may hold it).
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "THUNDER_MW_SERVER__PORT": str(port),
        "XDG_STATE_HOME": str(tmp_path / "state"),  # the per-user state dir, here
    }
    if docker_state == "without Docker":
        env["THUNDER_MW_TOOLS__DOCKER__ENGINE_URL"] = f"unix://{tmp_path}/no-docker.sock"
    git_status = ["git", "status", "--porcelain", "--untracked-files=all", "--ignored"]
    before = subprocess.run(git_status, cwd=ROOT, capture_output=True, text=True).stdout
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        demo = subprocess.Popen(_demo_command(), cwd=ROOT, env=env, stdout=out, stderr=out)
    try:
        wait_until_healthy(url, process=demo, log_path=log, timeout_s=60)
        tools = httpx.get(f"{url}/health").json()["tools"]["docker"]
        assert tools["enabled"] is (docker_state == "with Docker"), tools
        script = tmp_path / "client.py"
        script.write_text(client_example.replace(demo_url, url) + "print(answer.model)\n")
        ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        assert ran.returncode == 0 and ran.stdout == "sim-model\n", ran.stderr
        released = subprocess.run(
            ["bash", "-c", command.replace(demo_url, url)], capture_output=True, text=True
        )
        assert "# " + released.stdout.strip() == expected.strip()
    finally:
        demo.terminate()
        demo.wait(timeout=60)
    after = subprocess.run(git_status, cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before, "the demo wrote into the checkout"
    journal = tmp_path / "state" / "thunder-mw" / "tool-journal.sqlite3"
    assert journal.exists() is (docker_state == "with Docker")


def test_the_readme_gateway_mode_example_builds_its_gateway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (example,) = [b for b in _blocks("python", "Usage") if "ThunderMiddleware" in b]
    monkeypatch.chdir(ROOT)  # it reads config/cluster.yaml, as a checkout's root has it
    names: dict[str, object] = {}
    exec(compile(example, "README.md (gateway mode)", "exec"), names)
    from thunder_mw import ThunderMiddleware

    assert isinstance(names["gateway"], ThunderMiddleware)


def test_usage_md_opens_with_the_readme_usage_examples() -> None:
    usage = (ROOT / "docs" / "usage.md").read_text()
    first_two = re.findall(r"```(?:python|bash)\n(.*?)```", usage, re.S)[:2]
    assert first_two == [_blocks("python", "Usage")[0], _blocks("bash", "Usage")[0]]
