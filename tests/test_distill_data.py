"""Distillation at scale: batched generation, the data folder, features on the fly, replay, the distill job."""

import gzip
import json

import pytest
import torch

from specpilot.bench.oracle import accept_lengths
from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.models.teacher import target_features
from specpilot.training.data import DistilledData, Record, read_records
from specpilot.training.distill import Dataset, Sampling, generate, greedy_batch, pick
from specpilot.training.train_drafter import (
    LENGTH_STEP,
    NAIVE,
    Features,
    TrainConfig,
    block_batch,
    replay,
    train,
    walk,
)
from tests.conftest import prompts


@pytest.fixture(scope="module")
def target():
    return random_target(tiny_target_config(vocab=300), seed=5)


def test_a_padded_batch_answers_as_each_prompt_alone(target):
    """Prompts of lengths 1..15 in one batch (right-padded prefill, junk K/V past each row's prompt) answer
    exactly as each does alone (float32 on the CPU)."""
    batch = prompts(6, seed=11) + [[7]]
    together = greedy_batch(target, batch, 10, ())
    assert [len(a) for a in together] == [10] * len(batch)
    for prompt, answer in zip(batch, together, strict=True):
        assert greedy_batch(target, [prompt], 10, ()) == [answer]


def test_finished_rows_leave_the_batch_without_changing_any_answer(target):
    """With stop tokens that end most rows early, dropping the finished rows (every check, at any share) gives
    the answers of the full batch run to the end, each ending at its first stop token."""
    batch = prompts(12, seed=21)
    full = generate(target, batch, 24, (), check_every=1)
    stops = tuple(sorted({a[k] for a in full for k in (3, 6, 9)}))[:6]  # tokens the answers do emit, early
    expected = []
    for answer in full:
        cut = next((k for k, t in enumerate(answer) if t in stops), None)
        expected.append(answer if cut is None else answer[: cut + 1])
    assert len({len(a) for a in expected}) > 2  # rows stop at different steps
    for shrink, every in ((0.0, 1), (0.5, 1), (0.9, 2), (1.0, 1)):
        assert generate(target, batch, 24, stops, check_every=every, shrink=shrink) == expected

def test_sampling_is_seeded_and_top_k_1_is_greedy(target):
    batch = prompts(4, seed=12)
    draw = lambda seed, s: generate(target, batch, 12, (), s, torch.Generator().manual_seed(seed))  # noqa: E731
    hot = Sampling(temperature=1.5, top_k=0)
    assert draw(1, hot) == draw(1, hot)
    assert draw(1, hot) != draw(2, hot)
    assert draw(1, Sampling(temperature=1.0, top_k=1)) == greedy_batch(target, batch, 12, ())


def test_pick_draws_only_from_the_top_k():
    logits = torch.randn(64, 50)
    g = torch.Generator().manual_seed(0)
    got = pick(logits, Sampling(temperature=2.0, top_k=3), g)
    top = logits.topk(3, dim=-1).indices
    assert bool((top == got[:, None]).any(-1).all())
    assert torch.equal(pick(logits, None, None), logits.argmax(-1))


def _data(n=7, vocab=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = DistilledData(meta={"recipe": {"seed": seed}})
    for i in range(n):
        length = int(torch.randint(3, 40, (1,), generator=g))
        seq = torch.randint(0, vocab, (length,), generator=g).tolist()
        role = ("train", "heldout", "dev")[i % 3]
        data.add(seq, length // 2, Record(role, f"fam{i % 2}", [f"prompt {i}", "again"][: 1 + i % 2]))
    return data


@pytest.mark.parametrize("vocab", [300, 65536, 70000])  # int16 shifted (up to id 65535), and int32 past it
def test_data_folder_round_trips_in_shards(tmp_path, vocab):
    data = _data(25, vocab)
    data.sequences[0][0] = vocab - 1
    data.save(tmp_path / "d", max_shard_bytes=200)
    assert len(list((tmp_path / "d").glob("tokens-*.safetensors"))) > 1
    assert not list(tmp_path.glob(".*part*"))  # written aside, renamed into place
    again = DistilledData.load(tmp_path / "d")
    assert again.sequences == data.sequences and again.prompt_lens == data.prompt_lens
    assert again.records == data.records
    assert again.meta["counts"] == data.counts() and again.meta["recipe"] == {"seed": 0}


def test_data_splits_counts_and_prompt_files(tmp_path):
    data = _data(9)
    train_ds = data.split("train")
    assert len(train_ds.sequences) == 3 and train_ds.features is None
    counts = data.counts()
    assert sum(c["sequences"] for c in counts["roles"].values()) == 9
    assert counts["roles"]["dev"]["answer_tokens"] == sum(
        len(s) - p for s, p, r in zip(data.sequences, data.prompt_lens, data.records, strict=True) if r.role == "dev")
    (tmp_path / "p.gz").write_bytes(data.prompts_file(("train", "heldout")))
    kept = read_records(tmp_path / "p.gz")
    assert {r.role for r in kept} == {"train", "heldout"} and len(kept) == 6
    assert data.prompts_file()[4:8] == bytes(4)  # byte-identical: no timestamp in the gzip header
    lines = gzip.decompress(data.prompts_file()).decode().splitlines()
    assert json.loads(lines[1]) == {"role": "heldout", "family": "fam1", "turns": ["prompt 1", "again"]}


def test_a_bad_data_folder_is_a_user_error(tmp_path):
    from specpilot.errors import UserError

    with pytest.raises(UserError, match="not a distilled-data folder"):
        DistilledData.load(tmp_path)
    data = _data(3)
    with pytest.raises(UserError, match="outside this target's vocabulary"):
        data.check_vocabulary(10)


def test_features_computed_on_the_fly_equal_the_stored_ones(target):
    taps = (0, 1)
    seqs = prompts(5, seed=13)
    stored = Dataset(seqs, [2] * 5, [target_features(target, [s], taps)[0] for s in seqs])
    fly = Dataset(seqs, [2] * 5)
    idx = [3, 0, 4]
    a = Features(None, taps)(stored, idx, "cpu")
    b = Features(target, taps)(fly, idx, "cpu")
    assert a.shape == b.shape
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert float(b[1, len(seqs[0]):].abs().sum()) == 0  # zeros past each sequence, as stored


def test_replay_walks_as_the_oracle_does(trained, looping_target):
    """training.replay (the learning curve's dev tau) and bench.oracle (the --oracle figure) agree on the same
    sequences: the same accept lengths, walked the same way (a trained drafter: steps longer than one token)."""
    drafter, _, _, tc, _ = trained
    target, ps = looping_target, prompts(3, seed=2)  # prompts it was trained on: it drafts their answers
    seqs = [p + a for p, a in zip(ps, greedy_batch(target, ps, 20, ()), strict=True)]
    lens = [len(p) for p in ps]
    got = replay(drafter, target.embed, target.head, Dataset(seqs, lens), tc.block_size, drafter.cfg.mask_token_id,
                 Features(target, tuple(drafter.cfg.target_layer_ids)), blocks_per_pass=7)
    chain, oracle = [], []
    for seq, n in zip(seqs, lens, strict=True):
        c, o = accept_lengths(target, drafter, seq[:n], seq[n:], tc.block_size, top_k=16)
        chain += walk(c)
        oracle += walk(o)
    assert max(chain) > 1 and max(oracle) > 1
    assert got["tau"] == pytest.approx(sum(chain) / len(chain))
    assert got["oracle_tau_top_k"] == pytest.approx(sum(oracle) / len(oracle))
    assert got["steps"] == len(chain) and got["sequences"] == 3


def test_training_on_the_fly_features_learns_and_draws_a_curve(looping_target):
    """Data without stored features (as from a data folder): features come from the target each step; the
    curve holds a point at the start and one at the end, with held-out and dev figures."""
    target = looping_target
    seqs = [p + a for p, a in zip(prompts(24, seed=2), greedy_batch(target, prompts(24, seed=2), 24, ()),
                                     strict=True)]
    lens = [len(p) for p in prompts(24, seed=2)]
    train_ds = Dataset(seqs[:20], lens[:20])
    held = Dataset(seqs[20:], lens[20:])
    dev = Dataset(seqs[:3], lens[:3])  # replayed along answers it learns (held-out tau stays ~1 at this size)
    tc = TrainConfig(block_size=4, layers=1, selector_rank=8, selector_top_k=4, steps=120, seqs_per_step=8,
                     blocks_per_seq=4, warmup_steps=10, lr=1e-2, eval_every_s=1e9, amp=True)  # amp: no-op on CPU
    _, metrics = train(target, train_ds, held, tc, dev_ds=dev)
    assert metrics["ce_end"] < 0.3 * metrics["ce_start"]
    curve = metrics["curve"]
    assert [p["step"] for p in curve] == [0, 120]
    assert {"heldout", "dev"} <= set(curve[-1]) and curve[-1]["label_tokens"] == metrics["label_tokens"] > 0
    assert curve[-1]["dev"]["tau"] > curve[0]["dev"]["tau"]


def test_block_batch_labels_and_padding(target):
    seqs = [list(range(10, 22)), list(range(30, 36))]
    ds = Dataset(seqs, [4, 2])
    feats, tokens, anchors, labels = block_batch(ds, [(0, [4, 10]), (1, [3])], 4, 299, "cpu",
                                                 Features(target, (0,)))
    assert feats.shape[:2] == (2, LENGTH_STEP + 4)  # the longest (12) rounded up, then room for a block
    assert feats[0, :12].abs().sum(-1).min() > 0 and feats[1, :6].abs().sum(-1).min() > 0
    assert feats[0, 12:].abs().sum() == 0 and feats[1, 6:].abs().sum() == 0  # zeros past each sequence
    assert tokens.tolist() == [[14, 299, 299, 299], [20, 299, 299, 299], [33, 299, 299, 299]]
    assert anchors.tolist() == [4, 10, 3]
    assert labels.tolist() == [[15, 16, 17], [21, -100, -100], [34, 35, -100]]
    assert NAIVE.kernels == "naive"


@pytest.mark.slow
def test_distill_then_train_from_the_folder(tmp_path):
    """The two commands end to end on the tiny preset: the data folder, training from it against a baseline,
    and a checkpoint that carries its prompts (train and held-out only: never the dev, benchmark, records)."""
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "specpilot.cli", *args], capture_output=True, text=True,
                              timeout=600)

    made = cli("distill", "--preset", "tiny", "--out", str(tmp_path / "data"), "--templates", "30", "--heldout", "4",
               "--dev-limit", "1", "--max-new-tokens", "6", "--batch", "16")
    assert made.returncode == 0, made.stderr
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    dev = meta["counts"]["roles"].get("dev", {}).get("sequences", 0)
    assert (dev >= 1) == bool(meta["benchmarks_checked"])  # dev answers wherever benchmark files are found
    common = ("--preset", "tiny", "--data", str(tmp_path / "data"), "--steps", "3", "--block-size", "4",
              "--layers", "1", "--selector-rank", "8")
    first = cli("train-drafter", *common, "--out", str(tmp_path / "d1"))
    assert first.returncode == 0, first.stderr
    second = cli("train-drafter", *common, "--out", str(tmp_path / "d2"), "--baseline", str(tmp_path / "d1"))
    assert second.returncode == 0, second.stderr
    record = json.loads((tmp_path / "d2" / "training.json").read_text())
    assert record["metrics"]["baseline"]["path"] == str(tmp_path / "d1")
    assert record["data"]["recipe"]["templates"] == 30 and record["data"]["train_sequences"] > 0
    roles = {r.role for r in read_records(tmp_path / "d2" / "prompts.jsonl.gz")}
    assert roles == {"train", "heldout"}
    missing = cli("train-drafter", "--preset", "tiny", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "x"))
    assert missing.returncode == 2 and "not found" in missing.stderr
    bad = cli("distill", "--preset", "tiny", "--out", str(tmp_path / "y"), "--follow-up-share", "2")
    assert bad.returncode == 2 and "follow-up-share" in bad.stderr and not (tmp_path / "y").exists()


def test_the_prompt_stage_keeps_every_template_family():
    """Templates are distinct by construction and many open alike (every function stub opens with the same
    instruction): only exact duplicates may go, so each family keeps its share (the first GPU run lost all its
    function stubs to a first-12-words rule meant for the self-instruct prompts)."""
    from specpilot.deployment import load_deployment
    from specpilot.runtime.pair import build_pair
    from specpilot.training.corpus import MIX, labelled_prompts
    from specpilot.training.decontaminate import BenchmarkIndex
    from specpilot.training.make_data import DataRecipe, Job

    target, _, tok = build_pair(load_deployment("tiny"), with_drafter=False)
    job = Job(target, tok, DataRecipe(templates=400, self_instruct=0, heldout=8, max_prompt=100_000))
    out, dropped = job.prompts(BenchmarkIndex({}))
    assert not dropped and job.heldout == 8
    drawn = {t for _, t in labelled_prompts(400, 0)} | {t for _, t in labelled_prompts(8, 0)}
    assert {t for _, t, _ in out} == drawn
    families = {f for f, _, _ in out}
    assert families == {f for f, share in MIX if round(400 * share) > 0}
