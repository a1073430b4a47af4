"""Training prompts for drafter self-distillation, built from templates and text every Python install carries.

A drafter distilled on one genre drafts the others far worse, so the families follow what the benchmarks ask,
in their genres and prompt formats, without ever holding a benchmark prompt (tests check; a separate filter
drops near-duplicates):
- word_problems: multi-step grade-school word problems (people, money, time, rates, percentages, fractions);
- competition_math: algebra, number theory, counting, geometry, precalculus problems written in LaTeX;
- function_stubs: "complete this function" prompts: a typed signature and a docstring with `>>>` examples,
  from original small tasks and from pure standard-library functions (examples computed by running them);
- short_tasks: one-sentence "Write a function to ..." tasks, some with an `assert` line;
- open_chat: writing, roleplay, reasoning, math, coding, extraction, STEM and humanities requests;
- docs: docstrings of the standard library's non-test modules (`ast.get_docstring`) and the prose of
  `pydoc_data.topics`, wrapped in templates (explain, summarise, give an example, reason);
- code, math, chat: the first, smaller families (stdlib "implement this", templated arithmetic, everyday chat).
`follow_ups` gives second-turn requests (revise, extend, test, vary) for two-turn conversations.
Each family is a `maker(n, rng) -> list[str]` of distinct prompts (`FAMILIES`); `distill_prompts` mixes them by
`MIX`, `labelled_prompts` does the same and names each prompt's family.

Modules: `common` (shared helpers and tables), `maths` (word_problems, competition_math, math), `tasks` (the
runnable task table), `programming` (function_stubs, short_tasks, code), `chat` (open_chat, chat), `followups`
(follow_ups) and `docs` (docs); this one holds the mix.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from specpilot.training.corpus.chat import (
    AUDIENCES,
    CHAT_CATEGORIES,
    CHAT_TOPICS,
    FORMS,
    HUMANITIES_TOPICS,
    PERSONAS,
    PROBLEMS,
    STEM_TOPICS,
    WRITING_TOPICS,
    chat_prompts,
    open_chat,
)
from specpilot.training.corpus.common import PEOPLE
from specpilot.training.corpus.docs import doc_prompts, pydoc_topics, stdlib_docstrings
from specpilot.training.corpus.followups import FOLLOW_OPENERS, FOLLOW_UPS, follow_ups
from specpilot.training.corpus.maths import (
    COMP_TEMPLATES,
    WORD_TEMPLATES,
    competition_math,
    math_prompts,
    word_problems,
)
from specpilot.training.corpus.programming import (
    SHORT_OPENERS,
    SHORT_PARTS,
    code_prompts,
    function_stubs,
    short_tasks,
    stdlib_functions,
)
from specpilot.training.corpus.tasks import TASKS, Task
from specpilot.training.corpus.tasks import _task_instance as _task_instance  # a test checks a task's examples

__all__ = [
    "AUDIENCES", "CHAT_CATEGORIES", "CHAT_TOPICS", "COMP_TEMPLATES", "FAMILIES", "FOLLOW_OPENERS", "FOLLOW_UPS",
    "FORMS", "HUMANITIES_TOPICS", "MIX", "PEOPLE", "PERSONAS", "PROBLEMS", "SHORT_OPENERS", "SHORT_PARTS",
    "STEM_TOPICS", "TASKS", "WORD_TEMPLATES", "WRITING_TOPICS", "Task", "chat_prompts", "code_prompts",
    "competition_math", "distill_prompts", "doc_prompts", "follow_ups", "function_stubs", "labelled_prompts",
    "math_prompts", "open_chat", "pydoc_topics", "short_tasks", "stdlib_docstrings", "stdlib_functions",
    "word_problems",
]


# --- the mix ---------------------------------------------------------------------------------------------------

FAMILIES: dict[str, Callable[[int, random.Random], list[str]]] = {
    "word_problems": word_problems, "competition_math": competition_math, "function_stubs": function_stubs,
    "short_tasks": short_tasks, "open_chat": open_chat, "docs": doc_prompts, "code": code_prompts,
    "math": math_prompts, "chat": chat_prompts,
}
# Shares follow the benchmarks: grade-school math, competition math, function stubs, one-line code tasks and open
# chat (the largest: eight categories), plus the stdlib docs and the first small families.
MIX = (("word_problems", 0.20), ("competition_math", 0.15), ("function_stubs", 0.15), ("short_tasks", 0.10),
       ("open_chat", 0.25), ("docs", 0.10), ("code", 0.02), ("math", 0.01), ("chat", 0.02))
_TOP_UP = ("open_chat", "word_problems", "competition_math", "function_stubs", "short_tasks")  # never run out


def _quotas(n: int) -> list[tuple[str, int]]:
    """Counts per family that sum to n, by largest remainder, so small n keeps the MIX shape."""
    raw = [(family, n * share) for family, share in MIX]
    counts = {family: int(x) for family, x in raw}
    for family, _ in sorted(raw, key=lambda fx: int(fx[1]) - fx[1])[: n - sum(counts.values())]:
        counts[family] += 1
    return [(family, counts[family]) for family, _ in MIX]


def labelled_prompts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n distinct (family, prompt) pairs in the MIX proportions, shuffled; deterministic per seed."""
    rng = random.Random(seed)
    out: dict[str, str] = {}
    for family, k in _quotas(n):
        for prompt in FAMILIES[family](k, rng):
            out.setdefault(prompt, family)
    for family in _TOP_UP * 4:  # a family that ran short (or a rare collision) is made up by the unbounded ones
        if len(out) >= n:
            break
        for prompt in FAMILIES[family](n - len(out), rng):
            out.setdefault(prompt, family)
    pairs = [(family, prompt) for prompt, family in out.items()][:n]
    rng.shuffle(pairs)
    return pairs


def distill_prompts(n: int, seed: int = 0) -> list[str]:
    """n distinct prompts, mixed from the families in the MIX proportions, shuffled; deterministic per seed."""
    return [prompt for _, prompt in labelled_prompts(n, seed)]
