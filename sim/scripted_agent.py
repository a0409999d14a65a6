"""The simulated engine's scripted agent mode: answers a chat with the next `bash` tool call of
a small per-task script, so an agent framework (mini-SWE-agent) runs end to end on it.

Opt-in (`scripted_agent: true` / `thunder-mw sim-engine --scripted-agent`); off, the engine
answers with its usual filler text and nothing here runs. Pure: the script of a task is a
function of the task text (the first user message) and the engine's seed, and the step is
the number of assistant turns already in the conversation, so the same conversation always
gets the same answer. The last step is mini-SWE-agent's submit command: its environment
ends the run when a command's output starts with `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = [
    "MAX_STEPS",
    "MIN_STEPS",
    "SUBMIT_MARKER",
    "ScriptError",
    "ScriptedCall",
    "message",
    "next_call",
    "script_for",
]

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
MIN_STEPS = 2
MAX_STEPS = 4
# Shell steps that run in the sandbox image the tests build (busybox: sh, echo, cat, ls, dd,
# sleep, rm), each with one parameter the script's seed picks.
_STEPS = (
    "ls /bin && echo listed {n}",
    "echo 'note {n}' >> /tmp/notes.txt && cat /tmp/notes.txt",
    "dd if=/dev/zero of=/tmp/blob bs=1024 count={n} 2>/dev/null && ls -l /tmp",
    "sleep 0.{n} && echo slept",
)
_encode = msgspec.json.Encoder().encode


class ScriptError(ValueError):
    """The conversation gives the scripted agent no task to follow."""


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """One answer: call `bash` with `command` (`step` counts from 0; `last`: the submit)."""

    step: int
    command: str
    last: bool

    @property
    def call_id(self) -> str:
        return f"call_{self.step}_{_digest(self.command)[:12]}"

    @property
    def arguments(self) -> str:
        return _encode({"command": self.command}).decode()


def script_for(task: str, seed: int) -> list[str]:
    """The task's commands, submit last: 2-4 shell steps chosen by (seed, task)."""
    h = int(_digest(f"{seed}\x00{task}"), 16)
    steps = MIN_STEPS + h % (MAX_STEPS - MIN_STEPS + 1)
    h //= MAX_STEPS - MIN_STEPS + 1
    commands = []
    for _ in range(steps):
        template = _STEPS[h % len(_STEPS)]
        h //= len(_STEPS)
        commands.append(template.format(n=1 + h % 9))
        h //= 9
    name = _digest(task)[:8]
    commands.append(f"echo {SUBMIT_MARKER} && echo 'done {name}'")
    return commands


def next_call(messages: list[Any], seed: int) -> ScriptedCall:
    """The answer to this conversation: the script's step after the assistant turns so far
    (past the end, the submit again: an agent that keeps asking is told to submit)."""
    task = _task(messages)
    script = script_for(task, seed)
    step = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    step = min(step, len(script) - 1)
    return ScriptedCall(step, script[step], step == len(script) - 1)


def message(call: ScriptedCall) -> dict[str, Any]:
    """The assistant message of an OpenAI chat completion that makes the call."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": "bash", "arguments": call.arguments},
            }
        ],
    }


def _task(messages: list[Any]) -> str:
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            if isinstance(content, str) and content:
                return content
    raise ScriptError("scripted agent mode needs a user message with the task text")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
