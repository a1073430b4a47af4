"""`specpilot loop --agent command:...` end to end on the tiny deployment, one direction: the honest stand-in's code
is promoted, passes the sealed final, becomes a memory entry with its patch (replayed byte for byte) and
best.patch; the report renders the agent's row. A missing program is refused before anything runs."""

import json
import subprocess

import pytest

from specpilot.controller.compare import REPO
from specpilot.deployment import load_deployment
from specpilot.errors import UserError
from specpilot.loop.main import LoopArgs, run_loop
from specpilot.loop.report import write_report
from specpilot.memory.faithful import applied_tree
from specpilot.memory.store import Store

BIN = REPO / "specpilot" / "fixtures" / "agents" / "bin"


def args(tmp_path, agent, **kw):
    return LoopArgs(load_deployment("tiny"), {"preset": "tiny"}, tmp_path / "run", 1, agent, 10, 16,
                    sealed_tokens=16, directions=1, **kw)


@pytest.mark.slow
def test_a_loop_with_the_honest_stand_in_promotes_its_code(tmp_path):
    summary = run_loop(args(tmp_path, f"command:{BIN / 'honest'}"))
    try:
        (r,) = summary["rounds"]
        why = json.dumps({k: r.get(k) for k in ("directions", "integration", "sealed")}, default=str)[-4000:]
        assert summary["best"] == "stock:fallback_ar=2" and summary["best_commit"] == r["result_commit"], why
        assert r["sealed"]["passed"] and r["sealed"]["forcing"]["verdict"] in ("pass", "inconclusive")
        assert (tmp_path / "run" / "best.patch").read_text().startswith("diff --git")
        store = Store(tmp_path / "run" / "memory", REPO)
        (eid,) = store.ids()
        entry = store.read(eid)
        assert store.replay() == {eid: None} and entry.patch
        assert applied_tree(REPO, entry.base_commit, entry.patch) == r["directions"][0]["gated"][0]["tree"]
        assert entry.provenance["agent"].startswith("command:") and entry.provenance["cost"]["agent_s"] > 0
        md = write_report(tmp_path / "run")[0].read_text()
        assert "## Agents" in md and "best.patch" in md and "stock:fallback_ar=2" in md
        assert not any((tmp_path / "run" / "checkouts").iterdir())  # the timing checkouts are removed
    finally:  # the refs the run kept its commits under: a test's are dropped (the repository is the developer's)
        subprocess.run(["git", "-C", str(REPO), "update-ref", "-d", f"refs/specpilot/bases/{summary['base_commit']}"],
                       capture_output=True)
        for r in summary["rounds"]:
            for d in r["directions"]:
                commit = d.get("agent", {}).get("frozen", {}).get("commit")
                if commit:
                    subprocess.run(["git", "-C", str(REPO), "update-ref", "-d", f"refs/specpilot/agents/{commit}"],
                                   capture_output=True)


def test_a_missing_agent_program_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(UserError, match="not an executable"):
        run_loop(args(tmp_path, "command:/no/such/agent"))
    assert not (tmp_path / "run").exists()


def test_an_llm_master_needs_a_coding_agent(tmp_path):
    with pytest.raises(UserError, match="needs|give --agent"):
        run_loop(args(tmp_path, "builtin", master=f"command:{BIN / 'master'}"))
