"""Structured memory: an entry is kept only if its patch, applied to its base commit, reproduces the source
system's code byte for byte; replay accepts a faithful entry and rejects a tampered one."""

from __future__ import annotations

import json
import subprocess

import pytest

from specpilot.errors import UserError
from specpilot.memory.entry import Entry
from specpilot.memory.faithful import patch_between, resolve, tree_of
from specpilot.memory.store import Store

FINGERPRINT = {"gpu": "cpu", "target": "tiny", "drafter": "tiny", "regime": "single", "dtype": "float32"}


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    (r / "pkg").mkdir(parents=True)
    git(tmp_path, "init", "-q", str(r))
    git(r, "config", "user.email", "t@t")
    git(r, "config", "user.name", "t")
    (r / "pkg" / "step.py").write_text("def step(x):\n    return x + 1\n")
    (r / "pkg" / "blob.bin").write_bytes(bytes(range(256)))
    git(r, "add", "-A")
    git(r, "commit", "-qm", "base")
    base = git(r, "rev-parse", "HEAD")
    (r / "pkg" / "step.py").write_text("def step(x, fast=False):\n    return x + 1 if not fast else x + True\n")
    (r / "pkg" / "blob.bin").write_bytes(bytes(range(255, -1, -1)))
    (r / "pkg" / "new.py").write_text("FAST = True\n")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "mechanism")
    return r, base, git(r, "rev-parse", "HEAD")


def entry(repo, base, source, **changes) -> Entry:
    fields = dict(title="fast step", base_commit=resolve(repo, base), tree=tree_of(repo, source),
                  patch=patch_between(repo, base, source), registry={"system": "stock:fast=true", "tuned": {}},
                  evidence={"fingerprint": FINGERPRINT, "controller": {"gain": 1.05}},
                  provenance={"round": 1, "direction": "kernel", "agent": "builtin", "parents": []})
    return Entry(**{**fields, **changes})


def test_a_faithful_entry_is_kept_and_replays(repo, tmp_path):
    r, base, source = repo
    store = Store(tmp_path / "memory", r)
    e = entry(r, base, source)
    assert store.add(e) == e.id and store.ids() == [e.id]
    assert store.replay() == {e.id: None}
    assert store.read(e.id) == e  # the patch (binary included) round-trips through the files
    assert [row["system"] for row in store.rows(agent="builtin")] == ["stock:fast=true"]
    option = entry(r, base, base, title="an option", patch="")  # a mechanism that is already an option
    store.add(option)
    assert option.option_only and store.replay(option.id[:6]) == {option.id: None}


def test_an_unfaithful_entry_is_refused(repo, tmp_path):
    r, base, source = repo
    store = Store(tmp_path / "memory", r)
    wrong_tree = entry(r, base, source, tree=tree_of(r, base))
    with pytest.raises(UserError, match="not faithful"):
        store.add(wrong_tree)
    short = entry(r, base, source, patch=patch_between(r, base, source).split("diff --git a/pkg/step.py")[0])
    with pytest.raises(UserError, match="not faithful"):
        store.add(short)  # a patch that leaves part of the mechanism out
    assert store.ids() == []


def test_replay_rejects_a_tampered_entry(repo, tmp_path):
    r, base, source = repo
    store = Store(tmp_path / "memory", r)
    i = store.add(entry(r, base, source))
    patch = store.entries / i / "code.patch"
    patch.write_text(patch.read_text().replace("x + True", "x + 2"))  # the code changed after the fact
    assert "edited" in store.replay()[i]
    patch.write_text(patch_between(r, base, source))
    body = store.entries / i / "entry.json"
    record = json.loads(body.read_text())
    record["evidence"]["controller"]["gain"] = 1.5  # the evidence inflated
    body.write_text(json.dumps(record))
    assert "edited" in store.replay()[i]
    record["evidence"]["controller"]["gain"] = 1.05
    body.write_text(json.dumps(record))
    assert store.replay() == {i: None}


def test_entries_need_a_system_and_a_fingerprint(repo):
    r, base, source = repo
    with pytest.raises(UserError, match="fingerprint lacks gpu"):
        entry(r, base, source, evidence={"fingerprint": {k: v for k, v in FINGERPRINT.items() if k != "gpu"}})
    with pytest.raises(UserError, match="names no system"):
        entry(r, base, source, registry={})
    with pytest.raises(UserError, match="40-digit"):
        entry(r, base, source, base_commit="abc")


def test_the_memory_command(tmp_path):
    """list / show / replay / apply on a store of this checkout's own history (an option-only entry on HEAD);
    each call starts a process, so the store-level tests above carry the rest."""
    from specpilot.memory.cli import REPO
    from tests.test_cli import assert_one_line_error, specpilot

    head = resolve(REPO, "HEAD")
    store = Store(tmp_path / "memory", REPO)
    i = store.add(Entry(title="best-first tree", base_commit=head, tree=tree_of(REPO, head),
                        registry={"system": "stock:tree=best_first,nodes=32"},
                        evidence={"fingerprint": FINGERPRINT}, provenance={"round": 0, "agent": "shipped"}))
    where = ("--dir", str(tmp_path / "memory"))
    listed = specpilot("memory", "list", *where)
    assert listed.returncode == 0 and i in listed.stdout and "best_first" in listed.stdout
    shown = specpilot("memory", "show", i[:5], *where)
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == i
    body = store.entries / i / "entry.json"
    body.write_text(body.read_text().replace("nodes=32", "nodes=64"))
    tampered = specpilot("memory", "replay", *where)
    assert tampered.returncode == 1 and "rejected" in tampered.stdout
    assert_one_line_error(specpilot("memory", "apply", i, *where), "does not hold")
