"""Specification of the agent workload generator and its JSONL trace format."""

from __future__ import annotations

import json
import random
import zlib
from array import array
from pathlib import Path

import pytest

from thunder_mw.benchmarks.workloads import (
    PRESETS,
    generate,
    growth_ids,
    load_trace,
    save_trace,
    summarise,
    system_ids,
)


def test_the_same_seed_gives_the_same_programs() -> None:
    assert generate("swe-agent", 20, seed=7) == generate("swe-agent", 20, seed=7)


def test_a_different_seed_gives_different_programs() -> None:
    assert generate("swe-agent", 20, seed=7) != generate("swe-agent", 20, seed=8)


def test_a_trace_round_trips_through_jsonl(tmp_path: Path) -> None:
    programs = generate("openhands", 30, seed=3)
    assert any(c.subagents for p in programs for c in p.calls)  # sub-agents survive too
    path = tmp_path / "trace.jsonl"
    save_trace(programs, path)
    assert load_trace(path) == programs
    assert len(path.read_text().splitlines()) == 30


def test_a_trace_may_give_whole_prompts_and_a_shorter_prompt_is_a_compaction(
    tmp_path: Path,
) -> None:
    line = {
        "program_id": "t1",
        "system_tokens": 100,
        "calls": [
            {"prompt_tokens": 300, "output_tokens": 50, "tool_s": 1.0},
            {"prompt_tokens": 500, "output_tokens": 20, "tool_s": 0.5},
            {"prompt_tokens": 250, "output_tokens": 10},
        ],
    }
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (program,) = load_trace(path)
    assert [c.growth_tokens for c in program.calls] == [200, 150, 150]
    assert [c.reset for c in program.calls] == [False, False, True]
    assert program.context_tokens() == [300, 500, 250]


def test_a_bad_trace_line_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"program_id": "x", "calls": [{"output_tokens": 5}]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1"):
        load_trace(path)


def test_context_grows_by_previous_output_and_tool_result() -> None:
    program = generate("swe-agent", 1, seed=1)[0]
    contexts = program.context_tokens()
    for k in range(1, len(program.calls)):
        call, before = program.calls[k], program.calls[k - 1]
        if not call.reset:
            assert contexts[k] == contexts[k - 1] + before.output_tokens + call.growth_tokens


@pytest.mark.parametrize(
    ("preset", "turns", "output"),
    [
        ("swe-agent", (8, 14), (400, 650)),
        ("tool-orchestra", (5, 8), (50, 100)),
        ("chat", (2, 4), (220, 340)),
    ],
)
def test_presets_match_their_calibration(
    preset: str, turns: tuple[int, int], output: tuple[int, int]
) -> None:
    shape = summarise(generate(preset, 200, seed=0))
    assert turns[0] <= shape.turns_mean <= turns[1]
    assert output[0] <= shape.output_tokens_mean <= output[1]


def test_swe_agent_contexts_mostly_stay_under_20k_tokens() -> None:
    finals = sorted(p.context_tokens()[-1] for p in generate("swe-agent", 200, seed=0))
    assert finals[len(finals) // 2] < 20_000


def test_tool_orchestra_waits_longer_on_tools_than_swe_agent() -> None:
    slow = summarise(generate("tool-orchestra", 150, seed=0)).tool_s_mean
    fast = summarise(generate("swe-agent", 150, seed=0)).tool_s_mean
    assert slow > 3 * fast


def test_contexts_are_compacted_below_the_model_length() -> None:
    for program in generate("openhands", 100, seed=0, max_context_tokens=16_384):
        for context, call in zip(program.context_tokens(), program.calls, strict=True):
            assert context + call.output_tokens <= 16_384


def test_staggered_arrivals_increase_and_batch_arrivals_are_all_at_zero() -> None:
    staggered = [p.arrival_s for p in generate("chat", 50, seed=0, arrival_rate=2.0)]
    assert staggered == sorted(staggered) and staggered[-1] > 0
    assert {p.arrival_s for p in generate("chat", 50, seed=0)} == {0.0}


def test_programs_of_a_session_type_share_the_system_prompt_and_nothing_else() -> None:
    assert system_ids("swe-agent", 64) == system_ids("swe-agent", 64)
    assert system_ids("swe-agent", 64) != system_ids("chat", 64)
    assert growth_ids("p0", 1, 64) != growth_ids("p1", 1, 64)
    assert growth_ids("p0", 1, 64) == growth_ids("p0", 1, 64)


@pytest.mark.parametrize("n", [0, 1, 16, 1000])
def test_ids_are_the_seeded_16_bit_stream_in_32_bit_slots(n: int) -> None:
    # The DES's prompts are these arrays (engine answers append ids above 65535); their
    # values must stay those of the byte stream read as 16-bit ids, whatever the byte order.
    ids = growth_ids("p7", 3, n)
    stream = random.Random(zlib.crc32(b"p7:3")).randbytes(2 * n)
    assert ids.typecode == "I" and len(ids) == n
    assert ids.tolist() == array("H", stream).tolist()
    assert system_ids("chat", n).tolist() == (
        array("H", random.Random(zlib.crc32(b"system:chat")).randbytes(2 * n)).tolist()
    )


def test_every_preset_generates() -> None:
    for name in PRESETS:
        assert len(generate(name, 3, seed=0)) == 3


def test_single_token_words_are_one_token_each_alone_and_together(tmp_path: Path) -> None:
    # The replay client's text prompts for routers that take no token ids: every word is one
    # token of the tokenizer, and any sequence of them encodes back to one token per word.
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from thunder_mw.benchmarks.replay import single_token_words

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()  # as the models' tokenizers (build_tiny_model.py)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rng = random.Random(0)
    lines = [" ".join(rng.choice(["agent", "tool", "cache", "block", "plan"]) for _ in range(8))]
    tok.train_from_iterator(lines * 200, trainer=trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    words = single_token_words(str(path))
    assert words and all(w.startswith(" ") for w in words)
    picks = [rng.randrange(len(words)) for _ in range(200)]
    ids = tok.encode("".join(words[k] for k in picks)).ids
    assert ids == [tok.encode(words[k]).ids[0] for k in picks]
