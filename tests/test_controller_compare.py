"""The controller's runner: workers import the code they were asked for, take turns, and report."""

import pytest

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


def test_a_commit_runs_from_its_own_worktree():
    with source_tree("HEAD") as tree:
        assert tree.name.startswith("specpilot-wt-")
        result = measure(Side("ar", tree), Side("ar", tree), SPEC, block=4, gpu=None, timeout=300)
    assert result["a"]["source"] == str(tree) and result["a"]["code_hash"] == result["b"]["code_hash"]
    assert not tree.exists()  # the temporary worktree is removed


def test_a_worker_with_other_code_is_refused(monkeypatch):
    monkeypatch.setattr(Side, "expected_hash", property(lambda self: "0" * 64))
    with source_tree(None) as here, pytest.raises(UserError, match="refusing to time it"):
        measure(Side("ar", here), Side("ar", here), SPEC, block=4, gpu=None, timeout=300)


def test_bad_commit_is_a_clear_error():
    with pytest.raises(UserError, match="cannot check out"), source_tree("no-such-commit-xyz"):
        pass
