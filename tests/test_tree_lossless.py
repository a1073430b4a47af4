"""Trees are lossless: every builder at several node budgets (N < block, = block, > block) returns exactly AR
greedy's tokens in float32 on the CPU, and replaying a recorded run equals the live run step by step.

A random drafter is rarely right, so an oracle lattice (the true continuation planted among each depth's
candidates at a random rank, sometimes missing) makes trees accept paths off the drafter's greedy chain.
"""

from __future__ import annotations

import random

import pytest
import torch

from specpilot.config import parse_system
from specpilot.core.contracts import Lattice
from specpilot.errors import UserError
from specpilot.replay.record import Recorder, load, save
from specpilot.replay.walk import committed, replay
from specpilot.runtime.engine import Engine
from specpilot.speculative.tree import BUILDERS, TreeBuilder, max_nodes
from tests.test_lossless import CONFIGS, CONTEXT, VOCAB, _models, _prompt

N_NEW = 24


def _budgets(block: int, name: str, width: int) -> list[int]:
    most = max_nodes(name, block - 1, width, min(4, width))
    return sorted({n for n in (2, block + 3, 3 * block) if n <= most})


def _system(name: str, nodes: int) -> str:
    return f"stock:tree={name},nodes={nodes}"


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def models(request):
    return _models(request.param)


@torch.no_grad()
def test_every_builder_equals_ar(models):
    target, drafter = models
    block, width = drafter.cfg.block_size, drafter.cfg.selector_top_k if drafter.cfg.selector_rank else 16
    ar_engine = Engine(target, None, context=CONTEXT)
    prompts = [_prompt(seed, 6 + 3 * seed) for seed in range(2)]
    ars = [ar_engine.generate_one(p, N_NEW, (), "ar").tokens for p in prompts]
    for name in BUILDERS:
        for nodes in _budgets(block, name, min(width, VOCAB)):
            engine = Engine(target, drafter, parse_system(_system(name, nodes)), context=CONTEXT)
            for prompt, ar in zip(prompts, ars, strict=True):
                gen = engine.generate_one(prompt, N_NEW, ())
                assert gen.tokens == ar, (name, nodes)
                assert sum(gen.accepted) == len(gen.tokens) - 1


class OracleLattice:
    """Each depth's K candidates: random tokens, with the true continuation planted at a random rank (early
    ranks likelier) in 85% of the depths; random edge scores."""

    def __init__(self, sequence: list[int], width: int, seed: int):
        self.sequence = sequence + [0] * (CONTEXT + 64)
        self.width, self.rng = width, random.Random(seed)

    def __call__(self, anchor: torch.Tensor, start: torch.Tensor) -> Lattice:
        depth, k, s = self.depth, self.width, int(start[0])
        tokens = torch.zeros(1, depth, k, dtype=torch.int64)
        for d in range(depth):
            truth = self.sequence[s + 1 + d]
            others = [t for t in self.rng.sample(range(VOCAB), k + 1) if t != truth][:k]
            if self.rng.random() < 0.85:
                others[min(int(self.rng.expovariate(1.2)), k - 1)] = truth
            tokens[0, d] = torch.tensor(others)
        gen = torch.Generator().manual_seed(self.rng.randrange(2**31))
        unary = torch.randn(1, depth, k, generator=gen).sort(-1, descending=True).values
        logp = unary - torch.logsumexp(unary, -1, keepdim=True) - 0.5
        edges = torch.randn(1, depth, k, k, generator=gen)
        return Lattice(tokens=tokens, unary=unary, logp=logp, edges=edges, anchor=anchor)


def _oracle_engine(target, drafter, system: str, sequence: list[int], seed: int) -> Engine:
    engine = Engine(target, drafter, parse_system(system), context=CONTEXT)
    draft = engine.draft
    oracle = OracleLattice(sequence, 4, seed)
    oracle.depth = engine.block - 1
    plain = draft.lattice

    def lattice(anchor, start):
        plain(anchor, start)  # the drafter still runs (its cache, its kernels)
        draft.last = oracle(anchor, start)
        return draft.last

    draft.lattice = lattice
    return engine


@pytest.fixture(scope="module")
def oracle_setup():
    target, drafter = _models("llama-b8-2layers")  # block 8
    prompt = _prompt(7, 9)
    ar = Engine(target, None, context=CONTEXT).generate_one(prompt, 40, (), "ar").tokens
    return target, drafter, prompt, ar


@pytest.mark.parametrize("name,nodes", [("chain", 8), ("ddtree", 12), ("best_first", 8), ("best_first", 20),
                                        ("eagle2", 16), ("sequoia", 14)])
@torch.no_grad()
def test_trees_accept_off_the_greedy_chain_and_stay_lossless(oracle_setup, name, nodes, tmp_path):
    target, drafter, prompt, ar = oracle_setup
    engine = _oracle_engine(target, drafter, _system(name, nodes), prompt + ar, seed=nodes)
    recorder = Recorder()
    engine.recorder = recorder
    gen = engine.generate_one(prompt, 40, ())
    recorder.finish("r", "test", prompt, gen.tokens, gen.accepted)
    assert gen.tokens == ar
    assert len(gen.accepted) < len(ar) - 1  # drafts were accepted
    # replay (after a round trip through the files) equals the live run, step by step
    save(tmp_path, recorder.turns, {"system": name})
    turns, meta = load(tmp_path)
    assert meta == {"system": name}
    builder = engine.builder or TreeBuilder("chain", engine.block, engine.block - 1, 4)
    assert committed(turns[0], builder).tolist() == gen.accepted
    if name != "chain":  # the tree accepted more than the greedy chain would have at the same anchors
        chain = committed(turns[0], TreeBuilder("chain", engine.block, engine.block - 1, 4))
        assert int(committed(turns[0], builder).sum()) > int(chain.sum())
    result = replay(turns, [(name, nodes)])
    assert result["replayed"][f"{name}@{nodes}"]["tau"] == pytest.approx(result["live_tau"], abs=1e-12)
    assert result["tau_best"]["any"] >= result["live_tau"]


def test_bad_tree_systems_are_user_errors():
    target, drafter = _models("llama-mha-b4-selector")  # block 4, K = 4
    for text, words in [("stock:tree=eagle2,nodes=200", "holds 2.."), ("stock:tree=sequoia,tree_accept=0.9/0.5", "sum"),
                        ("stock:tree=best_first,nodes=1", "holds 2.."),
                        ("stock:tree=eagle2,tree_k=5", "tree_k=5 exceeds the drafter's 4 candidates")]:
        with pytest.raises(UserError, match=words):
            Engine(target, drafter, parse_system(text), context=CONTEXT)
    with pytest.raises(UserError, match="draft slots"):  # a tree's rows need room in the context
        Engine(target, drafter, parse_system("stock:tree=best_first,nodes=60"), context=CONTEXT).generate_one(
            [1] * 60, CONTEXT - 70, ())


def test_the_loop_knows_which_trees_the_engine_takes():
    """loop/space.runs_as_named, given the drafter's block and width, says yes exactly where the engine builds."""
    from specpilot.loop.space import GRIDS, runs_as_named, variant

    target, drafter = _models("llama-mha-b4-selector")  # block 4, K = 4
    stock, seen = parse_system("stock"), set()
    for tree in BUILDERS:
        for nodes in (0, *GRIDS["nodes"]):
            for k in GRIDS["tree_k"] if tree == "eagle2" else (4,):
                for block in (0, 2, 3):
                    system = variant(stock, tree=tree, nodes=nodes, tree_k=k, block_size=block)
                    try:
                        Engine(target, drafter, system, context=CONTEXT)
                        built = True
                    except UserError:
                        built = False
                    assert runs_as_named(system, 4, 4) == built, system.name
                    seen.add(built)
    assert seen == {True, False}
