"""Token forcing: teacher-forced float32 scoring, the measured noise and the verdict's statistics."""

import copy

import pytest
import torch

from specpilot.core.contracts import Forward
from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.forcing.judge import SystemForcing, calibrate_delta, detectable_rate, tally, verdict
from specpilot.forcing.noise import margin_noise
from specpilot.forcing.score import score_output
from specpilot.models.dense import Mode
from specpilot.runtime.engine import Engine
from tests.conftest import prompts

TARGET = random_target(tiny_target_config(vocab=300), seed=21)


def next_logits(prefix: list[int]) -> torch.Tensor:
    ids = torch.tensor([prefix])
    meta = Forward.consecutive(torch.arange(len(prefix))[None])
    logits, _ = TARGET(ids, meta, TARGET.new_cache(1, len(prefix)), Mode.PREFILL)
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
    return Engine(TARGET, None, context=64).generate_one(prompt, n, (), "ar").tokens


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


def test_delta_is_measured_never_assumed():
    # delta is the measured noise; partings beyond it (a lossy reference makes them) widen nothing
    assert calibrate_delta([0.1, -0.2311, 0.05], 0.08) == (0.08, [0.1, -0.2311])
    assert calibrate_delta([], 3e-6) == (3e-6, [])
    prompt = prompts(1, seed=34)[0]
    out = ar(prompt, 32)
    f32 = margin_noise(TARGET, [(prompt, out)])
    b16 = margin_noise(copy.deepcopy(TARGET).to(torch.bfloat16), [(prompt, out)])  # .to converts in place
    assert f32["positions"] == 32 and 0 <= f32["max"] < 1e-4 < b16["max"]
    assert b16["max"] == max(b16["perturbations"].values()) and set(b16["perturbations"]) == {"rows=1", "rows=4",
                                                                                            "rows=16"}


def test_no_divergence_excuses_an_event():
    """Events are judged by their margin alone: an early near-tie (say where the second turn's prompt already
    differs from the reference's, or where the output first parts from it) excuses nothing after it."""
    from specpilot.forcing.score import TokenScores

    sc = TokenScores([True, False, True, False], [0.0, 0.15, 0.0, 0.9], {})
    s = tally("x", [sc], delta=0.1)
    assert s.mismatches == 2 and s.large_margin_events == 1 and s.margins == [0.15, 0.9]
    assert s.events == [{"request": 0, "position": 3, "margin": 0.9}]


def test_the_margin_quantiles_cover_every_mismatch():
    s = SystemForcing("x", tokens=1000, mismatches=100, margins=[i / 100 for i in range(100, 0, -1)])
    q = s.to_json()["margin_quantiles"]
    assert q == {"p25": 0.26, "p50": 0.51, "p75": 0.76, "p90": 0.91, "p99": 1.0}
    assert SystemForcing("none").quantiles() == {}


def test_verdict_statistics():
    stock = SystemForcing("stock", tokens=10000, mismatches=70, margins=[0.01] * 70)
    exact = SystemForcing("ar", tokens=10000, mismatches=68, margins=[0.01] * 68)
    same = SystemForcing("re-run", tokens=10000, mismatches=75, margins=[0.01] * 75)
    worse = SystemForcing("fault", tokens=10000, mismatches=200, margins=[0.01] * 200)
    assert verdict(stock, same, exact, 0.5)["verdict"] == "pass"
    assert verdict(stock, worse, exact, 0.5)["verdict"] == "reject"
    eventful = SystemForcing("events", tokens=10000, mismatches=70, large_margin_events=30, margins=[0.01] * 70)
    assert verdict(stock, eventful, exact, 0.5)["verdict"] == "reject"
    # as many mismatches, none above 2 delta, but every margin larger: the distribution test sees it
    wider = SystemForcing("wider", tokens=10000, mismatches=70, margins=[0.05 + 0.001 * i for i in range(70)])
    judged = verdict(stock, wider, exact, 0.5)
    assert judged["verdict"] == "reject" and judged["tests"]["candidate_vs_reference"]["failed"] == ["margins"]
    # a lossy reference cannot vouch, even for a candidate equal to it: held to AR, the candidate departs too
    judged = verdict(worse, worse, exact, 0.5)
    assert judged["verdict"] == "reject" and "cannot vouch" in judged["reason"] and judged["held_to"] == "ar"
    # a candidate as faithful as AR itself passes although the reference departs, its power stated against AR's
    judged = verdict(worse, same, exact, 0.5)
    assert judged["verdict"] == "pass" and "held to AR" in judged["reason"] and judged["held_to"] == "ar"
    assert judged["detectable_rate"] == detectable_rate(same.tokens, exact.mismatches, exact.tokens)


def test_detectable_rate():
    """The rate the verdict's own Fisher test detects with 80% power, worked by brute force: the fewest candidate
    mismatches that reject against the reference's count, then the rate that reaches them 80% of the time."""
    from scipy.stats import binom, fisher_exact

    level = 0.05 / 6
    for n, b, m in ((1000, 0, 1000), (4000, 12, 3000)):
        k = next(a for a in range(n + 1)
                 if fisher_exact([[a, n - a], [b, m - b]], alternative="greater").pvalue < level)
        e = detectable_rate(n, b, m)
        assert binom.sf(k - 1, n, b / m + e) == pytest.approx(0.8, abs=1e-6)
    assert detectable_rate(1000, 0, 1000) > 5 / 1000  # a zero-mismatch reference still needs several mismatches
    assert detectable_rate(100_000, 100, 10_000) < detectable_rate(10_000, 100, 10_000) < detectable_rate(
        1000, 100, 10_000)
    assert detectable_rate(0, 0, 100) == 1.0 and detectable_rate(3, 0, 3) == 1.0  # nothing scored, nothing decides


def test_logit_bias_system_is_rejected_and_ar_passes():
    """End to end on a real (random) target: AR's own output passes against itself, a biased decoder fails."""
    reqs = prompts(4, seed=33)
    ar_out = [ar(p) for p in reqs]
    biased = [biased_greedy(p, 24, bias=3.0) for p in reqs]
    assert biased != ar_out
    delta, _ = calibrate_delta([], margin_noise(TARGET, list(zip(reqs, ar_out, strict=True)))["max"])
    ref = tally("stock", [score_output(TARGET, p, o) for p, o in zip(reqs, ar_out, strict=True)], delta)
    bad = tally("bias", [score_output(TARGET, p, o) for p, o in zip(reqs, biased, strict=True)], delta)
    assert ref.mismatches == 0 and bad.mismatches > 0
    assert verdict(ref, ref, ref, delta)["verdict"] == "pass"
    assert verdict(ref, bad, ref, delta)["verdict"] == "reject"


def test_no_fault_outlives_its_generation():
    """A model-level fault reaches the forward as an argument of that generation only: AR on the same target
    object gives the same tokens before and after each faulty generation (issue 27)."""
    from specpilot.config import parse_system
    from specpilot.runtime.faults import MODEL_FAULTS

    prompt = prompts(1, seed=33)[0]
    before = ar(prompt)
    changed = 0
    for fault in MODEL_FAULTS:
        faulty = Engine(TARGET, None, parse_system(f"ar:fault={fault}"), context=64).generate_one(prompt, 24, ())
        changed += faulty.tokens != before
        assert ar(prompt) == before, fault
    assert changed  # the faults did act on those generations


def test_new_faults_act_where_they_say():
    from specpilot.runtime.faults import HOLE, NEAR_TIE, distort, lower_state

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 200, generator=g)
    top = logits.topk(2, -1)
    near = (top.values[:, 0] - top.values[:, 1]) < NEAR_TIE
    chosen = distort(logits, "near_tie").argmax(-1)
    assert near.any() and (~near).any()
    assert torch.equal(chosen[near], top.indices[near, 1]) and torch.equal(chosen[~near], top.indices[~near, 0])
    holed = distort(logits, "vocab_hole").argmax(-1)
    assert ((holed + 1) % HOLE != 0).all() and torch.equal(holed[(top.indices[:, 0] + 1) % HOLE != 0],
                                                            top.indices[(top.indices[:, 0] + 1) % HOLE != 0, 0])
    k, v = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)
    k0 = k.clone()
    lower_state(k, v)
    assert not torch.equal(k, k0) and torch.allclose(k, k0, rtol=0.07, atol=1e-2)  # float8 e4m3: 3 mantissa bits
    k1 = k.clone()
    lower_state(k, v)
    assert torch.equal(k, k1)  # rounding what is already rounded changes nothing


def test_round_robin_samples_every_dataset_first():
    from types import SimpleNamespace

    from specpilot.datasets import round_robin

    reqs = [SimpleNamespace(dataset=d, id=f"{d}{i}") for d, n in (("a", 3), ("b", 1), ("c", 2)) for i in range(n)]
    assert [r.id for r in round_robin(reqs)] == ["a0", "b0", "c0", "a1", "c1", "a2"]


def test_exact_target_is_the_float32_function():
    """The FP32-reference mode's model: float32, and for a twin the unwidened target (the same function)."""
    import dataclasses

    from specpilot.deployment import load_deployment
    from specpilot.forcing.run import exact_target
    from specpilot.runtime.pair import build_pair

    dep = dataclasses.replace(load_deployment("tiny"), dtype="bfloat16", twin_width=2)
    wide, exact = build_pair(dep, with_drafter=False)[0], exact_target(dep)
    assert exact.embed.weight.dtype == torch.float32 and wide.embed.weight.dtype == torch.bfloat16
    assert 2 * exact.cfg.hidden_size == wide.cfg.hidden_size
    tokens = torch.tensor([prompts(1, seed=35)[0]]) % exact.cfg.vocab_size
    a, b = wide.normed_hidden(tokens).float() @ wide.head_weight.float().t(), exact.normed_hidden(tokens) @ \
        exact.head_weight.t()
    assert (a - b).norm() / b.norm() < 0.05  # the same logits, up to bf16 rounding


def test_kernel_changes_below_float32_are_judged_by_the_float32_target():
    """exact_mode("auto"): the deployment's target shares cuBLAS's rounding with the reference, so a candidate with
    other kernels (or another tree's code) in bf16 is scored by the float32 model; any other candidate, and every
    candidate of a float32 deployment, by the deployment's own target. Explicit modes stand; a typo is refused."""
    import dataclasses

    from specpilot.deployment import load_deployment
    from specpilot.errors import UserError
    from specpilot.forcing.run import ExactTargets, exact_mode

    fp32 = load_deployment("tiny")
    bf16 = dataclasses.replace(fp32, dtype="bfloat16")
    kernels = [("ar", "ar:weights=w12"), ("ar", "ar:fewrow=true"), ("stock", "stock:gemv=true"),
               ("stock", "stock:kernels=naive"), ("stock:gemv=true", "stock")]
    same = [("ar", "ar"), ("stock", "stock:tree=best_first,nodes=32"), ("stock", "stock:verify=tlv"),
            ("stock", "stock:fault=logit_bias"), ("stock:weights=w12", "stock:weights=w12,block_size=8")]
    for ref, cand in kernels:
        assert exact_mode("auto", bf16, ref, cand) == "float32", cand
        assert exact_mode("auto", fp32, ref, cand) == "deployment", cand
    for ref, cand in same:
        assert exact_mode("auto", bf16, ref, cand) == "deployment", cand
    assert exact_mode("auto", bf16, "stock", "stock:anything_another_tree_has=1", foreign=True) == "float32"
    assert exact_mode("deployment", bf16, "ar", "ar:weights=w12") == "deployment"
    assert exact_mode("float32", fp32, "ar", "ar") == "float32"
    with pytest.raises(UserError, match="auto"):
        exact_mode("fp32", bf16, "ar", "ar")
    targets = ExactTargets(bf16)
    assert targets.target("deployment") is None
    model = targets.target("float32")
    assert model.embed.weight.dtype == torch.float32 and targets.target("float32") is model  # built once
    assert targets.pick("auto", "ar", "ar:weights=w12") == ("float32", model)
    assert targets.pick("auto", "ar", "ar") == ("deployment", None)


def test_float32_ar_beside_the_verdict_answers_the_first_requests_only(monkeypatch):
    """In the FP32-reference mode AR of the float32 model runs here, one request at a time, uncaptured: on the
    first EXACT_AR_REQUESTS requests only (reported, it does not decide), compared with AR on the same ones."""
    from specpilot.bench.harness import Runner
    from specpilot.datasets import load_requests
    from specpilot.deployment import load_deployment
    from specpilot.forcing import run
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("tiny")
    target, drafter, tok = build_pair(dep)
    requests = load_requests("builtin", "dev", None, 3)
    monkeypatch.setattr(run, "EXACT_AR_REQUESTS", 1)
    report = run.force(Runner(target, drafter, tok, dep.context), "stock", "stock:block_size=2", requests, 8,
                       exact=run.exact_target(dep))
    fp32, ar = report["systems"]["ar_float32"], report["systems"]["ar"]
    assert fp32["requests"] == 1 and 0 < fp32["tokens"] < ar["tokens"]
    assert fp32["tokens"] == 8 * len(requests[0].turns)  # the first request's turns, at most 8 tokens each


def test_a_foreign_worker_s_records_are_scored_only_on_the_request_s_own_prompts():
    """Forcing of another tree's outputs (forcing/run.checked): each turn's prompt must be the one this install
    builds from the request and the candidate's earlier answers; a worker that answered something else is refused,
    and its turns must be the request's."""
    from specpilot.bench.harness import Runner, TurnRecord
    from specpilot.datasets import Request
    from specpilot.deployment import load_deployment
    from specpilot.errors import UserError
    from specpilot.forcing.run import checked
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("tiny")
    target, drafter, tok = build_pair(dep)
    runner = Runner(target, drafter, tok, dep.context)
    req = Request("builtin/x", "builtin", ("first question", "second question"), "dev")
    one = tok.chat_prompt([{"role": "user", "content": "first question"}])
    answer = list(b"an answer")
    two = tok.chat_prompt([{"role": "user", "content": "first question"},
                           {"role": "assistant", "content": tok.decode(answer)},
                           {"role": "user", "content": "second question"}])
    good = [TurnRecord("builtin/x#turn1", "builtin", 1, one, answer, 0, 0),
            TurnRecord("builtin/x#turn2", "builtin", 2, two, answer, 0, 0)]
    assert checked(runner, req, good) == good
    easier = [good[0], TurnRecord("builtin/x#turn2", "builtin", 2, one, answer, 0, 0)]
    with pytest.raises(UserError, match="prompt other than"):
        checked(runner, req, easier)
    with pytest.raises(UserError, match="1 turns, not 2"):
        checked(runner, req, good[:1])


def _noise_margins(rng, n, delta):
    """n mismatch margins of near-ties: below the event threshold (2 delta)."""
    return [rng.uniform(0.001, 2 * delta) for _ in range(n)]


def _with_events(name, tokens, margins, events):
    """A tally whose mismatches are `margins` plus one per event (request, position, margin)."""
    s = SystemForcing(name, tokens=tokens, mismatches=len(margins) + len(events),
                      large_margin_events=len(events), margins=margins + [m for _, _, m in events])
    s.events = [{"request": r, "position": p, "margin": m} for r, p, m in events]
    return s


def test_a_gross_event_rejects_whatever_the_counts():
    """delta 0.5: one event at 1.1 nats in 288k tokens against the reference's none (as ar:weights=w12 on an H100)
    stays with the event-rate test and passes; one beyond GROSS delta (4 nats) rejects, unless the reference made
    that very choice, which is then the reference's own departure from AR."""
    import random

    from specpilot.forcing.judge import GROSS

    seed = random.randrange(2**32)
    rng, delta, tokens = random.Random(seed), 0.5, 288_000
    assert GROSS * delta == 4.0
    n = rng.randrange(3000, 3600)
    # every side's near-ties are one draw: only the events differ (independent draws failed the margins tests at
    # their false-alarm rate, 10 of 450 seeds, which is those tests' business, not this one's)
    ties = _noise_margins(rng, n + rng.randrange(-30, 30), delta)
    ref, ar = _with_events("stock", tokens, list(ties), []), _with_events("ar", tokens, list(ties), [])
    at = (rng.randrange(1000), rng.randrange(256))
    small = _with_events("w12", tokens, list(ref.margins), [(*at, rng.uniform(1.05, 1.2))])
    judged = verdict(ref, small, ar, delta)
    assert judged["verdict"] == "pass", (seed, judged["reason"])
    assert judged["tests"]["candidate_vs_reference"]["gross"]["count"] == 0
    big = _with_events("lossy", tokens, list(ref.margins), [(*at, rng.uniform(4.01, 9.0))])
    judged = verdict(ref, big, ar, delta)
    assert judged["verdict"] == "reject" and judged["tests"]["candidate_vs_reference"]["failed"] == ["gross events"], (
        seed, judged["tests"]["candidate_vs_reference"]["failed"])
    assert "beyond 8 delta" in judged["reason"] and judged["tests"]["candidate_vs_reference"]["events_p"] > 0.1
    # the reference made the same choice: the candidate is no worse than it, but the reference departs from AR
    shared = _with_events("stock", tokens, ref.margins, [(*at, big.events[0]["margin"])])
    judged = verdict(shared, big, ar, delta)
    assert not judged["tests"]["candidate_vs_reference"]["failed"]
    assert judged["verdict"] == "reject" and "cannot vouch" in judged["reason"] and "gross" in judged["reason"]
    assert verdict(shared, big, _with_events("ar", tokens, ar.margins, [(*at, 5.0)]), delta)["verdict"] == "pass"


def test_the_same_event_is_the_same_choice_in_the_same_context():
    """With outputs, an event names its choice (the token and everything before it): another system's event at the
    same position after another earlier token is not the same one."""
    from specpilot.forcing.judge import gross
    from specpilot.forcing.score import TokenScores

    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    prompt, out = torch.randint(3, 300, (6,), generator=g).tolist(), torch.randint(3, 300, (4,), generator=g).tolist()
    other = [out[0], (out[1] + 1) % 300, *out[2:]]  # parts from `out` before the event at position 3
    sc = TokenScores([True, True, True, False], [0.0, 0.0, 0.0, 6.0], {})
    a, same, moved = (tally(x, [sc], 0.5, [(prompt, o)]) for x, o in (("a", out), ("b", out), ("c", other)))
    assert a.events[0]["choice"] == same.events[0]["choice"] != moved.events[0]["choice"]
    assert gross(a, same, 4.0) == [] and gross(a, moved, 4.0) == a.events
    assert gross(a, moved, 6.5) == []  # below the bar: the event-rate test's


def test_few_tokens_cannot_pass_six_events_the_reference_lacks():
    """64 tokens (the default loop's), six mismatches against none: at 5 nats the gross rule rejects; at 3.5 nats
    (under the bar) Fisher's p = 0.014 is above its level, so with the power bound the verdict is inconclusive,
    never a pass."""
    from specpilot.forcing import POWER_BOUND
    from specpilot.forcing.run import _with_power

    ref, ar = SystemForcing("stock", tokens=64), SystemForcing("ar", tokens=64)
    for margin, expected in ((5.0, "reject"), (3.5, "inconclusive")):
        cand = _with_events("cand", 64, [], [(k % 4, 3 * k, margin) for k in range(6)])
        report = _with_power(verdict(ref, cand, ar, 0.5), POWER_BOUND, 4)
        assert report["verdict"] == expected, report["reason"]
    assert report["tests"]["candidate_vs_reference"]["mismatch_p"] == pytest.approx(0.0138, abs=1e-3)
    assert _with_power(verdict(ref, cand, ar, 0.5), None, 4)["verdict"] == "pass"  # what the loop used to see


def test_the_report_says_where_the_candidate_s_outputs_equal_the_reference_s():
    """force()'s agreement: a lossless candidate on a float32 deployment gives the reference's outputs on every
    request, a lossy one does not."""
    from specpilot.bench.harness import Runner
    from specpilot.datasets import load_requests
    from specpilot.deployment import load_deployment
    from specpilot.forcing.run import force
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("tiny")
    target, drafter, tok = build_pair(dep)
    runner, requests, reuse = Runner(target, drafter, tok, dep.context), load_requests("builtin", "dev", None, 3), {}
    same = force(runner, "stock", "stock:block_size=2", requests, 8, reuse=reuse)
    assert same["agreement"] == {"requests": len(requests), "equal": len(requests)}
    lossy = force(runner, "stock", "stock:fault=logit_bias", requests, 8, reuse=reuse)
    assert lossy["agreement"]["requests"] == len(requests) and lossy["agreement"]["equal"] < len(requests)
