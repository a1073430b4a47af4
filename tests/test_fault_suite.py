"""The fault suite: every deliberately lossy system is rejected by token forcing (or, where the suite's tokens
are too few to see it, called inconclusive, never passed), every lossless variant passes, and a reference that
shares a fault cannot vouch (CPU; float32, and bf16 where the fault is a loss at that precision)."""

import pytest
import torch

from specpilot.bench.harness import Runner
from specpilot.datasets import load_requests
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from specpilot.forcing.run import force
from specpilot.models.tokenizer import ByteTokenizer

FAULTS = ["logit_bias", "low_head", "skip_layer", "topk_truncate", "norm_eps", "unverified_accept", "near_tie",
          "kv_low", "rare_unverified", "vocab_hole"]
LOSSLESS = ["stock", "ar", "stock:block_size=4", "stock:graphs=false", "stock:tree=best_first,nodes=12",
            "stock:tree=eagle2,nodes=6"]


BF16_SKIPPED = ("stock:block_size=4", "stock:graphs=false")  # the CPU's bf16 is slow; the H200 suite judges them
# Faults whose loss does not depend on the precision (a bias, a skipped layer, unverified or removed tokens): the
# CPU judges them in float32 only; the H200 suite judges every fault in bf16 on the real pair and the twin.
BF16_FAULTS = ("low_head", "topk_truncate", "norm_eps", "near_tie", "kv_low")


def near_tie_target(dtype):
    """Real LLMs have many near-ties; random tiny ones few. In float32, pair up LM-head rows (token 2k+1
    is token 2k's row nudged by 1e-3) so that the argmax often sits between two almost equal logits.
    (In bfloat16 such pairs are below the dtype's resolution: stock itself would pick either.)"""
    cfg = tiny_target_config(vocab=512)
    target = random_target(cfg, seed=4)
    if dtype is not torch.float32:
        return target.to(dtype)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        head = target.lm_head
        head[1::2] = head[0::2] * (1 + 1e-3 * torch.randn(head[0::2].shape, generator=g))
    return target.to(dtype)


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def runner(request):
    dtype = request.param
    target = near_tie_target(dtype)
    drafter = random_drafter(tiny_drafter_config(target.cfg, block_size=8), seed=5).to(dtype)
    return Runner(target, drafter, ByteTokenizer(512), context=256), dtype, {}  # the reference's and AR's runs


@pytest.fixture(scope="module")
def all_requests():
    # the 16 prompts the built-in set had when the figures below were measured (it holds 32 since 2026-12-06)
    return [r for r in load_requests("builtin", "all") if int(r.id.split("/")[1]) < 16]


@pytest.fixture(scope="module")
def requests(all_requests):
    return all_requests[:6]


@pytest.mark.parametrize("fault", FAULTS)
def test_faults_are_rejected(runner, all_requests, fault):
    """On 6 requests, doubled (up to all 16) while the tokens scored cannot see the power bound: the judge's own
    rule. An FP8 head under bf16 (low_head) needed 16 on one CPU (4.56% vs 1.56%, p = 0.00046; on 6: 4.51% vs
    1.74%, inconclusive), while CI's passed it on 6: bf16 rounding differs between CPU models."""
    runner, dtype, reuse = runner
    if dtype is torch.bfloat16 and fault not in BF16_FAULTS:
        pytest.skip("a loss at any precision: float32 covers it on the CPU")
    report = force(runner, "stock", f"stock:fault={fault}", all_requests, 48, reuse=reuse, bound=0.001, start=6)
    if fault == "kv_low" and dtype is torch.bfloat16:
        # An FP8 K/V cache under bf16 moves ~1.3 points of this tiny model's tokens, all at near-ties (measured on
        # all 16 builtin requests: 3.26% vs 1.95%, p = 0.07); 768 tokens cannot see that, and the judge says so
        # instead of passing it.
        assert report["verdict"] == "inconclusive" and report["detectable_rate"] > 0.01, report["reason"]
        return
    assert report["verdict"] == "reject", report["reason"]


@pytest.mark.parametrize("candidate", LOSSLESS)
def test_lossless_variants_pass(runner, requests, candidate):
    runner, dtype, reuse = runner
    if dtype is torch.bfloat16 and candidate in BF16_SKIPPED:
        pytest.skip("float32 covers it; in bf16 the suite keeps stock, AR and the trees")
    report = force(runner, "stock", candidate, requests, 48, reuse=reuse)
    assert report["verdict"] == "pass", report["reason"]
    assert set(report["systems"]) == {"reference", "candidate", "ar"}


def test_a_reference_sharing_the_flaw_cannot_vouch(runner, requests):
    """The candidate equals a lossy reference: against the reference alone it would pass; against the exact
    target the reference fails, so the verdict rejects and says why."""
    runner, _, reuse = runner
    report = force(runner, "stock:fault=logit_bias", "stock:fault=logit_bias", requests, 48, reuse=reuse)
    assert report["verdict"] == "reject" and "cannot vouch" in report["reason"]
    assert not report["tests"]["candidate_vs_reference"]["failed"]
