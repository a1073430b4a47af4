"""EAGLE-3 training: the training-time test drafts what serving drafts, the loss learns, checkpoints round-trip."""

import pytest
import torch

from specpilot.fixtures.random_models import random_eagle3, random_target, tiny_target_config
from specpilot.models.eagle3 import is_eagle3, load_eagle3, save_eagle3
from specpilot.models.teacher import NAIVE, target_features
from specpilot.speculative.eagle3 import Eagle3
from specpilot.training.distill import Dataset, distill
from specpilot.training.train_drafter import Features, TrainConfig, train
from specpilot.training.train_eagle3 import (
    Eagle3Trainee,
    accept_lengths,
    draft_vocabulary,
    padded,
    target_to_draft,
    unrolled,
)
from tests.conftest import prompts


@pytest.mark.parametrize("anchor", [5, 11, 17])
def test_training_steps_draft_what_serving_drafts(looping_target, anchor):
    """Serving's chain from the anchor (its pending row, then expansions that see the context and their ancestors)
    and the training-time test's steps at row anchor - 1, fed serving's own greedy tokens, give the same tokens and
    log-probabilities at every depth: the training path is the inference path's attention pattern."""
    target = looping_target
    model = random_eagle3(target.cfg, 200, seed=5)
    seq = torch.randint(0, 300, (anchor + 1,), generator=torch.Generator().manual_seed(anchor)).tolist()
    feats = target_features(target, [seq], model.cfg.taps, plan=NAIVE)
    depth = 5
    draft = Eagle3(model, target.embed, context=64, block=depth + 1, plan=NAIVE, width=8, frontier=2)
    with torch.no_grad():
        draft.prefill(feats[:, :anchor], tokens=torch.tensor([seq[:anchor]]))
        lattice = draft.lattice(torch.tensor([seq[anchor]]), torch.tensor([anchor]))
    chain, logp = lattice.tokens[0, :, 0].tolist(), lattice.logp[0, :, 0]  # node 0 of each depth: the greedy path
    assert lattice.greedy_chain()[0].tolist() == chain
    forced = torch.tensor([seq + chain])
    padded_feats = torch.nn.functional.pad(feats, (0, 0, 0, forced.shape[1] - feats.shape[1]))
    with torch.no_grad():
        outs = unrolled(model, target.embed, padded_feats, forced, depth)
    for j, out in enumerate(outs):
        lp = torch.log_softmax(model.logits(out[0, anchor - 1], NAIVE), -1)
        assert model.target_ids(lp.argmax()).item() == chain[j]
        assert lp.max().item() == pytest.approx(logp[j].item(), abs=1e-4)


def test_accept_lengths_count_leading_hits_with_the_bonus():
    """A drafter whose every guess is right commits the whole chain at each anchor whose chain lies in the answer,
    and one token (the bonus) where its first guess is wrong; the oracle never falls below the chain."""
    target = random_target(tiny_target_config(vocab=300), seed=1)
    model = random_eagle3(target.cfg, 300, seed=2)
    model.d2t.zero_()
    seqs = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(0))
    answer = torch.zeros(2, 20, dtype=torch.bool)
    answer[:, 4:] = True
    feats = target_features(target, seqs.tolist(), model.cfg.taps, plan=NAIVE)
    greedy, oracle = accept_lengths(model, target.embed, feats, seqs, answer, 4)
    assert (greedy >= 1).all() and (oracle >= greedy).all() and (oracle <= 5).all()
    # Make row 6's step-0 guess right by construction: its label is the token at 8.
    with torch.no_grad():
        outs = unrolled(model, target.embed, feats, seqs, 1)
        guess = model.logits(outs[0][0, 6], NAIVE).argmax().item()
    seqs2 = seqs.clone()
    seqs2[0, 8] = guess
    greedy2, _ = accept_lengths(model, target.embed, feats, seqs2, answer, 4)
    assert greedy2[0, 6] >= 2


def test_draft_vocabulary_keeps_the_most_frequent_answer_tokens_and_maps_back():
    ds = Dataset([[1, 2, 7, 7, 7, 9, 9, 3], [5, 9, 3, 3]], [2, 1])  # answers: 7 7 7 9 9 3 | 9 3 3
    ids = draft_vocabulary(ds, 16, 3)
    assert ids.tolist() == [3, 7, 9]  # counts 3, 3, 3 (ties by id), then nothing else
    assert draft_vocabulary(ds, 16, 0).tolist() == list(range(16))
    model = random_eagle3(tiny_target_config(vocab=16), 3)
    model.d2t.copy_(ids - torch.arange(3))
    to_draft = target_to_draft(model)
    assert to_draft[ids].tolist() == [0, 1, 2] and (to_draft[[0, 1, 2, 4]] == -1).all()


@pytest.fixture(scope="module")
def eagle_trained(looping_target):
    target = looping_target
    tc = TrainConfig(kind="eagle3", block_size=4, draft_vocab=0, steps=150, seqs_per_step=8, warmup_steps=10,
                     lr=1e-2, seed=0)
    train_ds = _dataset(target, 32, 2)
    eval_ds = _dataset(target, 6, 3)
    model, metrics = train(target, train_ds, eval_ds, tc)
    return model, metrics, tc, train_ds, eval_ds


def _dataset(target, count: int, seed: int) -> Dataset:
    batch = prompts(count, seed=seed)
    return Dataset(distill(target, batch, 24, (), 16), [len(p) for p in batch])


def test_eagle3_training_fits_its_data(looping_target, eagle_trained):
    """As the DFlash drafter's test: optimisation works, and the drafter then drafts its training data, scored by
    the same measure the curve records (and the oracle bounds the chain)."""
    model, metrics, tc, train_ds, _ = eagle_trained
    assert metrics["ce_end"] < 0.2 * metrics["ce_start"], metrics
    features_of = lambda taps: Features(looping_target, taps)  # noqa: E731
    trainee = Eagle3Trainee(looping_target, tc, model, train_ds, 64, features_of)
    fit = trainee.score(train_ds, train_ds, lambda: torch.autocast("cpu", enabled=False))
    assert fit["heldout"]["tau"] > 2.5 and fit["heldout"]["tau"] <= fit["heldout"]["oracle_tau_top_k"] <= 4, fit
    assert fit["dev"]["tau"] > 2.0, fit


def test_a_trained_eagle3_checkpoint_round_trips_and_the_engine_equals_ar(tmp_path, looping_target, eagle_trained):
    from specpilot.runtime.engine import Engine

    model, _, _, _, eval_ds = eagle_trained
    save_eagle3(model, tmp_path / "e", extra={"training.json": "{}\n"}, max_shard_bytes=60_000)
    assert is_eagle3(tmp_path / "e") and (tmp_path / "e" / "training.json").is_file()
    again = load_eagle3(tmp_path / "e", target_layers=looping_target.cfg.num_layers)
    assert torch.equal(again.d2t, model.d2t)
    for name, p in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], p), name
    engine = Engine(looping_target, again, context=160)  # stock verifies the release tree: 61 rows
    for prompt in prompts(3, seed=9):
        ar = engine.generate_one(prompt, 24, (), "ar").tokens
        spec = engine.generate_one(prompt, 24, (), "stock")
        assert spec.tokens == ar


def test_padded_marks_answer_positions():
    ds = Dataset([[1, 2, 3, 4], [5, 6, 7]], [1, 2])
    seqs, answer = padded(ds, [0, 1], 6, "cpu")
    assert seqs.tolist() == [[1, 2, 3, 4, 0, 0], [5, 6, 7, 0, 0, 0]]
    assert answer.tolist() == [[False, True, True, True, False, False], [False, False, True, False, False, False]]


@pytest.mark.slow  # distils and trains twice on two cores
def test_train_drafter_command_trains_resumes_and_scores_an_eagle3_baseline(tmp_path):
    import json

    from tests.conftest import train_drafter_cli as run

    first = run("--out", str(tmp_path / "e1"), "--steps", "3", "--kind", "eagle3", "--block-size", "5",
                "--draft-vocab", "200")
    assert first.returncode == 0, first.stderr
    assert "held-out tau" in first.stdout
    model = load_eagle3(tmp_path / "e1")
    assert model.cfg.draft_vocab == 200
    second = run("--out", str(tmp_path / "e2"), "--steps", "2", "--resume", str(tmp_path / "e1"), "--baseline",
                 str(tmp_path / "e1"))
    assert second.returncode == 0, second.stderr
    record = json.loads((tmp_path / "e2" / "training.json").read_text())
    assert record["metrics"]["train_config"]["kind"] == "eagle3"
    assert record["metrics"]["train_config"]["block_size"] == 5  # the first run's chain, from its record
    assert record["metrics"]["baseline"]["heldout"]["tau"] >= 1.0
    wrong = run("--out", str(tmp_path / "e3"), "--kind", "medusa")
    assert wrong.returncode == 2 and "--kind must be" in wrong.stderr
