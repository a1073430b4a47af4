"""Token forcing: teacher-forced float32 scoring and the verdict's statistics."""

import torch

from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.forcing.judge import SystemForcing, calibrate_delta, tally, verdict
from specpilot.forcing.score import score_output
from specpilot.models.dense import Mode
from specpilot.runtime.engine import Engine
from tests.conftest import prompts

TARGET = random_target(tiny_target_config(vocab=300), seed=21)


def next_logits(prefix: list[int]) -> torch.Tensor:
    ids = torch.tensor([prefix])
    logits, _ = TARGET(ids, torch.arange(len(prefix))[None], TARGET.new_cache(1, len(prefix)), Mode.PREFILL)
    return logits[0, -1].float()


def biased_greedy(prompt: list[int], n: int, bias: float) -> list[int]:
    """A lossy 'system': greedy decoding with a logit bias on every tenth token id."""
    out = []
    boost = torch.zeros(300)
    boost[::10] = bias
    for _ in range(n):
        out.append(int((next_logits(prompt + out) + boost).argmax()))
    return out


def ar(prompt, n=24):
    return Engine(TARGET, None, context=64).generate(prompt, n, (), "ar").tokens


def test_greedy_output_scores_as_all_argmax():
    for prompt in prompts(3, seed=30):
        out = ar(prompt)
        sc = score_output(TARGET, prompt, out)
        assert all(sc.is_argmax) and max(sc.margin) == 0.0


def test_a_changed_token_is_caught_with_its_margin():
    prompt = prompts(1, seed=31)[0]
    out = ar(prompt)
    bad = list(out)
    bad[5] = (bad[5] + 1) % 300
    sc = score_output(TARGET, prompt, bad[:6])
    assert sc.is_argmax[:5] == [True] * 5 and not sc.is_argmax[5]
    logp = torch.log_softmax(next_logits(prompt + bad[:5]), -1)
    assert abs(sc.margin[5] - (logp.max() - logp[bad[5]]).item()) < 1e-4


def test_gap_to_another_token():
    prompt = prompts(1, seed=32)[0]
    out = ar(prompt, 4)
    other = (out[2] + 7) % 300
    sc = score_output(TARGET, prompt, out, others={2: other})
    logp = torch.log_softmax(next_logits(prompt + out[:2]), -1)
    assert abs(sc.gap_to[2] - (logp[out[2]] - logp[other]).item()) < 1e-4 and sc.gap_to[2] > 0


def test_calibration_rounds_up_the_largest_gap():
    assert calibrate_delta([0.1, -0.2311, 0.05]) == 0.232
    assert calibrate_delta([]) > 0


def test_events_after_a_near_tie_divergence_are_explained():
    from specpilot.forcing.score import TokenScores

    delta = 0.1
    sc = TokenScores([True, False, True, False], [0.0, 0.15, 0.0, 0.9], {})
    s = tally("x", [sc], [[1, 2, 3, 4]], [[1, 9, 9, 9]], delta)  # diverges at 1 with margin 0.15 <= 0.2
    assert s.large_margin_events == 1 and s.unexplained_events == 0
    s = tally("y", [sc], [[1, 2, 3, 4]], [[1, 2, 3, 4]], delta)  # never diverged from stock
    assert s.unexplained_events == 1


def test_verdict_statistics():
    stock = SystemForcing("stock", tokens=10000, mismatches=70)
    same = SystemForcing("re-run", tokens=10000, mismatches=75)
    worse = SystemForcing("fault", tokens=10000, mismatches=200)
    assert verdict(stock, same)[0] == "pass"
    assert verdict(stock, worse)[0] == "reject"
    eventful = SystemForcing("events", tokens=10000, mismatches=70, unexplained_events=30)
    assert verdict(stock, eventful)[0] == "reject"


def test_logit_bias_system_is_rejected_and_ar_passes():
    """End to end on a real (random) target: AR's own output passes against itself, a biased decoder fails."""
    reqs = prompts(4, seed=33)
    ar_out = [ar(p) for p in reqs]
    biased = [biased_greedy(p, 24, bias=3.0) for p in reqs]
    assert biased != ar_out
    delta = calibrate_delta([])
    ref = tally("stock", [score_output(TARGET, p, o) for p, o in zip(reqs, ar_out, strict=True)], ar_out, ar_out,
                delta)
    bad = tally("bias", [score_output(TARGET, p, o) for p, o in zip(reqs, biased, strict=True)], biased, ar_out,
                delta)
    assert ref.mismatches == 0 and bad.mismatches > 0
    assert verdict(ref, ref)[0] == "pass"
    assert verdict(ref, bad)[0] == "reject"


def test_no_fault_outlives_its_generation():
    """A model-level fault reaches the forward as an argument of that generation only: AR on the same target
    object gives the same tokens before and after each faulty generation (issue 27)."""
    from specpilot.config import parse_system
    from specpilot.runtime.faults import MODEL_FAULTS

    prompt = prompts(1, seed=33)[0]
    before = ar(prompt)
    changed = 0
    for fault in MODEL_FAULTS:
        faulty = Engine(TARGET, None, parse_system(f"ar:fault={fault}"), context=64).generate(prompt, 24, ())
        changed += faulty.tokens != before
        assert ar(prompt) == before, fault
    assert changed  # the faults did act on those generations
