"""Drafter self-distillation: data generation, the training path against the serving path, learning."""

import pytest
import torch

from specpilot.bench.datasets import DATASETS, UserError, load_requests
from specpilot.fixtures.corpus import distill_prompts
from specpilot.fixtures.distill import build_dataset, greedy_batch
from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.fixtures.train_drafter import TrainConfig, drafter_config, evaluate, train
from specpilot.models.loading import load_drafter, save_drafter
from specpilot.runtime.engine import Engine
from specpilot.runtime.options import parse_system

AR, STOCK = parse_system("ar"), parse_system("stock")


@pytest.fixture(scope="module")
def target():
    return random_target(tiny_target_config(vocab=300), seed=3)


def prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 250, (int(torch.randint(4, 16, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_greedy_batch_equals_single_request_ar(target):
    batch = prompts(5)
    answers = greedy_batch(target, batch, 20, ())
    engine = Engine(target, None, context=64)
    for prompt, answer in zip(batch, answers, strict=True):
        assert answer == engine.generate(prompt, 20, (), AR).tokens


def test_greedy_batch_stops_rows_at_their_stop_token(target):
    batch = prompts(3, seed=1)
    free = greedy_batch(target, batch, 12, ())
    stop = free[0][5]
    stopped = greedy_batch(target, batch, 12, (stop,))
    for row, full in zip(stopped, free, strict=True):
        cut = full.index(stop) + 1 if stop in full else len(full)
        assert row == full[:cut]


@pytest.fixture(scope="module")
def trained(target):
    tc = TrainConfig(block_size=4, layers=1, selector_rank=8, selector_top_k=4, steps=120, seqs_per_step=8,
                     blocks_per_seq=4, warmup_steps=10, lr=3e-3, seed=0)
    taps = tuple(drafter_config(target.cfg, tc).target_layer_ids)
    train_ds = build_dataset(target, prompts(32, seed=2), 24, (), taps, batch=16, feature_dtype=torch.float32)
    eval_ds = build_dataset(target, prompts(6, seed=3), 24, (), taps, batch=16, feature_dtype=torch.float32)
    drafter, metrics = train(target, train_ds, eval_ds, tc)
    return drafter, metrics, eval_ds, tc


def test_training_lowers_the_loss(trained):
    _, metrics, _, _ = trained
    assert metrics["ce_end"] < 0.9 * metrics["ce_start"], metrics  # no learning stays near log(vocab)
    assert 1.0 <= metrics["tau"] <= metrics["oracle_tau_top_k"]


def test_offline_acceptance_equals_the_engine(target, trained):
    """The training path (many blocks, repeated context) and the serving path (one block per step) draft
    the same tokens: the engine's acceptance at each step equals the offline figure at that anchor."""
    drafter, _, _, tc = trained
    engine = Engine(target, drafter, context=96)
    for prompt in prompts(3, seed=4):
        ar = engine.generate(prompt, 40, (), AR).tokens
        gen = engine.generate(prompt, 40, (), STOCK)
        assert gen.tokens == ar
        sequence = prompt + ar
        anchor = len(prompt)
        from specpilot.fixtures.distill import Dataset, target_features

        feats = target_features(target, [sequence], tuple(drafter.cfg.target_layer_ids))[0]
        for accepted in gen.accepted[:-1]:  # the last step may be cut by the budget
            if anchor + tc.block_size > len(sequence):
                break
            one = Dataset([sequence], [anchor], [feats])
            offline = evaluate_at(drafter, target, one, anchor, tc)
            assert offline == accepted
            anchor += accepted


def evaluate_at(drafter, target, ds, anchor, tc):
    from specpilot.fixtures.train_drafter import _batch, draft_hidden
    from specpilot.kernels.dispatch import kernels_forced

    feats, tokens, anchors, labels = _batch(ds, [(0, [anchor])], tc.block_size, drafter.cfg.mask_token_id, "cpu")
    with torch.no_grad(), kernels_forced("naive"):
        hidden = draft_hidden(drafter, target.embed.weight, feats, tokens, anchors, 1)
    chain = drafter.lattice(hidden, target.head_weight, tokens[:, 0], top_k=16).greedy_chain()
    return int((chain == labels).long().cumprod(1).sum()) + 1


def test_saved_drafter_reloads_identically(tmp_path, target, trained):
    drafter, _, eval_ds, tc = trained
    save_drafter(drafter, tmp_path / "d", extra={"training.json": "{}\n"}, max_shard_bytes=40_000)
    again = load_drafter(tmp_path / "d")
    assert (tmp_path / "d" / "training.json").is_file()
    assert len(list((tmp_path / "d").glob("model-*.safetensors"))) > 1  # sharded, and still loads
    a = evaluate(drafter, target.embed.weight, target.head_weight, eval_ds, tc.block_size, drafter.cfg.mask_token_id)
    b = evaluate(again, target.embed.weight, target.head_weight, eval_ds, tc.block_size, again.cfg.mask_token_id)
    assert a == b


def test_corpus_is_deterministic_and_holds_no_benchmark_prompt():
    first, second = distill_prompts(50, seed=7), distill_prompts(50, seed=7)
    assert first == second and len(set(first)) == 50
    assert distill_prompts(50, seed=8) != first
    corpus = "\n".join(distill_prompts(400, seed=0))
    for name in DATASETS:
        try:
            requests = load_requests(name, "all")
        except UserError:
            continue  # data files not on this machine
        for request in requests:
            for turn in request.turns:
                assert turn[:120] not in corpus
