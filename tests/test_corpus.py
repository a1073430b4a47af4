"""Distillation prompts: the template families, their mix, and the self-instruct meta-prompts and parser."""

from __future__ import annotations

import ast
import os
import random
import re
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.datasets import _CODE_PREFIX, _MATH_SUFFIX, DATASETS, UserError, load_requests
from specpilot.training import corpus
from specpilot.training.corpus import FAMILIES, MIX, distill_prompts, follow_ups, labelled_prompts
from specpilot.training.self_instruct import (
    KINDS,
    MAX_CHARS,
    MAX_NEW_TOKENS,
    MIN_CHARS,
    SAMPLING,
    TOPICS,
    meta_prompts,
    parse,
)

MAKERS = {**FAMILIES, "follow_ups": follow_ups}


@pytest.mark.parametrize("family", sorted(MAKERS))
def test_every_family_is_deterministic_distinct_and_seed_dependent(family):
    make = MAKERS[family]
    first, again, other = make(40, random.Random(1)), make(40, random.Random(1)), make(40, random.Random(2))
    assert first == again
    assert first != other
    assert len(first) == len(set(first)) == 40


@pytest.mark.parametrize("family", sorted(MAKERS))
def test_prompts_are_within_length_bounds(family):
    for prompt in MAKERS[family](200, random.Random(3)):
        assert prompt.strip() and len(prompt) <= 2000, prompt[:200]
        if family in ("word_problems", "follow_ups", "chat", "math"):  # no braces of their own: none left unfilled
            assert "{" not in prompt.removesuffix(_MATH_SUFFIX), prompt
        assert not re.search(r"<[a-zA-Z]\w*>", prompt) or family in ("docs", "code"), prompt  # LaTeX placeholders


def test_distill_prompts_follow_the_mix():
    pairs = labelled_prompts(2000, seed=0)
    assert [p for _, p in pairs] == distill_prompts(2000, seed=0)
    assert len({p for _, p in pairs}) == 2000
    counts = Counter(family for family, _ in pairs)
    assert set(counts) == set(FAMILIES) == {family for family, _ in MIX}
    assert abs(sum(share for _, share in MIX) - 1) < 1e-9
    for family, share in MIX:
        assert abs(counts[family] / 2000 - share) < 0.02, (family, counts[family])
    families_in_order = [family for family, _ in pairs[:200]]
    assert len(set(families_in_order)) >= 6  # shuffled, not one family after another


def test_distill_prompts_do_not_depend_on_the_process():
    """Same seed, same prompts in another interpreter (string hashing is randomized per process)."""
    code = ("import hashlib; from specpilot.training.corpus import distill_prompts; "
            "print(hashlib.sha256('\\0'.join(distill_prompts(300, 5)).encode()).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout for h in (1, 2)}
    assert len(digests) == 1


def test_distill_prompts_small_and_other_seeds():
    assert distill_prompts(7, seed=3) == distill_prompts(7, seed=3)
    assert len(set(distill_prompts(7, seed=3))) == 7
    assert distill_prompts(50, seed=1) != distill_prompts(50, seed=2)


def _stub_code(prompt: str) -> str:
    assert prompt.startswith(_CODE_PREFIX) and prompt.endswith("\n```")
    return prompt[len(_CODE_PREFIX):-len("\n```")]


def test_function_stubs_parse_as_python_with_a_docstring_and_examples():
    for prompt in corpus.function_stubs(300, random.Random(4)):
        code = _stub_code(prompt)
        try:
            tree = ast.parse(code)
        except SyntaxError:
            tree = ast.parse(code + "    pass\n")
        fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef))
        doc = ast.get_docstring(fn)
        assert doc and ">>> " + fn.name + "(" in doc, code
        assert 1 <= doc.count(">>>") <= 3
        assert fn.returns is not None and all(a.annotation is not None for a in fn.args.args), code
        assert not code.startswith(("from ", "import ")), code  # no typing import: builtin generics


def test_function_stub_examples_are_the_tasks_own_results():
    rng = random.Random(5)
    for task in corpus.TASKS:
        name, params, examples = corpus._task_instance(task, rng, 2)
        assert examples, task.names
        for example in examples:
            call, result = example.split("\n")
            args = ast.literal_eval("(" + call[len(name) + 1:-1] + ",)")
            assert repr(task.fn(*args)) == result


def test_templates_and_tables_are_large_enough():
    assert len(corpus.WORD_TEMPLATES) >= 40
    assert len(corpus.COMP_TEMPLATES) >= 40
    assert len(corpus.TASKS) >= 80
    assert len({name for task in corpus.TASKS for name in task.names.split("|")}) >= 150
    short_combos = len(corpus.SHORT_OPENERS) * sum(len(objects) for _, objects in corpus.SHORT_PARTS)
    assert short_combos >= 300
    assert len(corpus.CHAT_CATEGORIES) == 8
    assert all(len(templates) >= 10 for templates in corpus.CHAT_CATEGORIES.values())
    assert len(set(corpus.CHAT_TOPICS)) >= 100


def test_math_families_carry_the_benchmark_suffix_in_proportion():
    words = corpus.word_problems(1000, random.Random(6))
    comp = corpus.competition_math(1000, random.Random(6))
    assert 0.4 < sum(p.endswith(_MATH_SUFFIX) for p in words) / 1000 < 0.6
    assert 0.7 < sum(p.endswith(_MATH_SUFFIX) for p in comp) / 1000 < 0.9
    assert any("\\frac" in p for p in comp) and any("\\sqrt" in p for p in comp) and any("^" in p for p in comp)


def test_short_tasks_are_one_sentence_with_optional_assert():
    tasks = corpus.short_tasks(500, random.Random(7))
    assert all(re.match(r"(Write|Create) a (function|python function|Python function|program) to ", t) for t in tasks)
    with_assert = [t for t in tasks if "\nassert " in t]
    assert 0.1 < len(with_assert) / len(tasks) < 0.6
    for t in with_assert:
        ast.parse(t.split("\n", 1)[1])


def test_follow_ups_use_many_distinct_templates():
    assert len(set(corpus.FOLLOW_UPS)) >= 60
    patterns = [_template_regex(t) for t in corpus.FOLLOW_UPS]
    made = follow_ups(1000, random.Random(8))
    openers = sorted(set(corpus.FOLLOW_OPENERS), key=len, reverse=True)
    bare = [next(p[len(o):] for o in openers if p.startswith(o)) for p in made]
    used = {i for p in bare for i, rx in enumerate(patterns) if rx.fullmatch(p)}
    assert len(used) >= 60
    assert len(made) == len(set(made)) >= 200


def _template_regex(template: str) -> re.Pattern:
    parts = re.split(r"\{\w+\}", template)
    return re.compile(".+?".join(re.escape(part) for part in parts))


def _benchmark_turns() -> list[str]:
    turns = []
    for name in DATASETS:
        try:
            turns += [t for request in load_requests(name, "all") for t in request.turns]
        except UserError:
            continue  # data files not on this machine
    return turns


def _words(text: str) -> list[str]:
    """Words as the decontamination filter sees them: runs of letters or of digits, lower case."""
    return re.findall(r"[a-z]+|[0-9]+", text.lower())


def test_no_family_holds_a_benchmark_prompt_or_a_long_span_of_one():
    turns = _benchmark_turns()
    if not turns:
        pytest.skip("no benchmark data on this machine")
    bench: set[tuple[str, ...]] = set()
    short: set[str] = set()  # items under 10 words: matched whole
    for turn in turns:
        words = _words(turn.replace(_MATH_SUFFIX, "").replace(_CODE_PREFIX, ""))
        bench.update(zip(*(words[i:] for i in range(10)), strict=False))
        if len(words) < 10:
            short.add(" " + " ".join(words) + " ")
    for family, make in MAKERS.items():
        prompts = make(300 if family == "docs" else 1500, random.Random(9))
        blob = "\x00".join(prompts)
        assert not [t for t in turns if t[:120] in blob], family
        for prompt in prompts:
            words = _words(prompt)
            assert not bench.intersection(zip(*(words[i:] for i in range(10)), strict=False)), (family, prompt)
            padded = " " + " ".join(words) + " "
            assert not any(item in padded for item in short), (family, prompt)


def test_meta_prompts_are_deterministic_and_mixed_by_share():
    first, again = meta_prompts(2000, random.Random(0)), meta_prompts(2000, random.Random(0))
    assert first == again and first != meta_prompts(2000, random.Random(1))
    counts = Counter(kind for kind, _ in first)
    assert set(counts) == set(KINDS)
    assert abs(sum(share for _, share in KINDS.values()) - 1) < 1e-9
    for kind, (_, share) in KINDS.items():
        assert abs(counts[kind] / 2000 - share) < 0.01
    assert len({kind for kind, _ in first[:100]}) >= 8  # shuffled
    assert all("{" not in text and len(text) < 200 for _, text in first)  # short, fully filled


def test_self_instruct_covers_the_genres_and_samples_sensibly():
    assert set(KINDS) == {"word_problem", "competition_math", "function_task", "one_line_task",
                          "assistant_question", "writing", "roleplay", "reasoning", "stem", "humanities",
                          "extraction", "follow_up"}
    assert all(templates for templates, _ in KINDS.values())
    assert len(set(TOPICS)) >= 150
    assert 0.8 <= SAMPLING.temperature <= 1.0 and 40 <= SAMPLING.top_k <= 60 and 96 <= MAX_NEW_TOKENS <= 160


# What SmolLM2-135M-Instruct writes when asked for a prompt (kinds of output seen when sampling it), and what
# `parse` should keep. Math kinds may also get the boxed-answer suffix: compared without it.
PARSE_CASES = [
    ("word_problem", "Sure! Here is a math word problem for a third grade student:\n\nTom has 5 apples. He buys 3 "
     "more apples at the store. How many apples does Tom have now?\n\nAnswer: Tom has 5 + 3 = 8 apples.",
     "Tom has 5 apples. He buys 3 more apples at the store. How many apples does Tom have now?"),
    ("word_problem", "Problem: Maria has 12 cookies. She gives 4 to her brother. How many cookies does she have "
     "left? Solution: 12 - 4 = 8. Maria has 8 cookies left.",
     "Maria has 12 cookies. She gives 4 to her brother. How many cookies does she have left?"),
    ("word_problem", "Sam buys 3 pencils for $2 each. How many dollars does he spend?\nSam spends 3 x 2 = 6 dollars.",
     "Sam buys 3 pencils for $2 each. How many dollars does he spend?"),
    ("word_problem", "**Word Problem:** A baker makes 24 muffins and sells 15 of them. Find how many muffins are "
     "left.", "A baker makes 24 muffins and sells 15 of them. Find how many muffins are left."),
    ("word_problem", "Tom went to the store and bought 5 apples and 3 oranges for his family.", None),
    ("word_problem", "If I had the option to have a favorite movie, what would it be?", None),
    ("word_problem", "A day ago, Jonas bought 4 bananas at the market for $2 each. The question: does Jonas have "
     "enough money left if he started with $10?",
     "A day ago, Jonas bought 4 bananas at the market for $2 each. Does Jonas have enough money left if he started "
     "with $10?"),
    ("competition_math", "### Problem\n\n**Find all real numbers $x$ such that $x^2 - 5x + 6 = 0$.**\n\n### "
     "Solution\nWe factor the quadratic.", "Find all real numbers $x$ such that $x^2 - 5x + 6 = 0$."),
    ("competition_math", "What is the remainder when $2^{10}$ is divided by 7? Step 1: compute 2^10 = 1024.",
     "What is the remainder when $2^{10}$ is divided by 7?"),
    ("competition_math", "I'm not allowed to provide the answer.\nInstead, you can write the question.\nQuestion:\n"
     "What is the circumference of a circle with a radius of 3 feet?",
     "What is the circumference of a circle with a radius of 3 feet?"),
    ("competition_math", "$$ 2 + 2 = ? $$ 3 + 3 = ? 4 + 4 = ? 5 + 5 = ? 6 + 6 = ?", None),
    ("stem", "What is gravity and why do things fall?\nWhat is gravity and why do things fall?\nWhat is gravity and "
     "why do things fall?", None),
    ("stem", "What is the process of cell division?\n\nCell division is a critical cellular process that allows "
     "cells to grow.", "What is the process of cell division?"),
    ("stem", "The carbon cycle, also known as the carbon cycle, is the cycle of carbon between the Earth's "
     "atmosphere.", None),
    ("stem", "I'm here to help refine any question and answer feature by you. What can I help you with today?", None),
    ("stem", "What is heat?", None),
    ("humanities", '"How did the printing press change the way people shared ideas in Europe?"',
     "How did the printing press change the way people shared ideas in Europe?"),
    ("assistant_question", "What are some good ways to save money when you are living in a big city and you want to",
     None),
    ("assistant_question", "A good question to ask about recursion is: \n\nWhat is the best way to handle recursion "
     "in Python?", "What is the best way to handle recursion in Python?"),
    ("assistant_question", "Question: What are the best ways to keep houseplants alive in winter?\nAnswer: Water "
     "them less often.", "What are the best ways to keep houseplants alive in winter?"),
    ("writing", "Write a poem about the sea sea sea sea sea sea sea sea sea sea sea sea.", None),
    ("writing", "Write a short story about a lost dog who finds its way home. The story should be about 300 words "
     "long and have a happy", "Write a short story about a lost dog who finds its way home."),
    ("writing", "## A Poem Request\n\nPlease write a cheerful poem about a rainy morning in the city for children.",
     "Please write a cheerful poem about a rainy morning in the city for children."),
    ("writing", "Liam stood on the creaky rail of the old barn, his eyes fixed on a photograph of his mother.", None),
    ("roleplay", "I'm sorry, but I cannot pretend to be a pirate captain.", None),
    ("roleplay", "Hello there, welcome to our shop! I'm Sarah. How can I assist you today?", None),
    ("roleplay", "Pretend you are a park ranger and tell me which trail is safest for a family with small kids.",
     "Pretend you are a park ranger and tell me which trail is safest for a family with small kids."),
    ("reasoning", "1. Ann is taller than Ben. Ben is taller than Cal. Who is the shortest?\n2. Dan is older than "
     "Eve. Who is younger?", "Ann is taller than Ben. Ben is taller than Cal. Who is the shortest?"),
    ("reasoning", "If all cats are animals and Tom is a cat, is Tom an animal? Yes, because every cat is an animal.",
     "If all cats are animals and Tom is a cat, is Tom an animal?"),
    ("function_task", 'Write a Python function that returns the sum of the squares of a list.\n\n```python\ndef '
     'sum_squares(nums):\n    """Return the sum of squares."""\n```\n\nThis function uses a loop.',
     'Write a Python function that returns the sum of the squares of a list.\n\n```python\ndef sum_squares(nums):\n'
     '    """Return the sum of squares."""\n```'),
    ("function_task", "```python\ndef add(a, b):\n    return a + b\n```", None),
    ("function_task", "Complete this function:\n```python\ndef count_words(text: str) -> int:\n    \"\"\"Count the "
     "words in text.\"\"\"\n```", "Complete this function:\n\n```python\ndef count_words(text: str) -> int:\n"
     "    \"\"\"Count the words in text.\"\"\"\n```"),
    ("one_line_task", "Write a function to find the largest number in a list.\n```python\ndef largest(nums):\n"
     "    return max(nu", "Write a function to find the largest number in a list."),
    ("one_line_task", "Task: Write a python function to count the vowels in a string.",
     "Write a python function to count the vowels in a string."),
    ("one_line_task", "create a function that takes an integer and returns the number of its prime factors.",
     "Create a function that takes an integer and returns the number of its prime factors."),
    ("extraction", "On May 3, 2021, Anna Lee opened a bakery in Springfield with 12 employees. By 2023 the bakery "
     "had 30 employees.\n\nList all the names, dates and numbers in the paragraph above.\n\nNames: Anna Lee",
     "On May 3, 2021, Anna Lee opened a bakery in Springfield with 12 employees. By 2023 the bakery had 30 "
     "employees.\n\nList all the names, dates and numbers in the paragraph above."),
    ("follow_up", 'Here is a follow-up request: "Can you make your answer shorter and add an example?"',
     "Can you make your answer shorter and add an example?"),
    ("follow_up", "🔍 1) Change the first part of your answer into a question.\n🔍 2) Use a fun fact.\n🔍 3) Add a "
     "cute animal.", "Change the first part of your answer into a question."),
    ("follow_up", "How about asking about the twilight hours...", None),
]


@pytest.mark.parametrize(("kind", "raw", "expected"), PARSE_CASES)
def test_parse_cleans_what_a_tiny_model_writes(kind, raw, expected):
    out = parse(kind, raw)
    if out is not None and kind in ("word_problem", "competition_math"):
        out = out.removesuffix(_MATH_SUFFIX)
    assert out == expected


def test_parse_keeps_clean_prompts_and_suffixes_half_of_the_math():
    problems = [p.removesuffix(_MATH_SUFFIX) for p in corpus.word_problems(600, random.Random(10))]
    outs = [parse("word_problem", p) for p in problems]
    assert all(o is not None and o.removesuffix(_MATH_SUFFIX) == p for o, p in zip(outs, problems, strict=True))
    assert 0.4 < sum(o.endswith(_MATH_SUFFIX) for o in outs) / len(outs) < 0.6
    assert parse("word_problem", problems[0]) == outs[0]  # a pure function of its input
    chat = corpus.open_chat(200, random.Random(10))
    assert not any(parse("writing", p) and parse("writing", p).endswith(_MATH_SUFFIX) for p in chat)


FRAGMENTS = ("Problem:", "Answer: 8", "\n\n", "\n", "```python\ndef f(x):\n    return x\n```", "```", "?", ". ",
             "### Title", "**", '"', "Tom has 5 apples.", "How many apples does he have?", "Solution:",
             "Write a Python function that adds two numbers.", "I am sorry", "Here is a question:", "$x^2$", "1. ",
             "2. ", "The question is: ", "...")


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(KINDS) + ["unknown"]),
       st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=60)), max_size=30))
def test_parse_never_raises_and_respects_the_bounds(kind, parts):
    out = parse(kind, "".join(parts))
    assert out is None or MIN_CHARS <= len(out) <= MAX_CHARS


def test_the_stdlib_walk_is_kept_on_disk_as_it_was(tmp_path, monkeypatch):
    """The docs family's walk over the standard library is cached under the home folder; what a later process
    reads back is exactly what the walk returned (and a damaged cache file is walked again)."""
    from pathlib import Path

    from specpilot.training.corpus import docs

    lib = tmp_path / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "alpha.py").write_text('"""' + "Alpha module. " * 8 + '"""\n\ndef f():\n    """' + "F does. " * 12 + '"""\n')
    (lib / "pkg" / "beta.py").write_text('class B:\n    """' + "B is a class. " * 7 + '"""\n')
    monkeypatch.setattr(Path, "home", lambda: tmp_path / "home")
    monkeypatch.setattr(docs.sysconfig, "get_paths", lambda: {"stdlib": str(lib)})
    walk = docs._stdlib_docstrings.__wrapped__
    first = walk(80, 1500)
    # a module's docstring comes twice (the walk visits the module node twice; kept as it is, since the
    # committed drafter's prompt draws depend on it)
    assert [name for name, _ in first] == ["alpha", "alpha", "alpha.f", "pkg.beta.B"]
    (cached,) = (tmp_path / "home" / ".cache" / "specpilot" / "stdlib_docs").iterdir()
    (lib / "alpha.py").unlink()  # what comes back now comes from the cache
    assert walk(80, 1500) == first
    cached.write_text("{not json")
    assert [name for name, _ in walk(80, 1500)] == ["pkg.beta.B"]  # walked again
