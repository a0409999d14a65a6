"""SGLang's native /generate: which program a body names (the rid convention) and the token
counts read from `meta_info`, whole or streamed (pure, no engine)."""

from __future__ import annotations

import pytest

from thunder_mw.engines.generate_usage import StreamUsage, usage_of_answer
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.generate_context import RidError, program_from_rid


def test_a_rid_with_a_program_prefix_names_the_program() -> None:
    assert program_from_rid({"rid": "prog-7::turn-3"}) == ("prog-7", "rid")


@pytest.mark.parametrize("rid", ["plain-rid", "::x", "prog::", None, 17, []])
def test_a_rid_without_the_convention_names_no_program(rid: object) -> None:
    assert program_from_rid({"rid": rid}) is None


def test_a_batch_of_rids_names_one_program() -> None:
    assert program_from_rid({"rid": ["p::0", "p::1"]}) == ("p", "rid[0]")


def test_a_batch_whose_rids_name_two_programs_is_refused_naming_the_rid() -> None:
    with pytest.raises(RidError) as refused:
        program_from_rid({"rid": ["p::0", "q::1"]})
    assert refused.value.param == "rid[1]"


def test_usage_of_an_answer_comes_from_meta_info() -> None:
    body = (
        b'{"text": "hi", "meta_info": '
        b'{"prompt_tokens": 12, "completion_tokens": 3, "cached_tokens": 8}}'
    )
    assert usage_of_answer(body) == Usage(12, 3, 8)


def test_usage_of_a_batch_answer_is_the_sum_of_its_prompts() -> None:
    body = (
        b'[{"meta_info": {"prompt_tokens": 10, "completion_tokens": 2}},'
        b' {"meta_info": {"prompt_tokens": 5, "completion_tokens": 1, "cached_tokens": 4}}]'
    )
    assert usage_of_answer(body) == Usage(15, 3, 4)


def test_an_answer_without_meta_info_has_no_usage() -> None:
    assert usage_of_answer(b'{"text": "x"}') is None
    assert usage_of_answer(b"not json") is None


def test_a_stream_counts_the_last_cumulative_event_of_each_prompt() -> None:
    stream = StreamUsage()
    stream.feed(b'{"text": "a", "meta_info": {"prompt_tokens": 9, "completion_tokens": 1}}')
    stream.feed(b'{"text": "ab", "meta_info": {"prompt_tokens": 9, "completion_tokens": 2}}')
    stream.feed(b'{"index": 1, "meta_info": {"prompt_tokens": 4, "completion_tokens": 5}}')
    stream.feed(b"[DONE]")
    assert stream.usage == Usage(13, 7, 0)
