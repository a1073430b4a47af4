"""`specpilot replay` end to end on the tiny preset, its one-line errors, and the node-budget curves."""

import dataclasses
import json
from pathlib import Path

import pytest

from specpilot.replay.budget import curves, plot
from specpilot.replay.record import load, save
from specpilot.replay.run import accept_option, policies
from tests.test_ceiling import _synthetic_turn
from tests.test_cli import assert_one_line_error, specpilot


def test_record_then_replay(tmp_path):
    run, out = tmp_path / "run", tmp_path / "replay.json"
    proc = specpilot("replay", str(run), "--record", "--preset", "tiny", "--limit", "1", "--max-new-tokens", "16",
                     "--nodes", "4,8", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (run / "lattices.pt").exists() and json.loads((run / "meta.json").read_text())["system"] == "stock"
    report = json.loads(out.read_text())
    assert report["commit"] and report["recording"]["system"] == "stock"
    assert {"chain@4", "best_first@8", "ddtree@4", "eagle2@8", "sequoia@8"} <= set(report["replayed"])
    # the recorded system (stock: the chain at the drafter's block, 4 on the tiny preset) replays to its live tau
    assert report["replayed"]["chain@4"]["tau"] == pytest.approx(report["live_tau"], abs=1e-12)
    assert report["tau_best"]["any"] >= report["live_tau"]
    # a second replay reads the recording without the models
    again = specpilot("replay", str(run), "--builder", "best_first", "--nodes", "2")
    assert again.returncode == 0, again.stderr
    assert "best_first" in again.stdout and "ddtree" not in again.stdout


@pytest.mark.parametrize("args,needles", [
    (["replay", "/nonexistent/run"], ["does not exist", "--record"]),
    (["replay", "/tmp", "--builder", "bushy"], ["unknown tree builder", "bushy"]),
    (["replay", "/tmp", "--nodes", "8,x"], ["--nodes"]),
    (["replay", "/tmp", "--nodes", "1"], ["at least 2"]),
    (["replay", "/tmp", "--tree-accept", "0.9/0.9"], ["tree_accept"]),
    (["replay", "/tmp/none", "--record", "--preset", "tiny", "--system", "ar"], ["drafts nothing"]),
])
def test_replay_mistakes_are_one_line(args, needles):
    assert_one_line_error(specpilot(*args), *needles)


def test_policies_and_profile_option():
    assert policies(["chain", "best_first"], [8, 16, 32], 16) == [("chain", 8), ("chain", 16), ("best_first", 8),
                                                                  ("best_first", 16), ("best_first", 32)]
    assert accept_option([0.5, 0.1234, 0.0004]) == "0.500/0.123"


def _system(base, tree, nodes, tau, ms_step, speedup):
    return {"config": {"base": base, "options": {"tree": tree, "nodes": nodes}}, "tau": tau,
            "decode_ms_per_step": ms_step, "decode_ms_per_token": ms_step / tau, "speedup_vs_ar": speedup}


def test_node_budget_curves(tmp_path):
    sweep = {"systems": {"ar": _system("ar", "chain", 0, 1.0, 1.0, 1.0),
                         "stock": _system("stock", "chain", 0, 2.0, 1.5, 1.33),
                         "bf8": _system("stock", "best_first", 8, 2.4, 1.6, 1.5),
                         "bf32": _system("stock", "best_first", 32, 2.9, 1.8, 1.61),
                         "bf64": _system("stock", "best_first", 64, 3.0, 2.4, 1.25)}}
    result = curves(sweep, 16, {"tau_best": {"8": 3.0, "32": 3.5, "any": 3.5}, "replayed": {"x@8": {"tau": 2.3}}})
    bf = result["builders"]["best_first"]
    assert [p["nodes"] for p in bf["points"]] == [8, 32, 64] and bf["best"] == 32
    assert bf["points"][1]["c"] == pytest.approx(1.8) and bf["points"][1]["s"] == pytest.approx(2.9 / 1.8)
    assert result["builders"]["chain"]["points"][0]["nodes"] == 16  # nodes 0: the block
    assert result["tau_best"] == {"8": 3.0, "32": 3.5}
    pytest.importorskip("matplotlib")
    path = plot(result, "test", tmp_path / "c.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_a_recording_that_fails_midway_leaves_the_last_one_whole(tmp_path, monkeypatch):
    """lattices.pt and meta.json are one recording: a failure writing the second never pairs a new first with the
    last run's second."""
    run, turn = tmp_path / "run", _synthetic_turn()
    save(run, [turn], {"system": "old"})
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "meta.json":
            raise OSError("disk full")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(OSError):
        save(run, [dataclasses.replace(turn, live=[1, 1, 1])], {"system": "new"})
    turns, meta = load(run)
    assert meta == {"system": "old"} and turns[0].live == [2, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
