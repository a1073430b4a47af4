"""The ceiling analysis: floors against hand-counted bytes, the profile's attribution, the factors and what-ifs
against hand-worked examples, and `specpilot ceiling` end to end (JSON schema, --from, one-line errors)."""

import json
from types import SimpleNamespace

import pytest

from specpilot.ceiling.floors import CLASSES, Floor, StepShape, ar_batch, floors, layer_params
from specpilot.ceiling.model import class_table, factors, node_curve, validation, what_if
from specpilot.ceiling.profile import attribute, classify
from specpilot.core import regions
from specpilot.models.config import DenseConfig, DrafterConfig
from tests.test_cli import assert_one_line_error, specpilot

SMALL = DenseConfig(vocab_size=100, hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                    head_dim=4)


def test_target_floors_by_hand():
    # one layer: qkv 8 x (8 + 4 + 4) = 128, o 8 x 8 = 64, gate/up 8 x 32 = 256, down 16 x 8 = 128 -> 576 weights
    assert layer_params(SMALL) == 576
    fl = floors(SMALL, None, StepShape(rows=3, context=10, dtype_bytes=2))
    # weights 2 layers x 576 x 2 B = 2304; activations 3 rows x 2 layers x 104 elements x 2 B = 1248
    assert fl["target_gemm"] == Floor(2304 + 1248, 2 * 3 * 1152)
    # K and V of 10 slots x 4 (kv dim) x 2 B = 160 per layer, + 3 rows x (2 x 8 + 2 x 4) x 2 B = 144; 2 layers
    assert fl["attention"] == Floor(2 * (160 + 144), 2 * 4 * 3 * 10 * 8)
    # the head [100, 8] x 2 B + 3 rows of logits x 100 x 2 B
    assert fl["lm_head"] == Floor(1600 + 600, 2 * 3 * 100 * 8)
    # (4 x 2 layers + 3) norm passes x 3 rows x 8 x 2 B, and AR's argmax reads 3 x 100 logits x 2 B
    assert fl["elementwise"] == Floor(11 * 3 * 8 * 2 + 600, 0)
    assert fl["drafter_gemm"] == fl["tree"] == Floor(0, 0)


def test_a_batched_ar_step_reads_the_weights_once_and_each_requests_kv():
    fl = ar_batch(SMALL, 3, 10)
    # as three rows of one request, but each row attends its own 10 slots: 3 x 2 layers x (160 + 48) bytes
    assert fl["attention"] == Floor(3 * 2 * (160 + 48), 3 * 2 * 4 * 10 * 8)
    assert fl["target_gemm"] == Floor(2304 + 1248, 2 * 3 * 1152) and fl["lm_head"] == Floor(1600 + 600, 4800)


def test_drafter_floors_by_hand():
    d = DrafterConfig(layer=DenseConfig(vocab_size=100, hidden_size=8, intermediate_size=16, num_layers=1,
                                        num_heads=2, num_kv_heads=1, head_dim=4), target_layer_ids=[0, 1], block_size=4)
    s = StepShape(rows=4, context=10, draft_rows=4, ctx_rows=2, depth=3, width=2, tree=False, dtype_bytes=2)
    fl = floors(SMALL, d, s)
    # fc 16 x 8 = 128 + one layer 576 = 704 weights, read once; FLOPs: 2 context rows through fc and K/V
    # (8 x 8 = 64 per layer), 4 block rows through the layer
    assert fl["drafter_gemm"] == Floor(704 * 2, 2 * (2 * (128 + 64) + 4 * 576))
    # the head again for 3 draft rows, logits in float32
    assert fl["lm_head"] == Floor(1600 + 4 * 100 * 2 + 1600 + 3 * 100 * 4, 2 * 4 * 100 * 8 + 2 * 3 * 100 * 8)
    lattice = 3 * 2 * 12 + 3 * 2 * 2 * 4
    assert fl["drafter_other"] == Floor(6 * 4 * 8 * 2 + 3 * 100 * 4 + lattice, 0)
    # the verify's argmax (4 x 100 x 2 B) and the features kept for the next context (2 x 4 rows x 16 x 2 B)
    assert fl["tree"] == Floor(800 + 2 * 4 * 16 * 2, 0)
    tree = floors(SMALL, d, StepShape(**{**s.__dict__, "tree": True}))
    # a tree also moves the path's K/V (2 x 2 layers x 4 x 4 rows x 2 B, read and written) and builds from the lattice
    assert tree["tree"].bytes - fl["tree"].bytes == 2 * 2 * 2 * 4 * 4 * 2 + 2 * lattice
    assert set(fl) == set(CLASSES)


def _evt(name, parent=None, kernels=(), self_us=0.0):
    return SimpleNamespace(name=name, cpu_parent=parent, device_type=SimpleNamespace(name="CPU"),
                           kernels=[SimpleNamespace(name=k, duration=us) for k, us in kernels],
                           self_cpu_time_total=self_us)


def _dev(name, us, start=0.0):
    return SimpleNamespace(name=name, device_type=SimpleNamespace(name="CUDA"),
                           time_range=SimpleNamespace(start=start, end=start + us))


def test_attribution_by_regions():
    drafter = _evt("sp:drafter")
    gemm = _evt("sp:gemm", drafter)
    head = _evt("sp:head")
    events = [drafter, gemm, head, _evt("sp:prefill"),
              _evt("aten::mm", gemm, [("mm_a", 30.0)]),  # drafter GEMM
              _evt("aten::mm", _evt("sp:gemm"), [("mm_a", 50.0)]),  # target GEMM, same kernel name
              _evt("aten::mm", _evt("sp:gemm", head), [("mm_h", 20.0)]),  # the head's GEMM is the head's
              _evt("triton_topk", drafter, [("topk", 5.0)]),  # drafter, not a GEMM
              _evt("aten::add", None, [("add", 4.0), ("add", 6.0)]),  # outside every region: elementwise
              _evt("sp:attention", None, [("attn_triton", 8.0)]),  # a Triton launch links to the region itself
              *[_dev(k, us) for k, us in (("mm_a", 980.0), ("mm_h", 20.0), ("topk", 5.0), ("add", 10.0),
                                           ("attn_triton", 8.0), ("memset", 77.0), ("_split_kernel", 40.0))],
              _evt("aten::mm", _evt("sp:gemm", _evt("sp:prefill")), [("mm_a", 900.0)]),  # prefill: left out
              # launches linked to no host range, inside our regions' spans on the device timeline (annotations
              # are spans, never kernels): classed by the spans around them; a prefill span's are left out
              _dev("sp:decode", 1000.0, 5000.0), _dev("sp:drafter", 100.0, 5100.0), _dev("sp:attention", 50.0, 5400.0),
              _dev("_norm_kernel", 6.0, 5120.0), _dev("_norm_kernel", 4.0, 5410.0), _dev("_rope_kernel", 12.0, 5700.0),
              _dev("sp:prefill", 100.0, 9000.0), _dev("_norm_kernel", 50.0, 9010.0), _dev("_split_kernel", 9.0, 9050.0)]
    p = attribute(events, cuda=True, steps=2)
    us = {k: v * 1e6 for k, v in p.classes.items()}
    # attention: 8 us linked to its region, 40 us of our Triton attention kernel linked to nothing, classed by
    # name, 4 us of a norm in its span; the drafter's norm 6 us, a rope inside decode alone 12 us (elementwise)
    assert us == pytest.approx({"drafter_gemm": 15.0, "target_gemm": 25.0, "lm_head": 10.0, "drafter_other": 5.5,
                                "elementwise": 11.0, "attention": 26.0})
    # linked, spanned or named: every kernel but the 77 us memset, over 2 steps
    assert p.unlinked_s * 1e6 == pytest.approx(38.5) and p.by_name_s * 1e6 == pytest.approx(20.0)
    assert p.by_span_s * 1e6 == pytest.approx(11.0)
    assert p.to_json()["unlinked_kernels"] == {"memset": pytest.approx(38.5e-6)}
    assert p.kernels["_split_kernel", "attention"]["calls"] == 0.5  # one launch over two steps
    # one GEMM kernel serving the drafter and the target counts in each class apart
    assert p.kernels["mm_a", "target_gemm"]["seconds"] == pytest.approx(25e-6)
    assert p.kernels["mm_a", "drafter_gemm"]["seconds"] == pytest.approx(15e-6)
    assert p.kernels["add", "elementwise"]["calls"] == 1.0
    listed = p.to_json()["kernels"]
    assert {"name": "mm_a", "class": "drafter_gemm", "seconds": pytest.approx(15e-6), "calls": 0.5} in listed
    assert p.stages["drafter"] * 1e6 == pytest.approx(20.5)
    cpu = attribute([_evt("aten::mm", _evt("sp:attention"), self_us=8.0)], cuda=False, steps=4)
    assert cpu.classes == {"attention": pytest.approx(2e-6)}
    assert classify({"tree", "gemm"}) == "tree" and classify(set()) == "elementwise"


def test_regions_are_free_when_off():
    assert regions.region("gemm") is regions.region("head")  # the shared no-op
    with regions.labelled():
        assert regions.region("gemm") is not regions.region("gemm")
    assert not regions._on


def test_factors_by_hand():
    f = factors(tau=2.0, tau_best=3.0, tau_ideal=4.0, t_step=2e-3, t_ar=1e-3, t_prof=1.6e-3, t_floor=0.8e-3)
    assert f["speedup"] == pytest.approx(1.0)
    got = {k: v["value"] for k, v in f["factors"].items()}
    assert got == pytest.approx({"tau": 1.5, "kernel": 2.0, "overhead": 1.25, "lattice": 4 / 3})
    # the factors multiply to tau_best x T_AR / T_floor
    assert f["ceiling"] == pytest.approx(3.0 * 1e-3 / 0.8e-3)
    assert f["target"] == "kernel" and f["factors"]["lattice"]["needs_training"]


def test_what_if_by_hand():
    classes = {"target_gemm": 1.0e-3, "lm_head": 0.2e-3, "drafter_gemm": 0.2e-3, "attention": 0.4e-3,
               "elementwise": 0.2e-3}
    p = what_if(tau=3.0, t_step=2.5e-3, t_ar=1e-3, classes=classes, drafter_s=0.5e-3, full_share=0.2,
                curve=node_curve({8: 3.0, 16: 3.6}, {8: 2.5e-3, 16: 2.7e-3}, 1e-3))
    assert p["weight_share"] == pytest.approx(1.4 / 2.0)
    # 12-bit weights: 1.4 ms of weight kernels lose a quarter -> 2.15 ms per step
    assert p["w12"]["t_step_s"] == pytest.approx(2.15e-3) and p["w12"]["speedup"] == pytest.approx(3.0 / 2.15)
    # second round: 20% of steps add tau - 1 = 2 drafts -> tau 3.4, one more drafter stage -> 3.0 ms
    assert p["second_round"]["tau"] == pytest.approx(3.4) and p["second_round"]["speedup"] == pytest.approx(3.4 / 3)
    assert p["nodes"]["best"] == 16 and p["nodes"]["speedup"] == pytest.approx(3.6 / 2.7)
    assert validation(1.04, 1.0)["within_5pct"] and not validation(1.2, 1.0)["within_5pct"]


def test_class_table_orders_by_excess():
    fl = {"target_gemm": Floor(4e6, 0), "attention": Floor(1e6, 1e12)}
    rows = class_table({"target_gemm": 2e-6, "attention": 5e-6}, fl, bandwidth=4e12, flop_rate=1e18)
    assert [r["class"] for r in rows[:2]] == ["attention", "target_gemm"]
    assert rows[1]["floor_s"] == pytest.approx(1e-6) and rows[1]["ratio"] == pytest.approx(2.0)
    assert rows[0]["floor_s"] == pytest.approx(1e-6) and rows[0]["bound"] == "flops"


@pytest.mark.slow
def test_ceiling_end_to_end(tmp_path):
    run, out, png = tmp_path / "run", tmp_path / "ceiling.json", tmp_path / "ceiling.png"
    proc = specpilot("ceiling", str(run), "--measure", "--preset", "tiny", "--limit", "1", "--max-new-tokens", "16",
                     "--profile-tokens", "12", "--profile-requests", "1", "--nodes", "4,8", "--system", "stock",
                     "--system", "stock:tree=best_first,nodes=6", "--json", str(out), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["commit"] and png.stat().st_size > 0
    for name in ("stock", "stock:nodes=6,tree=best_first"):
        s = report["systems"][name]
        assert set(s["factors"]) == {"tau", "kernel", "overhead", "lattice"}
        assert s["target"] in ("tau", "kernel", "overhead")
        assert s["candidates"] and {"w12", "second_round", "nodes", "weight_share"} <= set(s["predicted"])
        assert s["factors"]["tau"]["tau_best"] >= s["factors"]["tau"]["tau"] - 1e-9
        prof = {r["class"]: r["prof_s"] for r in s["classes"]}
        assert all(prof[c] > 0 for c in ("target_gemm", "drafter_gemm", "attention", "lm_head", "tree"))
        assert s["ideal"]["top1_agreement"] == 1.0  # float32 on the CPU: the teacher-forced argmax is the output
    assert report["systems"]["stock"]["rows"] == 8 and report["systems"]["stock:nodes=6,tree=best_first"]["rows"] == 6
    again = specpilot("ceiling", str(run), "--json", str(tmp_path / "again.json"))  # from the run dir, no models
    assert again.returncode == 0, again.stderr
    second = json.loads((tmp_path / "again.json").read_text())
    assert second["systems"]["stock"]["factors"] == report["systems"]["stock"]["factors"]


@pytest.mark.parametrize("args,needles", [
    (["ceiling", "/nonexistent/run"], ["does not exist", "--measure"]),
    (["ceiling", "/tmp", "--nodes", "1"], ["at least 2"]),
    (["ceiling", "/tmp/none", "--measure", "--preset", "tiny", "--system", "ar"], ["drafts nothing"]),
    (["ceiling", "/tmp", "--json", "/nonexistent/x.json"], ["does not exist"]),
])
def test_ceiling_mistakes_are_one_line(args, needles):
    assert_one_line_error(specpilot(*args), *needles)


def _synthetic_turn():
    """Prompt [1, 2], output [10 .. 15]; three steps of a depth-3, width-2 lattice without edges (rank 0 is the
    drafter's pick). Step 1 (anchor 10 at 2, then 11 12 13): picks 11, 50: commits 2; 12 sits at rank 1, so
    tau_best takes all three. Step 2 (anchor 12 at 4): 77 misses: 1. Step 3 (anchor 13 at 5, then 14 15 and the
    end): 14, 15 accepted, 2 tokens left: 2."""
    import torch

    from specpilot.replay.record import TurnLattices

    tokens = torch.tensor([[[11, 99], [50, 12], [13, 98]],
                           [[77, 78], [1, 2], [3, 4]],
                           [[14, 0], [15, 0], [1, 2]]])
    logp = torch.tensor([-0.1, -2.0]).expand(3, 3, 2).contiguous()
    return TurnLattices(id="r", dataset="d", sequence=[1, 2, 10, 11, 12, 13, 14, 15], prompt_len=2,
                        starts=torch.tensor([2, 4, 5]), tokens=tokens, logp=logp, edges=None, live=[2, 1, 2])


def _class_floor(ms: float) -> dict:  # bytes that take `ms` at 4 TB/s
    return {"bytes": ms * 1e-3 * 4e12, "flops": 0.0}


def test_report_from_synthetic_records_by_hand():
    from specpilot.ceiling.report import compute

    profile = {"classes": {"target_gemm": 0.6e-3, "attention": 0.2e-3}, "stages": {"target": 0.8e-3},
               "kernels": [], "unlinked_s": 0.0}
    inputs = {
        "machine": {"bytes_s": 4e12, "flop_s": 1e15},
        "bench": {"ar": {"decode_ms_per_token": 1.0, "tau": 1.0},
                  "stock": {"tau": 5 / 3, "decode_ms_per_step": 1.25, "speedup_vs_ar": 1.3}},
        "ar": {"profile": profile, "step_s": 1e-3, "floors": {"target_gemm": _class_floor(0.4)}},
        "systems": {"stock": {"config": {"options": {"tree": "chain", "tree_k": 4, "tree_accept": ""}},
                              "builder": "chain", "rows": 4, "block": 4, "shape": {}, "profile": profile,
                              "floors": {"target_gemm": _class_floor(0.4), "attention": _class_floor(0.1)},
                              "step_s": {"4": 1.2e-3}, "ideal": {"tau_ideal": 3.0}}},
    }
    s = compute(inputs, {"stock": [_synthetic_turn()]})["systems"]["stock"]
    f = {k: v["value"] for k, v in s["factors"].items()}
    # tau 5/3 live; tau_best (4, 1, 2) / 3 = 7/3; T_prof 0.8 ms, T_floor 0.5 ms, T_step 1.25 ms, T_AR 1 ms
    assert s["speedup"] == pytest.approx(4 / 3)
    assert f == pytest.approx({"tau": 1.4, "kernel": 1.6, "overhead": 1.5625, "lattice": 9 / 7})
    assert s["ceiling"] == pytest.approx((7 / 3) / 0.5) and s["target"] == "kernel"
    assert s["candidates"][0]["factor"] == "kernel"
    # the node curve: the chain replayed at 4 rows gives the live 5/3; c = 1.2; predicted 1.389 vs measured 1.3
    check = s["cost_model"]["this_run"]
    assert check["predicted"] == pytest.approx((5 / 3) / 1.2) and not check["within_5pct"]
    assert s["predicted"]["second_round"]["full_share"] == 0.0  # no step accepted all three drafts


def test_candidates_name_real_options():
    """The loop reads the candidates as data: every option they name must exist, and only built ones name any."""
    from specpilot.ceiling.model import CANDIDATES, FACTORS
    from specpilot.config import OPTIONS

    assert set(FACTORS) | {"lattice"} == set(CANDIDATES)
    for entries in CANDIDATES.values():
        for c in entries:
            assert all(o in OPTIONS for o in c["options"]), c
            assert c["built"] == bool(c["options"]), c


@pytest.mark.parametrize("system", ["stock", "stock:tree=best_first,nodes=12", "ar"])
def test_repeated_step_timings_start_from_the_same_state_without_a_new_prefill(system):
    """A restored snapshot steps exactly as the state it was taken from; a timing repeated on one request prefills
    once; a request begun since the snapshot voids it."""
    from specpilot.bench.harness import Runner
    from specpilot.ceiling.run import step_seconds
    from specpilot.config.env import parse
    from specpilot.deployment import load_deployment
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("tiny")
    target, drafter, tok = build_pair(dep)
    runner, sys_ = Runner(target, drafter, tok, dep.context), parse(system)
    engine = runner.engine(sys_)
    prompt = [5, 17, 3, 250, 9, 41]
    engine.generate_one(prompt, 3)
    snap = engine.snapshot()
    step = engine._spec if sys_.speculative else engine._ar

    def walk() -> list:
        out = []
        for _ in range(3):
            step()
            out.append((int(engine.pos), engine.token.tolist(), engine.state.out.tolist() if engine.block else None))
        return out

    first = walk()
    assert engine.restore(snap) and walk() == first and len({p for p, _, _ in first}) == 3
    step_seconds(runner, sys_, prompt, 3, reps=2)
    begun = engine.requests
    step_seconds(runner, sys_, prompt, 3, reps=2)
    assert engine.requests == begun  # the second timing restored, it did not generate
    engine.generate_one(prompt, 2)
    assert not engine.restore(snap)


def test_the_profile_of_eager_steps_prints_nothing_of_its_own(capfd):
    """Kineto writes profiler_start / profiler_stop lines to file descriptor 2 whatever its log level: the
    profile silences them (a loop's terminal shows its own progress), and still times every step."""
    from specpilot.ceiling.profile import profile_generations
    from specpilot.config import parse_system
    from specpilot.fixtures.random_models import random_target, tiny_target_config
    from specpilot.runtime.engine import Engine

    engine = Engine(random_target(tiny_target_config(), seed=0), None, parse_system("ar:graphs=false"), context=64)
    prof = profile_generations(engine, [[1, 2, 3]], 4)
    assert prof.steps >= 3 and sum(prof.classes.values()) > 0
    assert "profiler_st" not in capfd.readouterr().err


def test_a_measurement_that_fails_midway_leaves_the_last_one_whole(tmp_path, monkeypatch):
    """inputs.json and every system's recording are one measurement: a failure on the second system's files
    leaves the last measurement as it was, not the first system's new recording beside its old inputs."""
    import dataclasses

    import torch

    from specpilot.ceiling import run as ceiling_run

    run, turn = tmp_path / "run", _synthetic_turn()
    ceiling_run.save(run, {"n": 1}, {"a": [turn], "b": [turn]}, {"deployment": "old"})
    real, calls = torch.save, []

    def save(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    new = dataclasses.replace(turn, live=[1, 1, 1])
    with pytest.raises(OSError):
        ceiling_run.save(run, {"n": 2}, {"a": [new], "b": [new]}, {"deployment": "new"})
    inputs, recordings = ceiling_run.load(run)
    assert inputs["n"] == 1 and inputs["meta"] == {"deployment": "old"}
    assert [t.live for turns in recordings.values() for t in turns] == [[2, 1, 2], [2, 1, 2]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
