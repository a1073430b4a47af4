"""Decontamination: benchmark items found back through surface changes and inside longer prompts, the 10-word
rule's edge, short and boilerplate items, ids, missing data, dedupe, and the real benchmarks vs the corpus."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot import datasets as ds
from specpilot.datasets import benchmark_texts, load_requests
from specpilot.errors import UserError
from specpilot.training.decontaminate import BENCHMARKS, BenchmarkIndex, N, dedupe, normalize

# Made-up items (no benchmark text): a long one, a short one, and a second long one.
LONG = "A farmer has 17 goats; each goat eats 3 kg of hay per day. How many kg do the goats eat in a week?"
SHORT = "Zorp the quux, blat!"
OTHER = "Write a function that reverses every second word of a sentence and keeps the punctuation in place."


def toy_index(**kw) -> BenchmarkIndex:
    return BenchmarkIndex({"toy": [("1", LONG), ("2", SHORT)], "other": [("7#2", OTHER)]}, **kw)


# --- normalize ---


def test_normalize_drops_case_space_punctuation_accents_and_symbols() -> None:
    assert normalize("Janet’s  ducks") == normalize("JANET'S ducks!") == ["janet", "s", "ducks"]
    assert normalize("$\\frac{3}{20}$ of 10r^2") == ["frac", "3", "20", "of", "10", "r", "2"]
    assert normalize("Naïve  ＡＢＣ１２") == ["naive", "abc", "12"]  # accents, full-width forms
    assert normalize("def has_close_elements(x):") == ["def", "has", "close", "elements", "x"]
    assert normalize(" \n\t!?") == []


@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_normalize_ascii_fast_path_agrees_with_the_unicode_path(text: str) -> None:
    # " é" sends the text down the unicode path and adds exactly the word "e".
    assert normalize(text + " é") == normalize(text) + ["e"]


# --- match ---


def test_item_found_through_case_whitespace_and_punctuation_changes() -> None:
    index = toy_index()
    assert index.match(LONG) == "toy/1"
    assert index.match(LONG.upper().replace(" ", "\n  ")) == "toy/1"
    assert index.match(LONG.replace(";", ",").replace("?", "").replace("kg", "KG.")) == "toy/1"
    assert index.match(f"Solve this: {LONG.lower()} Thanks") == "toy/1"
    assert index.match(f"Rephrase:\n{OTHER}\n\nAnswer in Python.") == "other/7#2"


def test_ten_shared_words_match_nine_do_not() -> None:
    assert N == 10
    index = toy_index()
    words = normalize(LONG)
    for start in range(len(words) - 9):
        assert index.match("Solve this: " + " ".join(words[start : start + 10]) + " thanks") == "toy/1"
        assert index.match("Solve this: " + " ".join(words[start : start + 9]) + " thanks") is None
    # Nine words of one half and nine of another, not adjacent: no run of ten.
    assert index.match(" ".join(words[:9]) + " and also " + " ".join(words[10:19])) is None


def test_short_item_must_appear_whole_and_in_order() -> None:
    index = toy_index()
    assert index.match("please ZORP the quux blat now") == "toy/2"
    assert index.match(SHORT) == "toy/2"
    assert index.match("zorp the quux") is None  # part of it
    assert index.match("zorp the blat quux") is None  # out of order
    assert index.match("zorp the big quux blat") is None  # not consecutive


def test_unrelated_and_empty_texts_do_not_match() -> None:
    index = toy_index()
    assert index.match("A farmer has 17 goats and a dog.") is None
    assert index.match("") is None
    assert index.match("?!") is None


def test_filter_keeps_order_and_reports_ids() -> None:
    texts = ["hello there", f"Q: {LONG}", "zorp the quux blat", "bye", OTHER]
    kept, dropped = toy_index().filter(texts)
    assert kept == ["hello there", "bye"]
    assert dropped == [(texts[1], "toy/1"), (texts[2], "toy/2"), (texts[4], "other/7#2")]


# --- boilerplate ---

PHRASE = "write a python function that checks whether the given number is"  # 11 words


def test_phrase_in_three_tasks_is_boilerplate() -> None:
    items = [("1", PHRASE + " a zorpish quux"), ("2", PHRASE + " blatty or not"), ("3", PHRASE + " xyz")]
    index = BenchmarkIndex({"mbpp": items})
    assert len(index.boilerplate) == 2  # the phrase's two 10-grams
    assert index.match(f"{PHRASE} prime, please") is None
    assert BenchmarkIndex({"mbpp": items}, boilerplate_tasks=None).match(f"{PHRASE} prime") == "mbpp/1"
    for item_id, text in items:  # each item keeps a 10-gram of its own
        assert index.match(f"Solve: {text}!") == f"mbpp/{item_id}"


def test_item_with_only_boilerplate_is_matched_whole() -> None:
    items = [("1", PHRASE + " a zorpish quux"), ("2", PHRASE + " blatty or not"), ("3", PHRASE)]
    index = BenchmarkIndex({"mbpp": items})
    assert index.match(f"Solve: {PHRASE.upper()}!") == "mbpp/3"
    assert index.match(PHRASE.removesuffix(" is") + " odd") is None


def test_same_task_counts_once_for_boilerplate() -> None:
    # The full MBPP file and the turns of one question repeat a task: two tasks here, not boilerplate.
    index = BenchmarkIndex(
        {"mbpp": [("5", PHRASE + " odd")], "mbpp-full": [("5", PHRASE + " odd or not")],
         "mtbench": [("9#1", PHRASE + " even"), ("9#2", PHRASE + " blue")]}
    )  # fmt: skip
    assert not index.boilerplate
    assert index.match(f"{PHRASE} prime") == "mbpp/5"


# --- ids, wrappers and missing data through load ---


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def write_fake_benchmarks(root: Path, full_mbpp: bool = True) -> Path:
    write_jsonl(root / "gsm8k/test.jsonl", [{"question": f"gsm question {i} about {i} apples"} for i in range(3)])
    write_jsonl(root / "math500/test.jsonl", [{"problem": f"Simplify $\\sqrt{{{i}77}}$."} for i in range(3)])
    he = "".join(json.dumps({"task_id": f"HumanEval/{i}", "prompt": f"def zz{i}():\n"}) + "\n" for i in range(4))
    (root / "humaneval").mkdir()
    (root / "humaneval/HumanEval.jsonl.gz").write_bytes(gzip.compress(he.encode()))
    sanitized = [{"task_id": t, "prompt": f"Write a function that frobs {t} widgets."} for t in (2, 3)]
    (root / "mbpp").mkdir()
    (root / "mbpp/sanitized-mbpp.json").write_text(json.dumps(sanitized), encoding="utf-8")
    if full_mbpp:
        write_jsonl(root / "mbpp/mbpp.jsonl", [{"task_id": 601, "text": "Write a function to glorp the blorps."}])
    turns = [{"question_id": q, "turns": [f"first turn {q} teapot", f"second turn {q} kettle"]} for q in (81, 82)]
    write_jsonl(root / "mtbench/question.jsonl", turns)
    return root


def test_load_ids_cover_every_benchmark_and_turn(tmp_path: Path) -> None:
    index = BenchmarkIndex.load(write_fake_benchmarks(tmp_path))
    assert index.loaded == ["gsm8k", "math500", "humaneval", "mbpp", "mbpp-full", "mtbench"]
    assert index.missing == {}
    assert index.match("Tell me: GSM question 1 about 1 apples.") == "gsm8k/1"
    assert index.match("simplify sqrt(277)") == "math500/2"
    assert index.match("def zz3(): pass") == "humaneval/3"
    assert index.match("write a function that frobs 3 widgets") == "mbpp/3"
    assert index.match("Write a function to glorp the blorps!") == "mbpp-full/601"
    assert index.match("Second turn 82 kettle?") == "mtbench/82#2"
    assert index.match("first turn 81 teapot") == "mtbench/81#1"


def test_load_indexes_raw_texts_without_prompt_wrappers(tmp_path: Path) -> None:
    index = BenchmarkIndex.load(write_fake_benchmarks(tmp_path))
    for bench in ("gsm8k", "math500", "humaneval"):
        raw = {f"{bench}/{i}": turns[0] for i, turns in benchmark_texts(bench, tmp_path)}
        for request in load_requests(bench, "all", tmp_path):
            before, found, after = request.turns[0].partition(raw[request.id])
            assert found and len(normalize(before + after)) >= N, request.id  # raw text inside a wrapper
            # The wrapper's words (the math suffix, the code prefix) are no benchmark text.
            assert index.match(before) is None and index.match(after) is None, request.id


def test_benchmark_texts_are_raw_and_complete(tmp_path: Path) -> None:
    write_fake_benchmarks(tmp_path)
    assert benchmark_texts("humaneval", tmp_path)[3] == ("3", ("def zz3():\n",))
    assert benchmark_texts("math500", tmp_path)[0] == ("0", ("Simplify $\\sqrt{077}$.",))
    assert benchmark_texts("mtbench", tmp_path)[1] == ("82", ("first turn 82 teapot", "second turn 82 kettle"))
    assert [i for i, _ in benchmark_texts("mbpp", tmp_path)] == ["2", "3", "full/601"]
    (tmp_path / "mbpp/mbpp.jsonl").unlink()
    assert [i for i, _ in benchmark_texts("mbpp", tmp_path)] == ["2", "3"]
    for bench in BENCHMARKS:  # every split: the same ids load_requests gives for "all"
        ids = {f"{bench}/{i}" for i, _ in benchmark_texts(bench, tmp_path)}
        assert ids == {r.id for r in load_requests(bench, "all", tmp_path)}


@pytest.mark.parametrize("bench", BENCHMARKS)
def test_benchmark_texts_missing_file_raises_like_load_requests(tmp_path: Path, bench: str) -> None:
    with pytest.raises(UserError) as raw:
        benchmark_texts(bench, tmp_path)
    with pytest.raises(UserError) as formatted:
        load_requests(bench, "all", tmp_path)
    assert str(raw.value) == str(formatted.value)


def test_missing_data_dir_is_recorded_not_raised(tmp_path: Path) -> None:
    index = BenchmarkIndex.load(tmp_path / "nowhere")
    assert index.loaded == []
    assert set(index.missing) == set(BENCHMARKS)
    assert all("not found" in reason for reason in index.missing.values())
    assert index.match("anything at all") is None


def test_partly_missing_data(tmp_path: Path) -> None:
    write_fake_benchmarks(tmp_path, full_mbpp=False)
    for sub in ("math500", "mtbench"):
        for f in (tmp_path / sub).iterdir():
            f.unlink()
    index = BenchmarkIndex.load(tmp_path)
    assert index.loaded == ["gsm8k", "humaneval", "mbpp"]  # no "mbpp-full": its file is optional
    assert set(index.missing) == {"math500", "mtbench"}
    assert "mtbench/question.jsonl" in index.missing["mtbench"]
    with pytest.raises(UserError, match="unknown benchmark"):
        BenchmarkIndex.load(tmp_path, benchmarks=("gsm8k", "hellaswag"))


# --- properties over random indexes ---

INDEX_WORD = st.text(alphabet="abcdefghijklm", min_size=1, max_size=5)
FILLER_WORD = st.text(alphabet="nopqrstuvwxyz", min_size=1, max_size=5)  # no letter in common with INDEX_WORD


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(st.lists(INDEX_WORD, min_size=1, max_size=30), min_size=1, max_size=8),
    pick=st.integers(min_value=0),
    before=st.lists(FILLER_WORD, max_size=8),
    after=st.lists(FILLER_WORD, max_size=8),
)
def test_every_embedded_window_is_found(items: list[list[str]], pick: int, before: list[str], after: list[str]) -> None:
    index = BenchmarkIndex({"r": [(str(i), " ".join(w)) for i, w in enumerate(items)]}, boilerplate_tasks=None)
    words = items[pick % len(items)]
    windows = [words[s : s + N] for s in range(len(words) - N + 1)] or [words]  # short items: the whole item
    for window in windows:
        hit = index.match(", ".join(before + window + after).upper())
        assert hit is not None
        # The reported item holds the window (or, being short, lies inside it).
        held = items[int(hit.removeprefix("r/"))]
        assert run_in(window, held) or (len(held) < N and run_in(held, window))


def run_in(run: list[str], words: list[str]) -> bool:
    return any(words[i : i + len(run)] == run for i in range(len(words) - len(run) + 1))


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(st.lists(INDEX_WORD, min_size=1, max_size=30), min_size=1, max_size=8),
    text=st.lists(FILLER_WORD, max_size=40),
)
def test_texts_of_other_words_never_match(items: list[list[str]], text: list[str]) -> None:
    index = BenchmarkIndex({"r": [(str(i), " ".join(w)) for i, w in enumerate(items)]})
    assert index.match(" ".join(text)) is None


# --- dedupe ---


def test_dedupe_keeps_order_and_first_occurrences() -> None:
    twelve = "one two three four five six seven eight nine ten eleven twelve"
    texts = ["Hello, world!", "b", "hello world", f"{twelve} end A", "b ", f"{twelve.upper()}: end B", "c"]
    assert dedupe(texts) == ["Hello, world!", "b", f"{twelve} end A", "c"]
    eleven = twelve.removesuffix(" twelve")
    assert dedupe([f"{eleven} x", f"{eleven} y"]) == [f"{eleven} x", f"{eleven} y"]  # 11 shared words only
    assert dedupe([f"{eleven} x", f"{eleven} y"], prefix_words=11) == [f"{eleven} x"]
    with pytest.raises(ValueError):
        dedupe(["a"], prefix_words=0)


@given(st.lists(st.lists(st.sampled_from(["a", "B", "c", "d!"]), max_size=5).map(" ".join), max_size=30))
def test_dedupe_property(texts: list[str]) -> None:
    out = dedupe(texts, prefix_words=3)
    firsts: dict[tuple[str, ...], str] = {}
    for t in texts:
        firsts.setdefault(tuple(normalize(t)[:3]), t)
    assert out == list(firsts.values())  # the first text of each start, in order


# --- the real benchmarks and the template corpus ---

SHARED = ds._shared_dir()
REAL_COUNTS = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 427 + 974, "mtbench": 80}


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"no benchmark data at {SHARED} (the shared/datasets folder)")
def test_real_benchmarks_match_themselves_and_not_the_template_corpus() -> None:
    from specpilot.training.corpus import distill_prompts

    index = BenchmarkIndex.load(SHARED)
    assert index.missing == {}
    assert index.loaded == ["gsm8k", "math500", "humaneval", "mbpp", "mbpp-full", "mtbench"]
    words: dict[str, list[str]] = {}
    for bench in BENCHMARKS:
        items = benchmark_texts(bench, SHARED)
        assert len(items) == REAL_COUNTS[bench], bench
        for item_id, turns in items:
            name, number = ("mbpp-full", item_id[5:]) if item_id.startswith("full/") else (bench, item_id)
            for k, text in enumerate(turns, 1):
                words[f"{name}/{number}" + (f"#{k}" if len(turns) > 1 else "")] = normalize(text)
    texts = {item: " ".join(w) for item, w in words.items()}
    assert len(words) == index.n_items == 3544
    for item, text in texts.items():
        hit = index.match(text)
        # Its own id, or an earlier item with the same words (mbpp/3 and mbpp-full/3 read alike).
        assert hit == item or (hit is not None and words[hit] == words[item]), (item, hit)
        assert index.match(f"Solve this: {text.upper()} Thanks") is not None, item

    corpus = distill_prompts(2000, seed=0)
    kept, dropped = index.filter(corpus)
    assert dropped == [], f"{len(dropped)} corpus prompts match benchmark items: {dropped[:3]}"
    # Not even boilerplate: no 10-gram of any item is in the corpus (measured: 0 collisions).
    assert BenchmarkIndex({"all": list(texts.items())}, boilerplate_tasks=None).filter(corpus)[1] == []
