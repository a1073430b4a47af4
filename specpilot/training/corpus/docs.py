"""docs: docstrings of the standard library's non-test modules (`ast.get_docstring`) and the prose of
`pydoc_data.topics`, wrapped in templates (explain, summarise, give an example, reason)."""

from __future__ import annotations

import ast
import functools
import random
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


@functools.cache  # a walk over the whole standard library takes seconds; every draw of the docs family needs it
def _stdlib_docstrings(min_chars: int, max_chars: int) -> tuple[tuple[str, str], ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
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
