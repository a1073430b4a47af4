"""Drafter self-distillation: data generation, the training path against the serving path, learning."""

import copy
from dataclasses import replace

import pytest
import torch

from specpilot.datasets import DATASETS, UserError, load_requests
from specpilot.deployment import load_deployment
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_hybrid_config, tiny_target_config
from specpilot.models.loading import load_drafter, save_drafter
from specpilot.models.teacher import target_features
from specpilot.runtime.engine import Engine
from specpilot.training.corpus import distill_prompts
from specpilot.training.distill import Dataset, greedy_batch
from specpilot.training.train_drafter import (
    NAIVE,
    TrainConfig,
    block_batch,
    draft_hidden,
    drafter_config,
    evaluate,
    train,
)
from tests.conftest import RecordingEngine, prompts


@pytest.fixture(scope="module")
def target():
    return random_target(tiny_target_config(vocab=300), seed=3)


def test_greedy_batch_equals_single_request_ar(target):
    batch = prompts(5)
    answers = greedy_batch(target, batch, 20, ())
    engine = Engine(target, None, context=64)
    for prompt, answer in zip(batch, answers, strict=True):
        assert answer == engine.generate_one(prompt, 20, (), "ar").tokens


def test_greedy_batch_stops_rows_at_their_stop_token(target):
    batch = prompts(3, seed=1)
    free = greedy_batch(target, batch, 12, ())
    stop = free[0][5]
    stopped = greedy_batch(target, batch, 12, (stop,))
    for row, full in zip(stopped, free, strict=True):
        cut = full.index(stop) + 1 if stop in full else len(full)
        assert row == full[:cut]


def test_training_fits_its_data(looping_target, trained):
    """32 loops of 32 different tokens are memorised rather than generalised (held-out tau stays ~1 at
    this size), so the check is that optimisation works: the drafter then drafts its training data."""
    drafter, metrics, _, tc, train_ds = trained
    assert metrics["ce_end"] < 0.2 * metrics["ce_start"], metrics  # it starts near log(vocab)
    fit = evaluate(drafter, looping_target.embed, looping_target.head, train_ds, tc.block_size,
                   drafter.cfg.mask_token_id)
    assert fit["tau"] > 3.0 and fit["tau"] <= fit["oracle_tau_top_k"] <= tc.block_size, fit


@pytest.mark.parametrize("hybrid, kind", [(False, "dflash"), (True, "dflash"), (False, "dspark")])
def test_training_path_drafts_what_the_engine_drafts(target, hybrid, kind):
    """The training path (many blocks, context written once and repeated) and the serving path (one
    block per step, context from verify rows) draft the same tokens at the same anchors; on a hybrid target too
    (its taps from a batched prefill of whole sequences, the drafter recipe of the distilled hybrid), and for a
    DSpark drafter (its anchor drafts too; its Markov head's sequential picks)."""
    if hybrid:
        target = random_target(tiny_hybrid_config(vocab=300), seed=3)
    tc = TrainConfig(block_size=4, layers=1, selector_rank=8, selector_top_k=4, kind=kind, markov_rank=8)
    drafter = random_drafter(drafter_config(target.cfg, tc), seed=9)
    engine = RecordingEngine(target, drafter, context=96)
    taps = tuple(drafter.cfg.target_layer_ids)
    for prompt in prompts(3, seed=4):
        gen = engine.generate_one(prompt, 30, (), "stock")
        sequence = prompt + gen.tokens
        feats = target_features(target, [sequence], taps)[0]
        ds = Dataset([sequence], [len(prompt)], [feats])
        for anchor, drafts in engine.drafted:
            assert offline_chain(drafter, target, ds, anchor, tc) == drafts
        engine.drafted.clear()


def offline_chain(drafter, target, ds, anchor, tc):
    feats, tokens, anchors, _ = block_batch(ds, [(0, [anchor])], drafter.cfg.rows, drafter.cfg.mask_token_id, "cpu",
                                            inputs=drafter.cfg.block_size)
    with torch.no_grad():
        hidden = draft_hidden(drafter, target.embed, feats, tokens, anchors, 1)
    return drafter.lattice(hidden, target.head, tokens[:, 0], 16, NAIVE).greedy_chain()[0].tolist()


def test_saved_drafter_reloads_identically(tmp_path, looping_target, trained):
    target = looping_target
    drafter, _, eval_ds, tc, _ = trained
    save_drafter(drafter, tmp_path / "d", extra={"training.json": "{}\n"}, max_shard_bytes=40_000)
    again = load_drafter(tmp_path / "d")
    assert (tmp_path / "d" / "training.json").is_file()
    assert len(list((tmp_path / "d").glob("model-*.safetensors"))) > 1  # sharded, and still loads
    a = evaluate(drafter, target.embed, target.head, eval_ds, tc.block_size, drafter.cfg.mask_token_id)
    b = evaluate(again, target.embed, target.head, eval_ds, tc.block_size, again.cfg.mask_token_id)
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


def test_resumed_training_starts_where_the_first_run_ended(looping_target, trained):
    drafter, metrics, eval_ds, tc, train_ds = trained
    again, resumed = train(looping_target, train_ds, eval_ds, replace(tc, steps=20), init=copy.deepcopy(drafter))
    assert resumed["ce_start"] < 0.5 * metrics["ce_start"]  # not a fresh start
    assert resumed["ce_start"] < metrics["ce_end"] + 0.5
    assert again.cfg == drafter.cfg


@pytest.mark.slow  # 18 s of training on two cores
def test_train_drafter_command_and_resume(tmp_path):
    import json

    from tests.conftest import train_drafter_cli as run

    first = run("--out", str(tmp_path / "d1"), "--steps", "4", "--block-size", "4", "--layers", "1",
                "--selector-rank", "8")
    assert first.returncode == 0, first.stderr
    assert "held-out tau" in first.stdout
    second = run("--out", str(tmp_path / "d2"), "--steps", "3", "--resume", str(tmp_path / "d1"), "--layers", "2")
    assert second.returncode == 0, second.stderr
    record = json.loads((tmp_path / "d2" / "training.json").read_text())
    assert record["resumed_from"]["path"] == str(tmp_path / "d1")
    assert record["resumed_from"]["training"]["metrics"]["steps_done"] == 4
    assert record["metrics"]["train_config"]["layers"] == 1  # the checkpoint's depth, not --layers
    missing = run("--out", str(tmp_path / "d3"), "--resume", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_other_seeds_never_train_on_the_held_out_prompts():
    """The distill job's split: the held-out prompts are the same draw whatever the seed, and no seed's
    training prompts (first or second turns) hold one of them."""
    from specpilot.runtime.pair import build_pair
    from specpilot.training.make_data import DataRecipe, Job

    target, _, tok = build_pair(load_deployment("tiny"), with_drafter=False)
    held = {}
    for seed in (0, 1):
        recipe = DataRecipe(templates=40, self_instruct=0, follow_up_share=0.5, heldout=5, dev_limit=0, max_new=3,
                            batch=16, seed=seed)
        data = Job(target, tok, recipe).run()
        roles = {r.role for r in data.records}
        assert roles == {"train", "heldout"}
        held[seed] = {r.turns[0] for r in data.records if r.role == "heldout"}
        trained = {t for r in data.records if r.role == "train" for t in r.turns}
        assert len({r.turns[0] for r in data.records if r.role == "heldout" and len(r.turns) == 1}) == 5
        assert not held[seed] & trained
    assert held[0] == held[1]


def test_a_dspark_drafter_fits_its_data_and_its_confidence_tells_hits_from_misses(looping_target):
    """DeepSpec's loss (CE, TV, confidence) through the same training path: the drafter then drafts its training
    data, and its confidence head rates the drafts that hit above those that miss."""
    from tests.conftest import build_dataset

    target = looping_target
    tc = TrainConfig(block_size=3, layers=1, kind="dspark", markov_rank=8, steps=200, seqs_per_step=8,
                     blocks_per_seq=4, warmup_steps=10, lr=1e-2, seed=0)
    taps = tuple(drafter_config(target.cfg, tc).target_layer_ids)
    train_ds = build_dataset(target, prompts(32, seed=2), 24, (), taps, batch=16, feature_dtype=torch.float32)
    drafter, metrics = train(target, train_ds, train_ds, tc)
    assert drafter.cfg.rows == 4 and metrics["ce_end"] < 0.2 * metrics["ce_start"], metrics
    fit = evaluate(drafter, target.embed, target.head, train_ds, drafter.cfg.rows, drafter.cfg.mask_token_id)
    assert fit["tau"] > 2.5 and fit["tau"] <= fit["oracle_tau_top_k"] <= drafter.cfg.rows, fit
    picks = [(i, list(range(train_ds.prompt_lens[i], train_ds.prompt_lens[i] + 8))) for i in range(16)]
    feats, tokens, anchors, labels = block_batch(train_ds, picks, 4, drafter.cfg.mask_token_id, "cpu", inputs=3)
    with torch.no_grad():
        hidden = draft_hidden(drafter, target.embed, feats, tokens, anchors, 8)
        lattice = drafter.lattice(hidden, target.head, tokens[:, 0], 16, NAIVE)
    hit = lattice.greedy_chain()[:, 0] == labels[:, 0]
    assert hit.any() and (~hit).any()
    assert lattice.confidence[hit, 0].mean() > lattice.confidence[~hit, 0].mean() + 0.1
