"""The `specpilot distill` job: training prompts at scale, the target's answers to them, a folder of data.

1. Prompts: the template families of training/corpus/, and prompts the target writes itself
   (training/self_instruct.py: meta-prompts sampled at a temperature, parsed, filtered); all of them
   de-duplicated and checked against every benchmark item of every split (training/decontaminate.py), so
   no benchmark prompt is trained on. The first `heldout` of them (shuffled) are held out.
2. Answers: the target's greedy answers, many rows at a time (training/distill.py), in chunks, until the
   answer budget of the run is spent (what is done is kept).
3. Second turns: a share of the first turns gets a follow-up request after the target's own first answer
   (the chat template over [user, assistant, user], as MT-Bench's second turn is run), and its answer.
4. Dev: the benchmarks' dev-half requests (MT-Bench with its second turn) and the target's answers, for the
   learning curve on what users ask. They are data for measuring only: never trained on, never committed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from specpilot.training.data import DistilledData, Record
from specpilot.training.distill import generate, greedy_batch, length_batches

HELDOUT_SEED = 0  # the held-out draw (the first drafters' held-out prompts were seed 0's too)


@dataclass
class DataRecipe:
    templates: int = 40_000  # template prompts drawn (training/corpus/)
    self_instruct: int = 20_000  # meta-prompts the target answers at a temperature (fewer survive the filters)
    follow_up_share: float = 0.2  # first turns that get a second turn
    heldout: int = 64
    dev_limit: int = 20  # dev-half requests per benchmark for the learning curve (0: none)
    max_new: int = 256
    max_prompt: int = 512
    batch: int = 512  # rows generated at once
    seed: int = 0
    max_minutes: float = 0.0  # stop answering new prompts after this long; 0 = answer them all


@dataclass
class Stage:
    """What one step of the job did, for the record."""
    name: str
    count: int
    seconds: float
    tokens: int = 0


class Job:
    """One run of the recipe on one target and tokenizer; `say` reports progress (a line per chunk)."""

    def __init__(self, target, tokenizer, recipe: DataRecipe, data_dir=None,
                 say: Callable[[str], None] = lambda line: None):
        self.target, self.tok, self.recipe, self.data_dir, self.say = target, tokenizer, recipe, data_dir, say
        self.rng = random.Random(recipe.seed)
        self.began = time.monotonic()
        self.stages: list[Stage] = []
        self.data = DistilledData()
        self.heldout = 0  # how many of the first prompts are held out (set by prompts())

    def deadline(self, share: float) -> float | None:
        return self.began + 60 * self.recipe.max_minutes * share if self.recipe.max_minutes else None

    def run(self) -> DistilledData:
        from specpilot.training.decontaminate import BenchmarkIndex

        index = BenchmarkIndex.load(self.data_dir)
        prompts, dropped = self.prompts(index)
        firsts = self.answer(prompts, self.deadline(0.75))
        self.second_turns(firsts, index, self.deadline(0.92))
        if self.recipe.dev_limit:
            self.dev()
        self.data.meta = {
            "recipe": asdict(self.recipe),
            "stages": [asdict(s) for s in self.stages],
            "benchmarks_checked": sorted(index.loaded), "benchmarks_missing": dict(index.missing),
            "dropped_as_benchmark": len(dropped), "dropped_examples": [list(d) for d in dropped[:20]],
            "heldout_prompts": self.heldout, "minutes": round((time.monotonic() - self.began) / 60, 2),
        }
        return self.data

    # 1. prompts ------------------------------------------------------------------------------------------
    def prompts(self, index) -> tuple[list[tuple[str, str, list[int]]], list[tuple[str, str]]]:
        """(family, text, chat-prompt ids): the held-out prompts first (the same draw for every seed, never in any
        run's training prompts, so a resumed run is scored on prompts its parent did not see either), then the
        rest shuffled; distinct, no benchmark item, each within max_prompt tokens."""
        from specpilot.training.corpus import labelled_prompts

        held = labelled_prompts(self.recipe.heldout, HELDOUT_SEED)
        texts = labelled_prompts(self.recipe.templates, self.recipe.seed) if self.recipe.templates else []
        if self.recipe.self_instruct:
            texts += self.self_instruct()
        family = {}  # exact duplicates go; near-duplicates went inside self_instruct() (templates are distinct by
        for f, t in held + texts:  # construction, and many share their opening words: a prefix rule would drop
            family.setdefault(t, f)  # every function stub, all of which open with the same instruction)
        distinct = list(family)
        clean, dropped = index.filter(distinct)
        clean = set(clean)
        held_texts = [t for _, t in held if t in clean]
        held_set = set(held_texts)
        rest = [t for t in distinct if t in clean and t not in held_set]
        self.rng.shuffle(rest)
        out = []
        for text in held_texts + rest:
            ids = self.tok.chat_prompt([{"role": "user", "content": text}])
            if len(ids) <= self.recipe.max_prompt:
                out.append((family[text], text, ids))
        self.heldout = sum(1 for _, t, _ in out if t in held_set)
        self.say(f"{len(out)} prompts ({len(dropped)} dropped as benchmark items)")
        return out, dropped

    def self_instruct(self) -> list[tuple[str, str]]:
        """Prompts written by the target: (\"self:<kind>\", text) for every meta-prompt whose output parses, near-
        duplicates (the same first 12 words) dropped: a small model at a temperature repeats itself."""
        from specpilot.training.decontaminate import dedupe
        from specpilot.training.self_instruct import MAX_NEW_TOKENS, SAMPLING, meta_prompts, parse

        began = time.monotonic()
        metas = meta_prompts(self.recipe.self_instruct, self.rng)
        ids = [self.tok.chat_prompt([{"role": "user", "content": m}]) for _, m in metas]
        generator = torch.Generator(device=self.target.device).manual_seed(self.recipe.seed)
        out, tokens = [], 0
        for batch in length_batches(ids, self.recipe.batch):
            texts = generate(self.target, [ids[i] for i in batch], MAX_NEW_TOKENS, self.tok.eos_ids,
                             SAMPLING, generator)
            for i, answer in zip(batch, texts, strict=True):
                tokens += len(answer)
                prompt = parse(metas[i][0], self.tok.decode(answer))
                if prompt is not None:
                    out.append((f"self:{metas[i][0]}", prompt))
        parsed = len(out)
        kept = set(dedupe([p for _, p in out]))
        out = [(f, p) for f, p in out if p in kept and not kept.discard(p)]  # the first of each kept text
        self.stages.append(Stage("self_instruct", len(out), time.monotonic() - began, tokens))
        self.say(f"self-instruct: {len(out)} of {len(metas)} outputs kept ({parsed} parsed)")
        return out

    # 2. answers ------------------------------------------------------------------------------------------
    def answer(self, prompts: list[tuple[str, str, list[int]]], deadline: float | None) -> list[int]:
        """Greedy answers, chunk by chunk until the deadline; returns the indices (into data) of first turns."""
        began, tokens, done = time.monotonic(), 0, []
        chunk = 8 * self.recipe.batch  # a random chunk of the prompts, answered in batches of similar lengths
        for first in range(0, len(prompts), chunk):
            if deadline and time.monotonic() > deadline:
                break
            part = prompts[first : first + chunk]
            answers = self.greedy([ids for _, _, ids in part])
            for k, ((family, text, ids), answer) in enumerate(zip(part, answers, strict=True)):
                role = "heldout" if first + k < self.heldout else "train"
                done.append(len(self.data.sequences))
                self.data.add(ids + answer, len(ids), Record(role, family, [text]))
                tokens += len(answer)
            self.say(f"answers: {first + len(part)} of {len(prompts)} prompts, {tokens} tokens, "
                     f"{tokens / (time.monotonic() - began):.0f} tokens/s")
        self.stages.append(Stage("first_turns", len(done), time.monotonic() - began, tokens))
        return done

    def greedy(self, prompts: list[list[int]]) -> list[list[int]]:
        answers: list[list[int]] = [[] for _ in prompts]
        for batch in length_batches(prompts, self.recipe.batch):
            for i, a in zip(batch, greedy_batch(self.target, [prompts[i] for i in batch], self.recipe.max_new,
                                                self.tok.eos_ids), strict=True):
                answers[i] = a
        return answers

    # 3. second turns -------------------------------------------------------------------------------------
    def second_turns(self, firsts: list[int], index, deadline: float | None) -> None:
        from specpilot.training.corpus import follow_ups

        began, tokens = time.monotonic(), 0
        chosen = [i for i in firsts if self.rng.random() < self.recipe.follow_up_share]
        requests, _ = index.filter(follow_ups(len(chosen), self.rng))
        todo = []
        for i, request in zip(chosen, requests, strict=False):
            rec, seq, plen = self.data.records[i], self.data.sequences[i], self.data.prompt_lens[i]
            messages = [{"role": "user", "content": rec.turns[0]},
                        {"role": "assistant", "content": self.tok.decode(seq[plen:])},
                        {"role": "user", "content": request}]
            ids = self.tok.chat_prompt(messages)
            if len(ids) <= self.recipe.max_prompt + self.recipe.max_new:
                todo.append((rec, request, ids))
        chunk = 8 * self.recipe.batch
        for first in range(0, len(todo), chunk):
            if deadline and time.monotonic() > deadline:
                break
            part = todo[first : first + chunk]
            for (rec, request, ids), answer in zip(part, self.greedy([t[2] for t in part]), strict=True):
                self.data.add(ids + answer, len(ids), Record(rec.role, f"{rec.family}+follow_up",
                                                             [rec.turns[0], request]))
                tokens += len(answer)
        self.stages.append(Stage("second_turns", len(self.data.sequences) - len(firsts),
                                 time.monotonic() - began, tokens))
        self.say(f"second turns: {tokens} tokens")

    # 4. dev ----------------------------------------------------------------------------------------------
    def dev(self) -> None:
        from specpilot.datasets import load_requests
        from specpilot.errors import UserError

        began, tokens, requests = time.monotonic(), 0, []
        for name in ("gsm8k", "math500", "humaneval", "mbpp", "mtbench"):
            try:
                requests += load_requests(name, "dev", self.data_dir, limit=self.recipe.dev_limit)
            except UserError:
                continue  # not on this machine: the learning curve covers the benchmarks that are
        turns = max((len(r.turns) for r in requests), default=0)
        answered: dict[str, list[dict]] = {r.id: [] for r in requests}
        for k in range(turns):
            live = [r for r in requests if len(r.turns) > k]
            prompts = []
            for r in live:
                answered[r.id].append({"role": "user", "content": r.turns[k]})
                prompts.append(self.tok.chat_prompt(answered[r.id]))
            for r, ids, answer in zip(live, prompts, self.greedy(prompts), strict=True):
                answered[r.id].append({"role": "assistant", "content": self.tok.decode(answer)})
                self.data.add(ids + answer, len(ids), Record("dev", r.id, list(r.turns[: k + 1])))
                tokens += len(answer)
        self.stages.append(Stage("dev", sum(len(r.turns) for r in requests), time.monotonic() - began, tokens))
