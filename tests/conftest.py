"""Shared fixtures: a small target whose greedy answers loop, and a drafter trained on them."""

import pytest
import torch

from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.runtime.engine import Engine
from specpilot.training.distill import build_dataset
from specpilot.training.train_drafter import TrainConfig, drafter_config, train


@pytest.fixture(autouse=True)
def _tuning_store_in_tmp(tmp_path_factory, monkeypatch):
    """No test writes the step tuning's store in the home folder (kernels/tuning/store.py)."""
    from specpilot.kernels.tuning import store

    monkeypatch.setattr(store, "ROOT", tmp_path_factory.getbasetemp() / "tuning-store")


def prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 250, (int(torch.randint(4, 16, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.fixture(scope="session")
def looping_target():
    """A random target with tied embeddings falls into short loops: its answers are learnable."""
    return random_target(tiny_target_config(vocab=300, tie_word_embeddings=True), seed=3)


@pytest.fixture(scope="session")
def trained(looping_target):
    target = looping_target
    tc = TrainConfig(block_size=4, layers=1, selector_rank=8, selector_top_k=4, steps=200, seqs_per_step=8,
                     blocks_per_seq=4, warmup_steps=10, lr=1e-2, seed=0)
    taps = tuple(drafter_config(target.cfg, tc).target_layer_ids)
    train_ds = build_dataset(target, prompts(32, seed=2), 24, (), taps, batch=16, feature_dtype=torch.float32)
    eval_ds = build_dataset(target, prompts(6, seed=3), 24, (), taps, batch=16, feature_dtype=torch.float32)
    drafter, metrics = train(target, train_ds, eval_ds, tc)
    return drafter, metrics, eval_ds, tc, train_ds


class RecordingEngine(Engine):
    """Keeps every block the serving path drafted, with its anchor position."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drafted = []
        proposer, own = self.spec.proposer, self.spec.proposer.drafts

        def drafts(anchor, start):
            out = own(anchor, start)
            self.drafted.append((int(start), out[0].tolist()))
            return out

        proposer.drafts = drafts


def assert_ar_tokens_alone_and_batched(target, drafter, system: str, seed: int, sampled: bool, vocab: int,
                                       context: int, temperature: float = 0.9) -> None:
    """Six requests of mixed lengths (every other one sampled when `sampled`) arriving over ten steps: the system's
    tokens, each request alone and all of them batched on three slots, are AR's, and drafts were accepted
    somewhere (not only bonus tokens)."""
    import random

    from specpilot.config import parse_system
    from specpilot.core.contracts import Prompted, Sampling

    rng = random.Random(seed)
    reqs = [Prompted([rng.randrange(vocab) for _ in range(rng.randint(1, 16))], rng.randint(4, 28), (),
                     Sampling(temperature, 0.95, 0, seed * 10 + i) if sampled and i % 2 else None) for i in range(6)]
    arrivals = sorted(rng.randint(0, 10) for _ in range(6))
    ar = Engine(target, None, parse_system("ar"), context=context)
    want = [ar.generate([r])[0].tokens for r in reqs]
    alone = [Engine(target, drafter, parse_system(system), context=context).generate([r])[0] for r in reqs]
    assert [g.tokens for g in alone] == want, system
    batch = Engine(target, drafter, parse_system(system), context=context, slots=3)
    assert [g.tokens for g in batch.generate(reqs, arrivals=arrivals)] == want, system
    assert any(n > 1 for g in alone for n in g.accepted), system


def train_drafter_cli(*args):
    """`specpilot train-drafter` on the tiny preset, distilling a dozen short template prompts first."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "specpilot.cli", "train-drafter", "--preset", "tiny", "--prompts",
                           "12", "--eval-prompts", "3", "--max-new-tokens", "8", *args],
                          capture_output=True, text=True, timeout=600)
