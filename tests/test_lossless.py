"""Losslessness in float32 on the CPU: stock speculative decoding returns exactly AR greedy's tokens.

Random drafters are rarely accepted, so an oracle drafter (the true AR continuation, corrupted at some
seeded steps) also exercises full and partial acceptance.
"""

from __future__ import annotations

import random

import pytest
import torch

from specpilot.config import parse_system
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from specpilot.runtime.engine import Engine
from specpilot.speculative.proposal import ChainProposer

STOCK = parse_system("stock")
VOCAB = 256
N = 40
CONTEXT = 160

# name -> (target overrides, drafter overrides, target seed, drafter seed)
CONFIGS = {
    "llama-b2": (dict(), dict(block_size=2), 0, 1),
    "llama-mha-b4-selector": (dict(num_kv_heads=4, rope_theta=5e5),
                              dict(block_size=4, selector_rank=8, selector_top_k=4), 1, 2),
    "qwen3-b8-conv": (dict(family="qwen3", qk_norm=True),
                      dict(block_size=8, conv_kernel_size=2, conv_group_size=16), 2, 3),
    "qwen3-b4-selector-conv": (dict(family="qwen3", qk_norm=True, head_dim=24, rope_theta=1e6),
                               dict(block_size=4, selector_rank=8, selector_top_k=4, conv_kernel_size=2,
                                    conv_group_size=16), 3, 4),
    "llama-b8-2layers": (dict(num_heads=8, num_kv_heads=2, head_dim=8), dict(block_size=8, layers=2), 4, 5),
}


def _models(name: str):
    t_over, d_over, t_seed, d_seed = CONFIGS[name]
    tcfg = tiny_target_config(vocab=VOCAB, num_layers=3, max_position_embeddings=256, **t_over)
    target = random_target(tcfg, seed=t_seed)
    drafter = random_drafter(tiny_drafter_config(tcfg, target_layer_ids=[0, 1], **d_over), seed=d_seed)
    return target, drafter


def _prompt(seed: int, length: int = 11) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(length)]


class OracleProposer(ChainProposer):
    """Drafts the true continuation (prompt + AR output) from the anchor's position, with a seeded rule
    that corrupts one draft in some steps."""

    def __init__(self, stock: ChainProposer, sequence: list[int], corrupt_seed: int, corrupt_rate: float):
        self.__dict__.update(stock.__dict__)
        padded = sequence + [0] * (CONTEXT + 16)
        self.sequence = torch.tensor(padded, dtype=torch.int64, device=self.index.device)
        self.rng = random.Random(corrupt_seed)
        self.corrupt_rate = corrupt_rate
        self.corrupted = 0

    def drafts(self, anchor: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        block = self.index.numel()
        index = start[:, None] + torch.arange(1, block, device=start.device)
        drafts = self.sequence[index].clone()
        if self.rng.random() < self.corrupt_rate:
            k = self.rng.randrange(block - 1)
            drafts[:, k] = (drafts[:, k] + 1) % VOCAB
            self.corrupted += 1
        return drafts


class OracleEngine(Engine):
    """An engine whose speculative step proposes with an OracleProposer."""

    def __init__(self, *args, sequence: list[int], corrupt_seed: int, corrupt_rate: float = 0.4, **kwargs):
        super().__init__(*args, **kwargs)
        self.spec.proposer = OracleProposer(self.spec.proposer, sequence, corrupt_seed, corrupt_rate)

    @property
    def corrupted(self) -> int:
        return self.spec.proposer.corrupted


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def setup(request):
    target, drafter = _models(request.param)
    engine = Engine(target, drafter, context=CONTEXT)
    return request.param, target, drafter, engine


def _check_accounting(gen, block: int) -> None:
    assert sum(gen.accepted) == len(gen.tokens) - 1
    assert all(1 <= a <= block for a in gen.accepted)


@torch.no_grad()
def test_stock_equals_ar(setup):
    name, _, _, engine = setup
    for seed in range(3):
        prompt = _prompt(seed, length=5 + 4 * seed)
        ar = engine.generate_one(prompt, N, (), "ar")
        assert len(ar.tokens) == N and ar.accepted == [1] * (N - 1)
        assert len(set(ar.tokens)) > 3  # not a degenerate constant output
        stock = engine.generate_one(prompt, N, (), "stock")
        assert stock.tokens == ar.tokens, (name, seed)
        _check_accounting(stock, engine.block)
        # The engine's caches are reused: AR again after stock gives the same tokens.
        assert engine.generate_one(prompt, N, (), "ar").tokens == ar.tokens


@torch.no_grad()
def test_oracle_drafter_full_and_partial_acceptance(setup):
    name, target, drafter, engine = setup
    block = drafter.cfg.block_size
    for seed in range(2):
        prompt = _prompt(100 + seed)
        ar = engine.generate_one(prompt, N, (), "ar").tokens
        oracle = OracleEngine(target, drafter, context=CONTEXT, sequence=prompt + ar, corrupt_seed=seed)
        gen = oracle.generate_one(prompt, N, (), "stock")
        assert gen.tokens == ar, (name, seed)
        _check_accounting(gen, block)
        assert block in gen.accepted[:-1]  # some step accepted every draft
        assert oracle.corrupted > 0
        assert any(a < block for a in gen.accepted[:-1])  # and some steps only a prefix
        if block > 2:
            assert any(1 < a < block for a in gen.accepted[:-1])
        assert len(gen.accepted) < len(gen.tokens) - 1  # fewer target passes than tokens


@torch.no_grad()
def test_oracle_without_corruption_accepts_whole_blocks(setup):
    _, target, drafter, engine = setup
    block = drafter.cfg.block_size
    prompt = _prompt(7)
    ar = engine.generate_one(prompt, N, (), "ar").tokens
    oracle = OracleEngine(target, drafter, context=CONTEXT, sequence=prompt + ar, corrupt_seed=0,
                          corrupt_rate=0.0)
    gen = oracle.generate_one(prompt, N, (), "stock")
    assert gen.tokens == ar
    assert gen.accepted[:-1] == [block] * (len(gen.accepted) - 1)
    assert sum(gen.accepted) == N - 1


@torch.no_grad()
def test_oracle_always_wrong_accepts_nothing(setup):
    _, target, drafter, engine = setup
    prompt = _prompt(8)
    ar = engine.generate_one(prompt, 12, (), "ar").tokens
    wrong = prompt + [(t + 1) % VOCAB for t in ar]
    oracle = OracleEngine(target, drafter, context=CONTEXT, sequence=wrong, corrupt_seed=0, corrupt_rate=0.0)
    gen = oracle.generate_one(prompt, 12, (), "stock")
    assert gen.tokens == ar
    assert gen.accepted == [1] * 11


@torch.no_grad()
def test_stop_token(setup):
    _, target, drafter, engine = setup
    prompt = _prompt(3)
    ar = engine.generate_one(prompt, N, (), "ar").tokens
    # A token whose first occurrence is well inside the output.
    firsts = [j for j in range(2, N - 1) if ar[j] not in ar[:j]]
    assert firsts
    for j in (firsts[0], firsts[-1]):
        stop = ar[j]
        for base in ("ar", "stock"):
            gen = engine.generate_one(prompt, N, (stop, VOCAB + 5), base)
            assert gen.tokens == ar[: j + 1], (base, j)
            assert sum(gen.accepted) == len(gen.tokens) - 1
        # With an oracle, the stop is committed in the middle of an accepted block and the rest is cut.
        oracle = OracleEngine(target, drafter, context=CONTEXT, sequence=prompt + ar, corrupt_seed=j,
                              corrupt_rate=0.0)
        gen = oracle.generate_one(prompt, N, [stop], "stock")
        assert gen.tokens == ar[: j + 1]
        assert sum(gen.accepted) == j
    # A stop equal to the very first token ends the request after prefill.
    for base in ("ar", "stock"):
        gen = engine.generate_one(prompt, N, (ar[0],), base)
        assert gen.tokens == [ar[0]] and gen.accepted == []


@torch.no_grad()
def test_max_new_tokens_cut(setup):
    _, target, drafter, engine = setup
    prompt = _prompt(4)
    ar = engine.generate_one(prompt, N, (), "ar").tokens
    oracle = OracleEngine(target, drafter, context=CONTEXT, sequence=prompt + ar, corrupt_seed=1)
    for n in (1, 2, 3, 5, 8, 9, 17):
        for eng, base in ((engine, "ar"), (engine, "stock"), (oracle, "stock")):
            gen = eng.generate_one(prompt, n, (), base)
            assert gen.tokens == ar[:n], (base, n)
            assert gen.decode_tokens == n - 1
            assert sum(gen.accepted) == n - 1


@pytest.mark.parametrize("block_size", [2, 3, 4])
@torch.no_grad()
def test_block_size_option_stays_lossless(block_size):
    target, drafter = _models("llama-b8-2layers")
    assert drafter.cfg.block_size == 8
    system = parse_system(f"stock:block_size={block_size}")
    engine = Engine(target, drafter, system, context=CONTEXT)
    assert engine.block == block_size
    prompt = _prompt(9)
    ar = engine.generate_one(prompt, N, (), "ar").tokens
    stock = engine.generate_one(prompt, N, (), "stock")
    assert stock.tokens == ar
    _check_accounting(stock, block_size)
    oracle = OracleEngine(target, drafter, system, context=CONTEXT, sequence=prompt + ar,
                          corrupt_seed=block_size)
    gen = oracle.generate_one(prompt, N, (), "stock")
    assert gen.tokens == ar
    _check_accounting(gen, block_size)
    assert block_size in gen.accepted[:-1]
    assert max(gen.accepted) == block_size


def test_prompt_at_the_context_limit():
    target, drafter = _models("llama-b2")
    engine = Engine(target, drafter, context=40)
    prompt = _prompt(5, length=40 - 10 - engine.block)
    with torch.no_grad():
        ar = engine.generate_one(prompt, 10, (), "ar")
        stock = engine.generate_one(prompt, 10, (), "stock")
    assert stock.tokens == ar.tokens and len(ar.tokens) == 10


@pytest.mark.parametrize("base", ["ar", "stock"])
def test_pad_option_slows_each_step_and_changes_nothing(base):
    target, drafter = _models("llama-b2")
    plain = Engine(target, drafter, parse_system(base), context=CONTEXT)
    padded = Engine(target, drafter, parse_system(f"{base}:pad_us=3000"), context=CONTEXT)
    prompt = _prompt(4)
    fast = plain.generate_one(prompt, N, ())
    slow = padded.generate_one(prompt, N, ())
    assert slow.tokens == fast.tokens
    steps = len(slow.accepted)
    assert steps > 0
    assert slow.decode_s >= steps * 3000e-6  # every step waited its 3 ms


@torch.no_grad()
@pytest.mark.parametrize("depth", ["1", "3"])
def test_lookahead_reads_change_nothing(setup, depth):
    """The CUDA-graph path enqueues steps k + 1 .. k + depth before reading step k (runtime/graphs.Lookahead);
    on the CPU the same bookkeeping runs synchronously: same tokens and accounting, with stops and cuts, and
    steps launched past the end leave the next request unharmed."""
    _, target, drafter, engine = setup
    system = parse_system(f"stock:lookahead={depth}")
    ahead = Engine(target, drafter, system, context=CONTEXT)
    ahead.use_graphs = True  # the step graphs themselves stay eager on the CPU
    prompt = _prompt(5)
    ar = engine.generate_one(prompt, N, (), "ar").tokens
    stop = next(t for j, t in enumerate(ar) if j > 3 and t not in ar[:j])
    oracle = OracleEngine(target, drafter, system, context=CONTEXT, sequence=prompt + ar, corrupt_seed=2)
    oracle.use_graphs = True
    for eng, base in ((ahead, "ar"), (ahead, "stock"), (oracle, "stock")):
        for n, stops in ((N, ()), (N, (stop,)), (1, ()), (2, ()), (7, ())):
            gen = eng.generate_one(prompt, n, stops, base)
            want = ar[: ar.index(stop) + 1] if stops else ar[:n]
            assert gen.tokens == want, (base, n, stops)
            assert sum(gen.accepted) == len(gen.tokens) - 1
        looked = eng._ahead[id(eng.state.out if base == "stock" else eng.token)]
        assert looked.depth == int(depth) and 1 <= looked.launched <= len(gen.accepted) + int(depth)


def test_lookahead_keeps_depth_steps_in_flight_and_each_output_apart():
    from specpilot.errors import UserError
    from specpilot.runtime.graphs import Lookahead

    out = torch.zeros(1, dtype=torch.int64)
    ahead = Lookahead(out, depth=2)

    def step():
        out.add_(1)

    for _ in range(3):
        ahead.launch(step)
    with pytest.raises(RuntimeError, match="depth 2"):  # a fourth before step 0 is read
        ahead.launch(step)
    assert ahead.read(0) == [1]
    ahead.launch(step)  # reuses step 0's buffer, read already
    assert [ahead.read(k) for k in (1, 2, 3)] == [[2], [3], [4]]
    with pytest.raises(RuntimeError, match="out of order"):
        ahead.read(4)
    with pytest.raises(UserError, match="lookahead must be <= 4"):
        parse_system("stock:lookahead=5")
