"""Agents' worktrees, the seal on the judges' install and the brief: freeze() commits a worktree's files as they
are (tracked and untracked, ignored files and the private folder left out, modes and links kept, no filter run)
under a content-only identity; checkout() gives a fresh folder of a frozen commit; the seal names what changed in
the install and the data files; the brief is written in both forms and a submission is read or refused with a
reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from specpilot.agents import brief as brief_mod
from specpilot.agents.guards import Seal
from specpilot.agents.worktree import add, checkout, freeze
from specpilot.errors import UserError


def git(cwd, *args) -> bytes:
    return subprocess.run(["git", "-c", "user.name=x", "-c", "user.email=y", "-C", str(cwd), *args], check=True,
                          capture_output=True).stdout


def rev(cwd, what) -> str:
    return git(cwd, "rev-parse", what).decode().strip()


def modes(cwd, commit) -> dict[str, str]:
    """path -> mode of a commit's tree."""
    out = {}
    for line in git(cwd, "ls-tree", "-r", "-z", commit).decode().split("\0"):
        if line:
            meta, path = line.split("\t", 1)
            out[path] = meta.split()[0]
    return out


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A throwaway repository (no global or system git config) -> (repo, base commit)."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    (r / "a.txt").write_bytes(b"alpha\n")
    (r / "b.txt").write_bytes(b"beta\n")
    (r / "pkg").mkdir()
    (r / "pkg" / "mod.py").write_bytes(b"X = 1\n")
    (r / ".gitignore").write_bytes(b"*.log\n")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "base")
    return r, rev(r, "HEAD")


@pytest.fixture
def wt(repo, tmp_path):
    r, base = repo
    return add(r, base, tmp_path / "wts" / "one")


# ---- worktree ----------------------------------------------------------------------------------------------------

def test_add_makes_a_detached_worktree(repo, wt):
    r, base = repo
    assert (wt / "a.txt").read_bytes() == b"alpha\n"
    assert rev(wt, "HEAD") == base
    assert subprocess.run(["git", "-C", str(wt), "symbolic-ref", "-q", "HEAD"]).returncode != 0  # detached
    assert str(wt) in git(r, "worktree", "list").decode()


def test_add_again_after_the_folder_was_deleted(repo, wt):
    r, base = repo
    shutil.rmtree(wt)  # an earlier run's worktree deleted without `git worktree remove`
    assert add(r, base, wt) == wt and (wt / "a.txt").read_bytes() == b"alpha\n"


def test_freeze_unchanged(repo, wt):
    r, base = repo
    f = freeze(wt, base, "nothing")
    assert f.tree == rev(r, f"{base}^{{tree}}")
    assert f.changed == ()
    assert rev(r, f"{f.commit}^") == base and f.commit != base


def test_freeze_changes(repo, wt):
    r, base = repo
    new = b"alpha\r\n\x00\xff not text\n"
    (wt / "a.txt").write_bytes(new)
    (wt / "new.txt").write_bytes(b"fresh\n")
    (wt / "b.txt").unlink()
    (wt / ".specpilot").mkdir()
    (wt / ".specpilot" / "junk").write_bytes(b"private\n")
    (wt / "debug.log").write_bytes(b"ignored\n")
    f = freeze(wt, base, "changes")
    assert rev(r, f"{f.commit}^") == base
    assert rev(r, f"{f.commit}^{{tree}}") == f.tree
    assert sorted(f.changed) == ["a.txt", "b.txt", "new.txt"]
    assert git(r, "show", f"{f.commit}:a.txt") == new
    assert git(r, "show", f"{f.commit}:new.txt") == b"fresh\n"
    assert set(modes(r, f.commit)) == {".gitignore", "a.txt", "new.txt", "pkg/mod.py"}
    assert f.to_json()["commit"] == f.commit


def test_freeze_keeps_modes_and_links(repo, wt):
    r, base = repo
    (wt / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (wt / "run.sh").chmod(0o755)
    os.symlink("a.txt", wt / "link")
    f = freeze(wt, base, "modes")
    m = modes(r, f.commit)
    assert m["run.sh"] == "100755" and m["a.txt"] == "100644" and m["link"] == "120000"
    assert git(r, "cat-file", "blob", f"{f.commit}:link") == b"a.txt"
    assert sorted(f.changed) == ["link", "run.sh"]


def test_freeze_is_deterministic(repo, wt, tmp_path):
    r, base = repo
    (wt / "a.txt").write_bytes(b"changed\n")
    first = freeze(wt, base, "same")
    assert freeze(wt, base, "same") == first
    other = add(r, base, tmp_path / "wts" / "two")  # the same content in another folder: the same commit
    (other / "a.txt").write_bytes(b"changed\n")
    assert freeze(other, base, "same").commit == first.commit


def test_freeze_runs_no_filter(repo, wt, tmp_path):
    r, base = repo
    marker = tmp_path / f"filter-ran-{os.getpid()}"
    git(r, "config", "filter.evil.clean", f"touch {marker}; tr a-z A-Z")
    (wt / ".gitattributes").write_bytes(b"*.txt filter=evil\n")
    (wt / "a.txt").write_bytes(b"raw bytes\n")
    git(wt, "hash-object", "a.txt")  # the filter is set up: git's own hashing of the path runs it
    assert marker.exists()
    marker.unlink()
    f = freeze(wt, base, "filtered")
    assert not marker.exists()
    assert git(r, "show", f"{f.commit}:a.txt") == b"raw bytes\n"


def test_freeze_ref(repo, wt):
    r, base = repo
    (wt / "a.txt").write_bytes(b"kept\n")
    f = freeze(wt, base, "keep me", ref="refs/specpilot/candidate", repo=r)
    assert rev(r, "refs/specpilot/candidate") == f.commit


def test_freeze_bad_base(wt):
    with pytest.raises(UserError):
        freeze(wt, "0" * 40, "no such base")


def test_checkout_gives_the_frozen_bytes_and_replaces(repo, wt, tmp_path):
    r, base = repo
    (wt / "a.txt").write_bytes(b"first\n")
    (wt / "b.txt").unlink()
    first = freeze(wt, base, "first")
    (wt / "a.txt").write_bytes(b"second\n")
    second = freeze(wt, base, "second")
    timed = tmp_path / "timed"
    assert checkout(r, first.commit, timed) == timed
    assert (timed / "a.txt").read_bytes() == b"first\n" and not (timed / "b.txt").exists()
    (timed / "junk.txt").write_bytes(b"left from the first timing\n")
    checkout(r, second.commit, timed)
    assert (timed / "a.txt").read_bytes() == b"second\n"
    assert not (timed / "junk.txt").exists()
    assert rev(timed, "HEAD") == second.commit


# ---- seal --------------------------------------------------------------------------------------------------------

@pytest.fixture
def sealed(tmp_path):
    install = tmp_path / "install" / "specpilot"
    (install / "sub").mkdir(parents=True)
    (install / "__init__.py").write_text("")
    (install / "sub" / "worker.py").write_text("def work(): pass\n")
    data = tmp_path / "requests.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    return install, data, Seal.take(install, [data])


def test_seal_unchanged(sealed):
    _, _, seal = sealed
    assert seal.broken() == []
    assert seal.to_json()["files"] == 2


def test_seal_names_an_edited_file(sealed):
    install, _, seal = sealed
    (install / "sub" / "worker.py").write_text("def work(): cheat()\n")
    (why,) = seal.broken()
    assert "sub/worker.py" in why and "__init__.py" not in why


def test_seal_names_an_added_and_a_removed_file(sealed):
    install, _, seal = sealed
    (install / "extra.py").write_text("")
    (install / "__init__.py").unlink()
    (why,) = seal.broken()
    assert "extra.py" in why and "__init__.py" in why


def test_seal_counts_past_eight(sealed):
    install, _, seal = sealed
    for i in range(10):
        (install / f"m{i}.py").write_text("")
    (why,) = seal.broken()
    assert why.endswith("and 2 more")


def test_seal_data_changed_or_removed(sealed):
    _, data, seal = sealed
    data.write_text('{"prompt": "other"}\n')
    (why,) = seal.broken()
    assert str(data) in why
    data.unlink()
    (why,) = seal.broken()
    assert str(data) in why


# ---- brief -------------------------------------------------------------------------------------------------------

def a_brief(**over) -> dict:
    b = {"direction": {"factor": "acceptance", "mechanism": "longer drafts", "options": ["block_size"],
                       "value": 0.42},
         "budget": {"wall_s": 600, "turns": None, "usd": 1.5},
         "worktree": "/tmp/wt", "base": "abc123", "target": "tiny-target", "start": "stock",
         "ceiling": {"acceptance": 0.42}, "rules": brief_mod.rules(0.05, "tiny-target"),
         "memory": ["entry one", "entry two"], "install": "/opt/specpilot"}
    return {**b, **over}


def test_write_brief(tmp_path):
    folder = tmp_path / ".specpilot"
    b = a_brief()
    md = brief_mod.write(folder, b)
    assert md == folder / "BRIEF.md"
    assert (folder / ".gitignore").read_text() == "*\n"  # `git add -A` in the worktree leaves it out
    assert json.loads((folder / "brief.json").read_text()) == b
    text = md.read_text()
    for part in ("acceptance: longer drafts", "block_size", "0.42", "`/tmp/wt`", "abc123", "tiny-target", "`stock`",
                 "- entry one", "- entry two", "turns: not capped", "money: $1.50", "wall time: 600 s",
                 "`/opt/specpilot`", ".specpilot/submit.json", b["rules"]):
        assert part in text, part


def test_a_brief_names_the_concurrency_the_judges_time_at(tmp_path):
    one = brief_mod.write(tmp_path / "one", a_brief()).read_text()
    assert "in flight" not in one and "--in-flight" not in one  # one request at a time: nothing to say
    many = brief_mod.write(tmp_path / "many", a_brief(target="--preset smollm2", in_flight=16)).read_text()
    assert "serves 16 requests in flight" in many and "closed loops of 16" in many
    assert "`specpilot bench --preset smollm2 --in-flight 16 --system SYSTEM`" in many


def test_write_brief_without_memory_or_options(tmp_path):
    b = a_brief(memory=[], direction={"factor": "f", "mechanism": "m", "options": [], "value": None},
                budget={"wall_s": 60, "turns": 12, "usd": None})
    text = brief_mod.write(tmp_path, b).read_text()
    assert "options it already has: none" in text and "- none" in text
    assert "turns: 12" in text and "money: not capped" in text


def test_rules():
    text = brief_mod.rules(0.05, "tiny-target")
    assert "5% of headroom" in text and "force tiny-target" in text and "HEAD^{tree}" in text


def submit(folder, content: str):
    (folder / brief_mod.SUBMIT).write_text(content)


def test_read_submission_missing(tmp_path):
    cands, why = brief_mod.read_submission(tmp_path)
    assert cands == [] and isinstance(why, str) and why


@pytest.mark.parametrize("content", ["{not json", "[]", '{"no": "candidates"}', '{"candidates": 3}',
                                     '{"candidates": {"system": "stock"}}', '{"candidates": ["stock"]}',
                                     '{"candidates": [{"note": "no system"}]}'])
def test_read_submission_malformed(tmp_path, content):
    submit(tmp_path, content)
    cands, why = brief_mod.read_submission(tmp_path)
    assert cands == [] and isinstance(why, str) and why


def test_read_submission_valid(tmp_path):
    submit(tmp_path, json.dumps({"candidates": [{"system": "stock", "note": "x"},
                                                {"system": "stock:k=1", "measured_tree": "ab" * 20,
                                                 "note": "n" * 5000}]}))
    cands, why = brief_mod.read_submission(tmp_path)
    assert why is None
    assert cands[0] == {"system": "stock", "measured_tree": None, "note": "x"}
    assert cands[1]["measured_tree"] == "ab" * 20 and len(cands[1]["note"]) == 2000


@pytest.mark.parametrize("cand", [{"system": 3}, {"system": ["stock"]}, {"system": "stock", "measured_tree": 7}])
def test_read_submission_not_strings(tmp_path, cand):
    submit(tmp_path, json.dumps({"candidates": [{"system": "stock"}, cand]}))
    cands, why = brief_mod.read_submission(tmp_path)
    assert cands == [] and "not a string" in why
