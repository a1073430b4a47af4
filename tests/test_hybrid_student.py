"""The hybrid distilled student (training/hybrid_student.py) on a tiny random teacher, on the CPU: its layout, the
init's copies, a function-preserving check, a few steps of distillation, and the save -> load round trip."""

from __future__ import annotations

import pytest
import torch

from specpilot.config import parse_system
from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.models.config import DenseConfig, GDNShape
from specpilot.models.dense import DenseTarget
from specpilot.models.loading import load_target
from specpilot.runtime.engine import Engine
from specpilot.training import hybrid_student as hs

VOCAB = 64


@pytest.fixture(scope="module")
def teacher() -> DenseTarget:
    return random_target(tiny_target_config(vocab=VOCAB, num_layers=8, max_position_embeddings=256), seed=5)


@pytest.fixture(scope="module")
def student(teacher) -> DenseTarget:
    return hs.init_student(teacher, seed=1)


def _seqs(n: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (int(k),), generator=gen).tolist() for k in torch.randint(8, 24, (n,),
                                                                                           generator=gen)]


def test_layout_is_qwen3_5s_pattern_with_the_teachers_attention(teacher):
    cfg = hs.student_config(teacher.cfg)
    assert cfg.kinds == ["gdn", "gdn", "gdn", "attention"] * 2 and cfg.family == "qwen3_5"
    assert not cfg.attn_output_gate and not cfg.qk_norm and cfg.rotated == cfg.head_dim
    assert cfg.gdn == GDNShape(k_heads=2, v_heads=4, k_dim=16, v_dim=16)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim"):
        assert getattr(cfg, name) == getattr(teacher.cfg, name)


def test_the_smollm2_students_gdn_layer_is_the_size_of_the_attention_it_replaces():
    smol = DenseConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                       num_kv_heads=3, head_dim=64, tie_word_embeddings=True)
    cfg = hs.student_config(smol)
    assert cfg.kinds.count("attention") == 7 and cfg.gdn == GDNShape(3, 6, 64, 64)
    with torch.device("meta"):
        model = DenseTarget(cfg, rope_length=1)
    gdn, attn = hs.param_count(model.layers[0].mixer), hs.param_count(model.layers[3].attn)
    assert (gdn, attn) == (894_796, 884_736)


def test_init_copies_every_shared_tensor_exactly(teacher, student):
    theirs, mine = teacher.state_dict(), student.state_dict()
    shared = [k for k in mine if k in theirs]
    assert "embed.weight" in shared and "layers.3.attn.wqkv.weight" in shared and "layers.0.mlp.w13.weight" in shared
    assert all(torch.equal(mine[k], theirs[k]) for k in shared)
    assert {k for k in mine if k not in theirs} == {k for k in mine if ".mixer." in k}
    mixer, attn = student.layers[0].mixer, teacher.layers[0].attn
    q, k, v = attn.wqkv.weight.split([64, 32, 32])
    qkvz = mixer.w_qkvz.weight
    assert torch.equal(qkvz[:16], q[:16]) and torch.equal(qkvz[16:32], q[32:48])  # first query head of each group
    assert torch.equal(qkvz[32:64], k) and torch.equal(qkvz[64:80], v[:16]) and torch.equal(qkvz[80:96], v[:16])
    assert not qkvz[128:].any()  # z: the gate starts closed


@torch.no_grad()
def test_with_gdn_out_projections_zeroed_the_student_is_the_teacher_without_those_attentions(teacher, student):
    """The student's logits equal the teacher's once both replaced branches write nothing (GDN out-projections
    zero in the student, the replaced attention's o_proj zero in the teacher): every shared tensor and every kept
    attention layer computes as the teacher's."""
    import copy

    s, t = copy.deepcopy(student), copy.deepcopy(teacher)
    for i, kind in enumerate(s.cfg.kinds):
        if kind == "gdn":
            s.layers[i].mixer.w_qkvz.weight.normal_()  # an open gate: only the out-projection silences the branch
            s.layers[i].mixer.wo.weight.zero_()
            t.layers[i].attn.wo.weight.zero_()
    ids = torch.tensor(_seqs(3, 7)[0])[None]
    torch.testing.assert_close(hs.forward(s, ids)[0], hs.forward(t, ids)[0], rtol=0, atol=0)
    assert not torch.equal(hs.forward(student, ids)[0], hs.forward(teacher, ids)[0])


def test_a_few_steps_lower_the_kl(teacher):
    student = hs.init_student(teacher, seed=1)
    seqs = _seqs(16, 3)
    tc = hs.StudentTrainConfig(minutes=0, steps=8, seqs_per_step=16, lr=1e-2, warmup_steps=1, eval_every_s=0)
    before = hs.evaluate(student, teacher, seqs, tc)["kl"]
    metrics = hs.train(student, teacher, seqs, seqs, tc)
    after = hs.evaluate(student, teacher, seqs, tc)["kl"]
    assert after < 0.9 * before and metrics["steps_done"] == 8
    assert metrics["curve"][0]["kl"] == pytest.approx(before) and metrics["curve"][-1]["kl"] == pytest.approx(after)
    theirs = teacher.state_dict()  # stage 1 left everything but the GDN layers as the teacher's
    assert all(torch.equal(v, theirs[k]) for k, v in student.state_dict().items() if k in theirs)


def test_stage_two_trains_everything(teacher):
    student = hs.init_student(teacher, seed=1)
    tc = hs.StudentTrainConfig(minutes=0, steps=2, seqs_per_step=4, stage1_fraction=0.5, lr_all=1e-2,
                               warmup_steps=1, eval_every_s=0, hidden_weight=0.1)
    hs.train(student, teacher, _seqs(4, 4), _seqs(2, 5), tc)
    assert not torch.equal(student.embed.weight, teacher.embed.weight)


def test_save_load_round_trips_bitwise_and_the_engine_generates(student, tmp_path):
    hs.save_student(student, tmp_path / "s", dtype=torch.float32, max_shard_bytes=20_000)
    assert len(list((tmp_path / "s").glob("*.safetensors"))) > 1
    loaded = load_target(tmp_path / "s", torch.float32)
    assert loaded.cfg == student.cfg
    mine = student.state_dict()
    assert all(torch.equal(v, mine[k]) for k, v in loaded.state_dict().items()) and loaded.state_dict().keys() == \
        mine.keys()
    prompt = [3, 14, 15, 9, 26]
    want = Engine(student, None, parse_system("ar"), context=64).generate_one(prompt, 12).tokens
    assert Engine(loaded, None, parse_system("ar"), context=64).generate_one(prompt, 12).tokens == want


def test_changed_tensors_and_assemble_rebuild_the_whole_student(teacher, tmp_path):
    student = hs.init_student(teacher, seed=1)
    with torch.no_grad():
        student.layers[0].mixer.wo.weight.add_(0.5)
    changed = hs.changed_tensors(student, hs.init_student(teacher, seed=1))
    assert list(changed) == ["model.layers.0.linear_attn.out_proj.weight"]
    hs.save_student(student, tmp_path / "whole")
    hs.assemble(changed, hs.init_student(teacher, seed=1), tmp_path / "rebuilt")
    for f in (tmp_path / "whole").iterdir():
        assert f.read_bytes() == (tmp_path / "rebuilt" / f.name).read_bytes(), f.name


def test_a_gated_hybrid_saved_loads_in_transformers_as_ours(tmp_path):
    """save_target in Qwen3.5's layout (models/qwen3_5.export) is what transformers reads."""
    pytest.importorskip("transformers")
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    from specpilot.fixtures.random_models import tiny_hybrid_config
    from specpilot.models.loading import save_target

    ours = random_target(tiny_hybrid_config(vocab=VOCAB))
    save_target(ours, tmp_path)
    hf = Qwen3_5ForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor(_seqs(1, 9))
    with torch.no_grad():
        torch.testing.assert_close(hs.forward(ours, ids)[0], hf(ids).logits, rtol=1e-4, atol=1e-4)
