"""Decontamination: no benchmark prompt (of any split) may be among the prompts a drafter trains on.

Texts are compared as lists of normalised words (`normalize`): accents, case, whitespace, punctuation, LaTeX
and code symbols are dropped, so none of them hides a copy. A text matches a benchmark item when
- its whole normalised text equals the item's; or
- it shares a run of N = 10 consecutive words (a 10-gram) with the item, leaving out boilerplate 10-grams:
  those found in more than BOILERPLATE_TASKS different benchmark tasks (MBPP's "write a python function to
  check whether the given number" is in 8), which name no task in particular; or
- the item has no 10-gram left to match on (fewer than N words, or only boilerplate ones) and the text holds
  the item's whole word list, in order and consecutive.
The last rule keeps every item findable: each item matches itself (a test checks this on the real data).

Speed: the items' 10-grams are kept in one dict, and a text is checked by looking up its own 10-grams, so the
cost grows with the text's length, not with the number of benchmark items (100k texts take seconds).

Measured on the five benchmarks (gsm8k 1319, math500 500, humaneval 164, mbpp 427 sanitized + 974 full,
mtbench 80 x 2 turns: 3544 texts, 87.3k distinct 10-grams):
- 43 10-grams are in 3 or more different tasks (16 in 4 to 8), all of them MBPP phrasing ("write a python
  function to find the length of the", also in mtbench/124 turn 1); no item is left with boilerplate only.
- 120 texts have fewer than 10 words (28 math500, 23 mbpp, 51 mbpp-full, 18 mtbench turn 2s; the shortest has
  3: "simplify sqrt 242"); they are matched whole.
- corpus.distill_prompts(2000, seed=0) shares no 10-gram with any item, boilerplate included, and holds no
  short item. Checking 100k texts of 60 (123) words on average takes 2.4 s (4.7 s), mostly in `normalize`.
"""

from __future__ import annotations

import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from specpilot.datasets import DATASETS, benchmark_texts
from specpilot.errors import UserError

# Run length for near-duplicates. 13 (GPT-3's decontamination) leaves 493 of the 3544 benchmark texts (14%,
# mostly MBPP tasks of 10-12 words) matchable only whole, so a regurgitated task with one word changed
# escapes. 8 is too generic: "write a python function to check whether the" is in 35 different MBPP tasks and
# would flag any prompt that starts that way; 8-grams in 3+ tasks number 140. At 10 they number 43, all of
# them boilerplate (below). On corpus.distill_prompts(2000) 8 flags 7 prompts, 9 flags 5 (a math template's
# "per hour and works 5 hours a day for", as in one gsm8k item), 10 flags none.
N = 10

# A 10-gram in more than this many different tasks is boilerplate. Two tasks sharing a 10-gram are mostly
# near-copies of each other (gsm8k 418 and 558, mbpp-full 267 and 287), so such a 10-gram still marks a copy;
# from 3 tasks on they are phrasing alone ("write a function that takes in a list and an").
BOILERPLATE_TASKS = 2

BENCHMARKS: tuple[str, ...] = ("gsm8k", "math500", "humaneval", "mbpp", "mtbench")

# The full MBPP file words the sanitized tasks again: the same task, not two tasks sharing a phrase.
_SAME_TASKS = {"mbpp-full": "mbpp"}

_WORD = re.compile(r"[^\W\d_]+|\d+")  # a run of letters or a run of digits: "10r^3" -> "10", "r", "3"
_ASCII_WORD = re.compile(r"[a-z]+|[0-9]+")

Gram = tuple[str, ...]


def normalize(text: str) -> list[str]:
    """Lowercase words of letters or of digits; everything else (spaces, punctuation, symbols) is dropped."""
    # NFKD splits accents off their letters (dropped next) and maps compatibility forms (full-width letters,
    # ligatures, superscripts) to plain ones; casefold is lower() for every script.
    if text.isascii():  # most texts are; the ASCII pattern finds the same words faster
        return _ASCII_WORD.findall(text.lower())
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return _WORD.findall(text.casefold())


def _grams(words: Sequence[str]) -> Iterable[Gram]:
    return zip(*(words[i:] for i in range(N)), strict=False)


def _name(bench: str, item_id: str) -> tuple[str, str]:
    """benchmark_texts gives the full MBPP file's tasks as "full/<id>"; they are indexed as "mbpp-full/<id>"."""
    if bench == "mbpp" and item_id.startswith("full/"):
        return "mbpp-full", item_id.removeprefix("full/")
    return bench, item_id


def _task(item: str) -> str:
    """The task an item id belongs to: "mtbench/81#2" -> "mtbench/81", "mbpp-full/601" -> "mbpp/601"."""
    bench, _, rest = item.partition("/")
    return f"{_SAME_TASKS.get(bench, bench)}/{rest.partition('#')[0]}"


class BenchmarkIndex:
    """Benchmark items' normalised texts, indexed to tell whether a text contains one of them."""

    def __init__(
        self,
        benchmarks: Mapping[str, Iterable[tuple[str, str]]],
        boilerplate_tasks: int | None = BOILERPLATE_TASKS,
    ) -> None:
        """benchmarks: {name: [(item id, text), ...]}; an item is reported as "<name>/<item id>".

        boilerplate_tasks=None keeps every 10-gram (no boilerplate rule).
        """
        self.loaded: list[str] = list(benchmarks)
        self.missing: dict[str, str] = {}
        items = [(f"{name}/{i}", normalize(text)) for name, pairs in benchmarks.items() for i, text in pairs]
        items = [(item, words) for item, words in items if words]  # no words: nothing a text could contain
        self.n_items = len(items)  # texts indexed
        self._exact: dict[str, str] = {}
        for item, words in items:
            self._exact.setdefault(" ".join(words), item)
        self.boilerplate = _boilerplate(items, boilerplate_tasks)
        self._grams: dict[Gram, str] = {}
        self._whole: dict[Gram, str] = {}  # items with no 10-gram to match on, matched whole
        self._whole_lengths: dict[str, set[int]] = defaultdict(set)  # first word -> lengths of those items
        for item, words in items:
            own = [g for g in _grams(words) if g not in self.boilerplate]
            for gram in own:
                self._grams.setdefault(gram, item)
            if not own:
                self._whole.setdefault(tuple(words), item)
                self._whole_lengths[words[0]].add(len(words))

    @classmethod
    def load(cls, data_dir: str | Path | None = None, benchmarks: Sequence[str] = BENCHMARKS) -> BenchmarkIndex:
        """Index the raw texts of every split of each benchmark whose data file is found.

        A benchmark that cannot be loaded is left out and named in `.missing` with the reason; the caller decides
        whether that is an error. mbpp's full file, when beside the sanitized one, is indexed as "mbpp-full".
        """
        unknown = [b for b in benchmarks if b not in DATASETS]
        if unknown:
            raise UserError(f"unknown benchmark {', '.join(unknown)}; choose from: {', '.join(BENCHMARKS)}")
        texts: dict[str, list[tuple[str, str]]] = {}
        missing: dict[str, str] = {}
        for bench in benchmarks:
            try:
                items = benchmark_texts(bench, data_dir)
            except UserError as e:
                missing[bench] = str(e)
                continue
            for item_id, turns in items:
                name, number = _name(bench, item_id)
                for k, text in enumerate(turns, 1):
                    # Several turns (mtbench) get "#<turn>" ids: "mtbench/81#2".
                    texts.setdefault(name, []).append((number + (f"#{k}" if len(turns) > 1 else ""), text))
        index = cls(texts)
        index.missing = missing
        return index

    def match(self, text: str) -> str | None:
        """Id of a benchmark item the text contains ("gsm8k/17", "mtbench/81#2"), or None."""
        words = normalize(text)
        return self._exact.get(" ".join(words)) or self._gram_match(words) or self._whole_match(words)

    def _gram_match(self, words: list[str]) -> str | None:
        # isdisjoint runs in C over the text's 10-grams: the common no-match case costs no Python loop.
        if self._grams.keys().isdisjoint(_grams(words)):
            return None
        return next(self._grams[g] for g in _grams(words) if g in self._grams)

    def _whole_match(self, words: list[str]) -> str | None:
        for i, word in enumerate(words):
            for length in self._whole_lengths.get(word, ()):
                item = self._whole.get(tuple(words[i : i + length]))
                if item is not None:
                    return item
        return None

    def filter(self, texts: Iterable[str]) -> tuple[list[str], list[tuple[str, str]]]:
        """(texts that match no benchmark item, [(text, matched item id), ...] for the others)."""
        kept: list[str] = []
        dropped: list[tuple[str, str]] = []
        for text in texts:
            item = self.match(text)
            if item is None:
                kept.append(text)
            else:
                dropped.append((text, item))
        return kept, dropped


def _boilerplate(items: list[tuple[str, list[str]]], max_tasks: int | None) -> frozenset[Gram]:
    """10-grams found in more than max_tasks different tasks."""
    if max_tasks is None:
        return frozenset()
    tasks: dict[Gram, set[str]] = defaultdict(set)
    for item, words in items:
        task = _task(item)
        for gram in _grams(words):
            tasks[gram].add(task)
    return frozenset(g for g, ts in tasks.items() if len(ts) > max_tasks)


def dedupe(texts: Iterable[str], prefix_words: int = 12) -> list[str]:
    """texts in order, without exact normalised repeats or texts that start like an earlier one.

    Two texts whose first `prefix_words` normalised words agree are near-copies (an LLM writing prompts often
    repeats itself with a different ending); the first is kept. A shorter text is its own prefix, so exact
    repeats are caught by the same key.
    """
    if prefix_words < 1:
        raise ValueError(f"prefix_words must be at least 1, got {prefix_words}")
    seen: set[Gram] = set()
    out: list[str] = []
    for text in texts:
        key = tuple(normalize(text)[:prefix_words])
        if key not in seen:
            seen.add(key)
            out.append(text)
    return out
