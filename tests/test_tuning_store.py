"""The step tuning's store (kernels/tuning/store.py): choices kept per GPU model, kernels code, plan and keys, and
an engine that reuses them instead of tuning again (the descent faked: CPU)."""

import pytest
import torch

from specpilot.config import parse_system
from specpilot.config.plan import KernelPlan, TuningTable
from specpilot.fixtures.random_models import random_target, tiny_target_config
from specpilot.kernels.tuning import descent, store
from specpilot.runtime.engine import Engine

KEYS = [("gemv", 576, 576, ("GATE_UP", False), ("HAS_RES", True)), ("attention", 1, 3, 9, 64, 2048)]


def test_entries_round_trip_and_are_named_by_everything_they_depend_on(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "ROOT", tmp_path)
    plan = KernelPlan.stock(gemv=True)
    chosen = {KEYS[0]: {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 4, "num_stages": 2, "PRE": 1, "AHEAD": False},
              KEYS[1]: {"CLUSTER": 8}}
    step = {"target": "cfg(hidden=576)", "dtype": "torch.bfloat16", "context": 2048}
    name = store.entry_name("NVIDIA H100 80GB HBM3", plan, step)
    assert store.load(name) is None
    path = store.save(name, chosen, "NVIDIA H100 80GB HBM3")
    assert path.parent == tmp_path and store.load(name) == chosen
    others = {store.entry_name("NVIDIA H200", plan, step),
              store.entry_name("NVIDIA H100 80GB HBM3", plan, {**step, "context": 1024}),
              store.entry_name("NVIDIA H100 80GB HBM3", plan.but(tune_rounds=3), step)}
    assert name not in others and len(others) == 3
    store.kernels_code.cache_clear()
    monkeypatch.setattr(store, "KERNELS", tmp_path)  # other kernels code: another name
    (tmp_path / "k.py").write_text("x = 1\n")
    assert store.entry_name("NVIDIA H100 80GB HBM3", plan, step) != name
    store.kernels_code.cache_clear()
    (tmp_path / name).write_text("{not json")
    assert store.load(name) is None  # unreadable: missing
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary left behind
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(store, "ROOT", tmp_path / "file" / "below")  # cannot be made: nothing kept, no error
    assert store.save(name, chosen, "x") is None and store.load(name) is None


@pytest.mark.parametrize("keep", [True, False])
def test_an_engine_reuses_the_stored_choices_instead_of_tuning_again(tmp_path, monkeypatch, keep):
    monkeypatch.setattr(store, "ROOT", tmp_path)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(TuningTable, "record", lambda self, step: list(KEYS))  # as a GPU's step launches them
    tuned = []

    def tune_step(step, measure, plan, start=None):
        tuned.append(plan)
        plan.table.chosen.update({k: {"picked": len(tuned)} for k in KEYS})
        return {"tuned": len(tuned)}

    monkeypatch.setattr(descent, "tune_step", tune_step)
    target = random_target(tiny_target_config(), seed=3)
    system = parse_system("ar:gemv=true" + ("" if keep else ",tune_store=false"))
    first = Engine(target, None, system, context=64)._tune_gemv()
    second_engine = Engine(target, None, system, context=64)  # a new engine, its own plan: as another process
    second = second_engine._tune_gemv()
    assert first == {"tuned": 1}
    if keep:
        assert len(tuned) == 1 and set(second) == {"store", "keys"} and second["keys"] == 2
        assert second_engine.plan.table.chosen == {k: {"picked": 1} for k in KEYS}
    else:
        assert len(tuned) == 2 and second == {"tuned": 2} and not list(tmp_path.iterdir())


def test_an_entry_that_misses_a_key_the_step_launches_is_not_used(tmp_path, monkeypatch):
    """Stored choices that do not cover the step (another shape launched): the step is tuned, and the table holds
    what the tuning chose, not the stale entry's leftovers."""
    monkeypatch.setattr(store, "ROOT", tmp_path)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(TuningTable, "record", lambda self, step: list(KEYS))
    target = random_target(tiny_target_config(), seed=3)
    engine = Engine(target, None, parse_system("ar:gemv=true"), context=64)
    what = {"target": repr(target.cfg), "dtype": str(target.embed.weight.dtype), "context": 64}
    stale = ("gemv", 1, 1)
    store.save(store.entry_name("NVIDIA H100 80GB HBM3", engine.plan, what), {KEYS[0]: {"old": 1}, stale: {}}, "x")
    seen = []

    def tune_step(step, measure, plan, start=None):
        seen.append(dict(plan.table.chosen))
        plan.table.chosen.update({k: {"new": 1} for k in KEYS})
        return {"tuned": True}

    monkeypatch.setattr(descent, "tune_step", tune_step)
    assert engine._tune_gemv() == {"tuned": True}
    assert seen == [{}] and engine.plan.table.chosen == {k: {"new": 1} for k in KEYS}
