"""The Python API on the tiny preset: batches, streams, sampling, and one-line errors for a user's mistakes."""

from __future__ import annotations

import pytest

from specpilot.api import load, presets
from specpilot.errors import UserError


@pytest.fixture(scope="module")
def llm():
    return load("tiny")


def test_generate_answers_each_prompt_as_the_cli_engine_does(llm):
    prompts = ["What is 7 * 6?", "Name three primes.", "hi"]
    answers = llm.generate(prompts, max_new_tokens=12)
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)
    ar = load("tiny", system="ar")
    assert ar.generate(prompts, max_new_tokens=12) == answers  # stock answers as AR does (greedy)
    batched = load("tiny", in_flight=2)
    assert batched.generate(prompts, max_new_tokens=12) == answers


def test_stream_pieces_join_to_the_answer(llm):
    pieces = list(llm.stream("Name three primes.", max_new_tokens=16))
    assert len(pieces) > 1
    assert "".join(pieces) == llm.generate(["Name three primes."], max_new_tokens=16)[0]
    sampled = "".join(llm.stream("hi", max_new_tokens=16, temperature=0.8, seed=3))
    assert sampled == llm.generate(["hi"], max_new_tokens=16, temperature=0.8, seed=3)[0]


def test_sampling_is_seeded_and_lossless(llm):
    ar = load("tiny", system="ar")
    a = llm.generate(["hi", "hello"], max_new_tokens=16, temperature=1.0, seed=5)
    assert a == ar.generate(["hi", "hello"], max_new_tokens=16, temperature=1.0, seed=5)
    assert a == llm.generate(["hi", "hello"], max_new_tokens=16, temperature=1.0, seed=5)


def test_mistakes_are_user_errors(llm):
    assert "tiny" in presets()
    with pytest.raises(UserError, match="unknown preset"):
        load("no-such-preset")
    with pytest.raises(UserError, match="top_p"):
        llm.generate(["hi"], temperature=1.0, top_p=0.0)
    with pytest.raises(UserError, match="in_flight=1"):
        list(load("tiny", in_flight=2).stream("hi"))
