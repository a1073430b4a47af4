"""The controller's runner: workers import the code they were asked for, take turns, and report."""

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.controller.compare import REPO as REPO_ROOT
from specpilot.controller.compare import Side, compare, measure, source_tree
from specpilot.errors import UserError

SPEC = {"preset": "tiny", "datasets": ["builtin"], "limit": 4, "max_new_tokens": 8}


def test_aa_and_ab_evidence_card():
    with source_tree(None) as here:
        card = compare(Side("ar", here), Side("stock", here), SPEC, block=2, timeout=300)
    ab = card["ab"]
    assert len(ab["requests"]) == 4 and len(ab["ratios"]) == 4
    assert ab["a"]["code_hash"] == ab["b"]["code_hash"] == Side("ar", here).expected_hash
    assert ab["outputs_equal"]  # float32 on the CPU: stock is lossless
    assert card["decision"]["verdict"] in ("promote", "reject") and card["decision"]["bar"] > 1.01
    assert "aa" in card and len(card["aa"]["ratios"]) == 4


def test_an_earlier_aa_run_is_reused_in_its_own_mode_only():
    with source_tree(None) as here:
        first = compare(Side("ar", here), Side("ar", here), SPEC, timeout=300, alternating=True)
        card = compare(Side("ar", here), Side("stock", here), SPEC, timeout=300, aa=first["aa"], alternating=True)
        assert card["aa"] is first["aa"]  # no new A/A run
        assert card["decision"]["noise"] == first["decision"]["noise"]
        assert card["slots"]["aa_gain"] == first["aa"]["estimate"]["gain"]
        assert card["slots"]["corrected"]["requests"] == 4
        with pytest.raises(UserError, match="not comparable"):
            compare(Side("ar", here), Side("stock", here), SPEC, block=2, timeout=300, aa=first["aa"],
                    gpus=["0", "1"])


def test_a_commit_runs_from_its_own_worktree():
    with source_tree("HEAD") as tree:
        assert tree.name.startswith("specpilot-wt-")
        result = measure(Side("ar", tree), Side("ar", tree), SPEC, block=4, gpu=None, timeout=300, alternating=True)
    assert result["a"]["source"] == str(tree) and result["a"]["code_hash"] == result["b"]["code_hash"]
    assert not tree.exists()  # the temporary worktree is removed


def test_a_worker_with_other_code_is_refused(monkeypatch):
    monkeypatch.setattr(Side, "expected_hash", property(lambda self: "0" * 64))
    with source_tree(None) as here, pytest.raises(UserError, match="refusing to time it"):
        measure(Side("ar", here), Side("ar", here), SPEC, block=4, gpu=None, timeout=300)


def test_bad_commit_is_a_clear_error():
    made = set(Path(tempfile.gettempdir()).glob("specpilot-wt-*"))
    with pytest.raises(UserError, match="neither a folder nor a commit"), source_tree("no-such-commit-xyz"):
        pass
    assert set(Path(tempfile.gettempdir()).glob("specpilot-wt-*")) == made  # no empty folder left behind


def test_swapping_gpus_cancels_a_faster_gpu():
    from specpilot.controller.compare import combine_pairings

    true_gain = [1.00, 1.05, 0.97, 1.02]
    ids = ["r0", "r1", "r2", "r3"]
    gpu1_slower = 1.2  # A on GPU 0 and B on GPU 1 reads B 1.2x slow; swapped, B reads 1.2x fast
    first = (ids, [g / gpu1_slower for g in true_gain])
    second = (ids[::-1], [g * gpu1_slower for g in true_gain][::-1])
    got_ids, ratios = combine_pairings(first, second)
    assert got_ids == ids
    assert ratios == pytest.approx(true_gain, rel=1e-12)


def test_paired_mode_runs_both_pairings():
    with source_tree(None) as here:
        card = compare(Side("ar", here), Side("stock", here), SPEC, block=2, timeout=300, noise=0.01,
                       gpus=["0", "1"])
    ab = card["ab"]
    assert ab["mode"] == "paired" and [(p["gpu_a"], p["gpu_b"]) for p in ab["pairings"]] == [("0", "1"), ("1", "0")]
    assert len(ab["ratios"]) == 4 and ab["outputs_equal"]
    for p in ab["pairings"]:
        assert len(p["rows_a"]) == len(p["rows_b"]) == 4
    assert "aa" not in card  # a known noise figure skips the A/A run


def test_a_tree_holding_the_controller_is_refused(tmp_path):
    from specpilot.controller.compare import REPO

    with pytest.raises(UserError, match="inside the tree it was asked to time"), source_tree(str(REPO)):
        pass
    with source_tree(str(tmp_path)) as tree:  # a folder without the controller is fine
        assert tree == tmp_path.resolve()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=1, max_size=20), st.floats(0.5, 2.0), st.randoms())
def test_pairing_cancels_any_uniform_gpu_factor(gains, factor, rnd):
    from specpilot.controller.compare import combine_pairings

    ids = [f"r{i}" for i in range(len(gains))]
    swapped = list(zip(ids, [g * factor for g in gains], strict=True))
    rnd.shuffle(swapped)  # the second pairing may list requests in another order
    got_ids, ratios = combine_pairings((ids, [g / factor for g in gains]),
                                       ([i for i, _ in swapped], [r for _, r in swapped]))
    assert got_ids == ids
    assert ratios == pytest.approx(gains, rel=1e-9)


@pytest.mark.slow
def test_one_worker_alternates_both_systems_and_keeps_each_requests_fastest_run():
    with source_tree(None) as here:
        card = compare(Side("ar", here), Side("stock", here), SPEC, timeout=300, noise=0.01, reps=2,
                       alternating=True)
    ab = card["ab"]
    assert ab["mode"] == "alternating" and ab["reps"] == 2 and ab["outputs_equal"]
    assert len(ab["rows_a"]) == len(ab["rows_b"]) == 2 * 4  # every request twice per side
    assert ab["a"]["config"]["system"] != ab["b"]["config"]["system"]  # each side's own configuration
    with pytest.raises(UserError, match="one source tree"):
        measure(Side("ar", here), Side("ar", here / "bench"), SPEC, block=1, gpu=None, timeout=300, alternating=True)


def test_each_request_counts_the_median_of_its_passes_and_an_unstable_output_is_not_equal():
    from specpilot.controller.compare import pair_ratios

    def row(i, rep, s, toks=(1, 2, 3)):
        return {"id": i, "rep": rep, "decode_s": s, "tokens": list(toks)}

    # per pass B/A: 2.0, 0.5 (a pass where the machine slowed B alone), 2.2 -> median 2.0
    times = [(1.0, 0.5), (1.0, 2.0), (1.1, 0.5)]
    a = [row(f"r{k}", rep, ta) for k in range(3) for rep, (ta, _) in enumerate(times)]
    b = [row(f"r{k}", rep, tb) for k in range(3) for rep, (_, tb) in enumerate(times)]
    ids, ratios, equal = pair_ratios(a, b)
    assert ids == ["r0", "r1", "r2"] and ratios == pytest.approx([2.0] * 3) and equal
    b[4] = row("r1", 1, 2.0, (1, 2, 4))  # one pass of B answered differently
    assert not pair_ratios(a, b)[2]


def test_lockstep_answers_as_each_system_alone_and_paces_by_tokens(monkeypatch):
    """On a CPU both systems answer a request step by step together: each side's tokens are its own run's,
    and the side with fewer tokens always steps next (so both move through their outputs together)."""
    from specpilot.bench.harness import Runner, run_lockstep
    from specpilot.config.env import parse
    from specpilot.datasets import load_requests
    from specpilot.deployment import load_deployment
    from specpilot.runtime import engine as engine_mod
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("tiny")
    runner = Runner(*build_pair(dep), dep.context)
    ar, stock = parse("ar"), parse("stock")
    request = load_requests("builtin", "dev", None, 1)[0]
    order = []
    real = engine_mod.Engine._decode

    def traced(self, *a, **k):
        gen = real(self, *a, **k)
        while True:
            try:
                n = next(gen)
            except StopIteration as done:
                return done.value
            order.append((self.system.name, n))
            yield n

    monkeypatch.setattr(engine_mod.Engine, "_decode", traced)
    a, b = run_lockstep(runner, ar, stock, request, 24)
    assert a[0].tokens == runner.run(ar, request, 24)[0].tokens
    assert b[0].tokens == runner.run(stock, request, 24)[0].tokens
    assert a[0].decode_s > 0 and b[0].decode_s > 0
    counts = {"ar": 1, "stock": 1}
    for name, n in order:  # nobody steps while the other side has fewer tokens (a finished side has them all)
        other = "stock" if name == "ar" else "ar"
        assert counts[name] <= counts[other], order
        counts[name] = n
    aa_a, aa_b = run_lockstep(runner, stock, stock, request, 24)  # A/A: two engines, not one shared
    assert aa_a[0].tokens == aa_b[0].tokens == b[0].tokens
    card = compare(Side("ar", REPO_ROOT), Side("stock", REPO_ROOT), {**SPEC, "cpu": True}, timeout=300, noise=0.01,
                   reps=2, alternating=True)
    assert card["ab"]["mode"] == "lockstep" and card["ab"]["outputs_equal"]
    assert len(card["ab"]["rows_a"]) == len(card["ab"]["rows_b"]) == 8


class _Pacer:
    """A stand-in worker in lockstep mode: B's decode takes `factor` times A's, with a little per-pass jitter and,
    with `spread`, a per-request difference (request k's factor times 1 + spread x (k - 1.5))."""

    def __init__(self, factor, spread=0.0):
        self.factor, self.spread, self.calls = factor, spread, 0

    def lockstep(self, ids, first=0):
        self.calls += 1
        jitter = 1 + 0.002 * (self.calls % 3)
        rows = [{"id": i, "tokens": [1, 2, 3, 4], "decode_s": 1.0, "prefill_s": 0.0, "steps": 3} for i in ids]
        return rows, [{**r, "decode_s": self.factor * jitter * (1 + self.spread * (int(r["id"][1:]) - 1.5))}
                      for r in rows]


@pytest.mark.parametrize(("factor", "spread", "passes"), [(0.5, 0.0, 3), (2.0, 0.0, 3), (1.0, 0.0, 3),
                                                          (0.995, 0.0, 3), (1 / 1.03, 0.02, 5)])
def test_lockstep_stops_early_only_when_the_verdict_is_beyond_doubt(factor, spread, passes):
    """Against the bar of 1.03 (1% noise): B twice as fast, twice as slow, as fast, or 0.5% faster is settled
    after the minimum of 3 passes; B about 3% faster, its requests 1.00-1.06x (the bar inside the interval): every
    one of the 5 passes runs. Without the A/A noise there is no early stop."""
    from specpilot.controller.compare import lockstep
    from specpilot.controller.gate import settled

    ids = ["r0", "r1", "r2", "r3"]
    rows_a, _ = lockstep(_Pacer(factor, spread), ids, reps=5, noise=0.01)
    assert 1 + max(r["rep"] for r in rows_a) == passes
    assert 1 + max(r["rep"] for r in lockstep(_Pacer(0.5), ids, reps=5)[0]) == 5
    assert not settled([2.0, 2.0], 0.01, True)  # fewer than three requests settle nothing


def test_tamper_checks_hold_b_to_a_s_own_share_and_repeats():
    """controller/tamper.py: an honest pair passes; B reporting a third of its wall time is refused; B answering
    repeats 5x faster than its first sight is refused, whatever A's noise; one pass (nothing to repeat) checks only
    the share."""
    from specpilot.controller import tamper

    def rows(first, later, share, passes=3, ids=("r1", "r2", "r3")):
        out = []
        for rep in range(passes):
            for rid in ids:
                wall = first if rep == 0 else later
                out.append({"id": rid, "rep": rep, "wall_s": wall, "decode_s": share * wall * 0.9,
                            "prefill_s": share * wall * 0.1})
        return out

    a = rows(1.0, 1.0, 0.95)
    assert tamper.check(a, rows(0.7, 0.7, 0.94))["refused"] is None  # faster, honestly
    fake = tamper.check(a, rows(0.7, 0.7, 0.3))
    assert "timings are not its own" in fake["refused"] and fake["reported"]["b"] == pytest.approx(0.3)
    cache = tamper.check(a, rows(1.0, 0.2, 0.95))
    assert "faster than the first time" in cache["refused"] and cache["repeat"]["b"] == pytest.approx(5.0)
    warm = tamper.check(rows(1.2, 1.0, 0.95), rows(1.2, 1.0, 0.95))  # both warm up alike: no refusal
    assert warm["refused"] is None
    # A's first pass fast by chance (0.55x, measured on a 2-core CPU): an honest B at 1.14x is not refused, a cache is
    lucky = rows(0.55, 1.0, 0.95)
    assert tamper.check(lucky, rows(1.14, 1.0, 0.95))["refused"] is None
    assert "faster than the first time" in tamper.check(lucky, rows(1.0, 0.2, 0.95))["refused"]
    once = tamper.check(rows(1.0, 1.0, 0.95, passes=1), rows(0.1, 0.1, 0.95, passes=1))
    assert once["refused"] is None and once["repeat"]["b"] is None


def _tiny_runner():
    from specpilot.bench.harness import Runner
    from specpilot.deployment import load_deployment
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("tiny")
    return Runner(*build_pair(dep), dep.context)


def test_an_aa_run_times_two_engines_of_its_system_and_an_ab_run_one_of_each(monkeypatch):
    """The worker gives a system named twice a second engine (slot 1), built as the first (same system, plan,
    models), on the GPU's request-by-request path as on the CPU's lockstep; two systems keep one engine each."""
    from specpilot.config.env import parse
    from specpilot.controller.worker import serve, slots
    from specpilot.datasets import load_requests
    from specpilot.runtime import engine as engine_mod

    used = []
    real = engine_mod.Engine.generate
    monkeypatch.setattr(engine_mod.Engine, "generate", lambda self, *a, **k: used.append(self) or real(self, *a, **k))
    requests = {r.id: r for r in load_requests("builtin", "dev", None, 2)}
    rid = sorted(requests)[torch.randint(2, (1,)).item()]  # either request: nothing depends on which
    for names in (["stock", "stock"], ["ar", "stock"]):
        runner = _tiny_runner()
        sides = [(parse(n), slot) for n, slot in zip(names, slots(names), strict=True)]
        engines, rows = [], []
        for side in (0, 1):
            used.clear()
            rows.append(serve({"run": [rid], "side": side}, runner, names, sides, requests, 8)["rows"])
            assert len(set(map(id, used))) == 1
            engines.append(used[0])
        a, b = engines
        assert a.system.name == names[0] and b.system.name == names[1]
        if names[0] == names[1]:  # A/A: two engines of one system, built alike, answering alike
            assert a is not b and sorted(runner._engines) == ["stock", "stock#1"]
            assert a.system.to_json() == b.system.to_json() and a.plan is b.plan
            assert a.target is b.target and a.drafter is b.drafter
            assert [r["tokens"] for r in rows[0]] == [r["tokens"] for r in rows[1]]
        else:  # A/B: one engine each, none extra
            assert sorted(runner._engines) == ["ar", "stock"]
        used.clear()  # a command naming its system by name gets that name's first side, as before
        serve({"run": [rid], "system": names[1]}, runner, names, sides, requests, 8)
        assert used[0] is (a if names[0] == names[1] else b)
    lock = _tiny_runner()  # the CPU's lockstep: its own second engine, as it had
    ra, rb = serve({"lockstep": [rid]}, lock, ["stock", "stock"], [(parse("stock"), 0), (parse("stock"), 1)],
                   requests, 8).values()
    assert sorted(lock._engines) == ["stock", "stock#1"] and ra[0]["tokens"] == rb[0]["tokens"]


def test_one_worker_sends_each_side_by_position(monkeypatch):
    """The controller names side B of one worker by position, so an A/A run's B reaches the second engine."""
    from specpilot.controller.compare import Worker

    sent = []
    real = Worker.send
    monkeypatch.setattr(Worker, "send", lambda self, ids, side=0: sent.append((tuple(ids), side)) or
                        real(self, ids, side))
    got = measure(Side("stock", REPO_ROOT), Side("stock", REPO_ROOT), SPEC, block=1, gpu=None, timeout=300,
                  alternating=True)
    assert got["mode"] == "alternating" and len(got["ratios"]) == 4
    assert sorted(sent) == sorted((ids, side) for ids in {ids for ids, _ in sent} for side in (0, 1))  # each once


@pytest.mark.slow  # 15 s on two cores (make test-slow, which CI runs too)
def test_an_earlier_aa_run_stands_only_for_the_same_side_a_deployment_and_budget(tmp_path):
    """The card's A/A run records what its noise belongs to; a run that differs in side A's name, code or
    configuration, the deployment, the output budget, the mode or the clock refuses it, or (remeasure, the loop)
    times a new one. Which requests, and the tuning table a warm-up measured, do not matter."""
    from specpilot.controller.compare import StaleAA, aa_mismatch, check_config, setup_of

    first = compare(Side("ar", REPO_ROOT), Side("ar", REPO_ROOT), SPEC, timeout=300, alternating=True)
    aa, a = first["aa"], Side("ar", REPO_ROOT)
    assert aa["setup"] == setup_of(SPEC) and aa["a"]["config"]["system"] == "ar"
    assert aa_mismatch(aa, a, {**SPEC, "split": "test", "limit": 6}, "alternating", "worker") is None
    budget = int(torch.randint(9, 64, (1,)))
    bare = {k: v for k, v in aa.items() if k != "setup"}
    stale = {"side A is 'ar', this run's is 'stock'": (aa, Side("stock", REPO_ROOT), SPEC, "alternating"),
             "this run's is 000000000000": (aa, Side("ar", REPO_ROOT, "0" * 64), SPEC, "alternating"),
             f"max_new_tokens 8 (now {budget})": (aa, a, {**SPEC, "max_new_tokens": budget}, "alternating"),
             "preset 'tiny' (now None)": (aa, a, {**SPEC, "preset": None}, "alternating"),
             "not comparable": (aa, a, SPEC, "interleaved"),
             "records no deployment": (bare, a, SPEC, "alternating")}
    for needle, args in stale.items():
        why = aa_mismatch(*args, "worker")
        assert why is not None and needle in why, (needle, why)
    assert "(controller clock)" in aa_mismatch(aa, a, SPEC, "alternating", "controller")
    dep = tmp_path / "dep.toml"  # a deployment file: its bytes, not its path
    dep.write_text("a = 1\n")
    on_file = {**SPEC, "preset": None, "deployment": str(dep)}
    with_file = {**aa, "setup": setup_of(on_file)}
    assert aa_mismatch(with_file, a, on_file, "alternating", "worker") is None
    dep.write_text(f"a = {int(torch.randint(2, 99, (1,)))}\n")
    assert "deployment_sha256" in aa_mismatch(with_file, a, on_file, "alternating", "worker")
    with pytest.raises(StaleAA, match="max_new_tokens"):  # refused before any worker starts
        compare(a, Side("stock", REPO_ROOT), {**SPEC, "max_new_tokens": budget}, timeout=300, aa=aa, alternating=True)

    config = aa["a"]["config"]
    retuned = {**aa, "a": {**aa["a"], "config": {**config, "plan": {**config["plan"], "tuning": {"k": [1, 2]}}}}}
    check_config(retuned, {"config": config})  # each worker tunes its own table
    padded = float(torch.rand(1)) * 50 + 1
    other = {**aa, "a": {**aa["a"], "config": {**config, "options": {**config["options"], "pad_us": padded}}}}
    with pytest.raises(StaleAA, match=f"options.pad_us {padded!r} \\(now 0.0\\)"):
        compare(a, Side("stock", REPO_ROOT), SPEC, timeout=300, aa=other, alternating=True)
    card = compare(a, Side("stock", REPO_ROOT), SPEC, timeout=300, aa=other, alternating=True, remeasure=True)
    assert card["aa"] is not other and card["aa"]["a"]["config"] == config and len(card["aa"]["ratios"]) == 4
    assert card["decision"]["noise"] != first["decision"]["noise"] or card["aa"]["ratios"] != aa["ratios"]
