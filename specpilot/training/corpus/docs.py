"""docs: docstrings of the standard library's non-test modules (`ast.get_docstring`) and the prose of
`pydoc_data.topics`, wrapped in templates (explain, summarise, give an example, reason)."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import random
import sys
import sysconfig
from pathlib import Path

from specpilot.training.corpus.common import _skip

TEMPLATES = (
    "Explain in plain English what this Python documentation describes:\n\n{doc}",
    "Summarize the following in three bullet points:\n\n{doc}",
    "Write a short Python example that uses `{name}`. Here is its documentation:\n\n{doc}",
    "A student asks: what is `{name}` for, and when should I avoid it? Documentation:\n\n{doc}",
    "Rewrite this documentation as a friendly tutorial paragraph:\n\n{doc}",
    "Write a Python function that does something useful with `{name}`, with a docstring and a test.\n\n{doc}",
    "Think step by step: what could go wrong when using `{name}`? Documentation:\n\n{doc}",
)


def stdlib_docstrings(min_chars: int = 80, max_chars: int = 1500) -> list[tuple[str, str]]:
    """(qualified name, docstring) pairs, in a stable order."""
    return list(_stdlib_docstrings(min_chars, max_chars))


@functools.cache
def _stdlib_docstrings(min_chars: int, max_chars: int) -> tuple[tuple[str, str], ...]:
    """Parsing the whole standard library takes ~20 s, so the walk is kept on disk per interpreter build and
    stdlib folder (~/.cache/specpilot/stdlib_docs); the cache holds exactly what the walk returns."""
    root = Path(sysconfig.get_paths()["stdlib"])
    key = hashlib.sha256(f"{sys.version}|{root}|{min_chars}|{max_chars}|2".encode()).hexdigest()[:16]
    cache = Path.home() / ".cache" / "specpilot" / "stdlib_docs" / f"{key}.json"
    try:
        return tuple((name, doc) for name, doc in json.loads(cache.read_text(encoding="utf-8"))["items"])
    except (OSError, ValueError, TypeError, KeyError):
        pass
    out = _walk(root, min_chars, max_chars)
    from specpilot.results import write_json_atomic  # here: that module brings torch, which a cache hit skips

    try:  # atomic: processes that walk at once each write whole files
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cache, {"items": out})
    except OSError:
        pass  # a read-only home: walk again next time
    return out


def _walk(root: Path, min_chars: int, max_chars: int) -> tuple[tuple[str, str], ...]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if _skip(path.relative_to(root)):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in [tree, *ast.walk(tree)]:
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node)
            if doc and min_chars <= len(doc) <= max_chars:
                name = module if isinstance(node, ast.Module) else f"{module}.{node.name}"
                out.append((name, doc))
    return tuple(out)


def pydoc_topics(max_chars: int = 1500) -> list[tuple[str, str]]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return [(name, text.strip()[:max_chars]) for name, text in sorted(topics.items()) if len(text) > 200]


def doc_prompts(n: int, rng: random.Random) -> list[str]:
    items = stdlib_docstrings() + pydoc_topics()
    rng.shuffle(items)
    return [rng.choice(TEMPLATES).format(name=name, doc=doc) for name, doc in items[:n]]
