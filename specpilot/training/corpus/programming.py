"""Code prompts: function_stubs (HumanEval-shaped stubs from the task table and from pure standard-library
functions), short_tasks (MBPP-style one-sentence tasks) and the first code family (stdlib "implement this")."""

from __future__ import annotations

import ast
import functools
import importlib
import random
import statistics
import sysconfig
import textwrap
from pathlib import Path

from specpilot.datasets import _CODE_PREFIX
from specpilot.training.corpus.common import _distinct, _skip
from specpilot.training.corpus.tasks import (
    TASKS,
    WORDS,
    _g_ints,
    _g_pos,
    _g_sentence,
    _g_sorted,
    _g_words,
    _task_instance,
)

# --- code: the first family, implement a stdlib function from its signature -------------------------------------

def stdlib_functions() -> list[tuple[str, str, str]]:
    """(module, signature, first docstring sentence) of public stdlib functions, in a stable order."""
    return list(_stdlib_functions())


@functools.cache
def _stdlib_functions() -> tuple[tuple[str, str, str], ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.glob("*.py")):
        if _skip(path.relative_to(root)) or path.name.startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            sentence = doc.strip().split("\n\n")[0].replace("\n", " ").split(". ")[0].rstrip(".") if doc else ""
            if 20 <= len(sentence) <= 200:
                args = ", ".join(a.arg for a in node.args.args)
                out.append((path.stem, f"{node.name}({args})", sentence))
    return tuple(out)


CODE_TEMPLATES = (
    "Implement `{sig}` in Python from scratch (the standard library's `{module}` has one). It should: "
    "{doc}. Include a docstring.",
    "Write a Python function `{sig}`. Specification: {doc}. Add two small usage examples.",
    "Here is a specification: {doc}. Write `{sig}` in Python and explain how it works.",
)


def code_prompts(n: int, rng: random.Random) -> list[str]:
    items = stdlib_functions()
    rng.shuffle(items)
    return [rng.choice(CODE_TEMPLATES).format(module=m, sig=sig, doc=doc[0].lower() + doc[1:])
            for m, sig, doc in items[:n]]


# --- function_stubs: typed signature, docstring with worked examples --------------------------------------------

def _hint(value) -> str:
    """A type hint for an example value (builtin generics: no typing import at the top of the stub)."""
    if isinstance(value, bool | int | float | str):
        return type(value).__name__
    if isinstance(value, list):
        return f"list[{_hint(value[0])}]" if value else "list"
    if isinstance(value, tuple):
        return "tuple[" + ", ".join(_hint(v) for v in value) + "]" if value else "tuple"
    if isinstance(value, dict):
        key, item = next(iter(value.items()), ("", 0))
        return f"dict[{_hint(key)}, {_hint(item)}]"
    return "object"


def _render_stub(name: str, params: list[tuple[str, str]], ret: str, doc: str, examples: list[str],
                 rng: random.Random) -> str:
    """A HumanEval-shaped stub: typed signature, then a docstring stating the task with doctest examples."""
    lines = [f"def {name}({', '.join(f'{p}: {h}' for p, h in params)}) -> {ret}:"]
    body = textwrap.wrap(doc, 96)
    if rng.random() < 0.5:
        lines.append(f'    """{body[0]}')
        lines += [f"    {line}" for line in body[1:]]
    else:
        lines.append('    """')
        lines += [f"    {line}" for line in body]
    lead = rng.choice(("", "", "For example:", "Examples:", "Example:"))
    if rng.random() < 0.5 or lead:
        lines.append("")
    if lead:
        lines.append(f"    {lead}")
    for example in examples:
        call, result = example.split("\n")
        lines += [f"    >>> {call}", f"    {result}"]
    lines.append('    """')
    return "\n".join(lines) + "\n"


def _task_stub(rng: random.Random) -> str:
    examples: list[str] = []
    while not examples:  # every task makes short examples most of the time
        task = rng.choice(TASKS)
        name, params, examples = _task_instance(task, rng, rng.randint(1, 3))
    doc = task.doc.format(*(p for p, _ in params))
    return _render_stub(name, params, task.ret, doc, examples, rng)


# Pure standard-library functions whose behaviour a stub can show by running them on made-up arguments.
STDLIB_PURE = {
    "bisect": ("bisect_left", "bisect_right"), "calendar": ("isleap", "leapdays", "weekday", "monthrange"),
    "difflib": ("get_close_matches",), "fnmatch": ("fnmatch", "fnmatchcase", "filter"),
    "genericpath": ("commonprefix",), "heapq": ("nsmallest", "nlargest"),
    "operator": ("concat", "contains", "countOf", "indexOf"),
    "posixpath": ("isabs", "basename", "dirname", "commonpath"), "shlex": ("split", "join", "quote"),
    "statistics": ("mean", "fmean", "median", "median_low", "median_high", "mode", "multimode", "variance",
                   "pvariance", "stdev", "pstdev", "geometric_mean", "harmonic_mean"),
    "string": ("capwords",), "textwrap": ("shorten", "dedent", "indent"), "stat": ("filemode",),
}
FILES = ("notes.txt", "report_2024.pdf", "photo.jpg", "main.py", "data.csv", "README.md", "setup.cfg", "test_io.py")
PATHS = ("/home/ana/docs/notes.txt", "/usr/local/bin/tool", "src/app/main.py", "/var/log/app.log", "../data/raw.csv",
         "/home/ana/docs/old/draft.txt", "/usr/share/doc", "docs/index.html")


def _stdlib_arg(module: str, param: str, rng: random.Random):
    r = rng.randint
    by_param = {
        "year": lambda: r(1890, 2100), "y1": lambda: r(1900, 1999), "y2": lambda: r(2000, 2100),
        "month": lambda: r(1, 12), "day": lambda: r(1, 28), "n": lambda: r(1, 3), "x": lambda: r(0, 40),
        "word": lambda: rng.choice(WORDS[:40])[:-1] + rng.choice("aeiou"), "possibilities": lambda: _g_words(rng),
        "name": lambda: rng.choice(FILES), "names": lambda: rng.sample(FILES, 4),
        "pat": lambda: rng.choice(("*.txt", "*.py", "test_*", "*.?sv", "[a-m]*", "*_20??.*")),
        "m": lambda: rng.sample(PATHS, 2), "paths": lambda: rng.sample(PATHS[:2] + PATHS[5:7], 2),
        "iterable": lambda: _g_ints(rng), "data": lambda: _g_pos(rng), "a": lambda: _g_sorted(rng),
        "split_command": lambda: rng.choice((["ls", "-l", "my files"], ["echo", "it's ok"], ["grep", "-n", "a b"])),
        "width": lambda: r(12, 30), "prefix": lambda: rng.choice(("> ", "# ", "  ")), "mode": lambda: rng.choice(
            (0o100644, 0o100755, 0o040755, 0o120777, 0o100600)),
    }
    by_module = {
        ("operator", "a"): lambda: _g_pos(rng), ("operator", "b"): lambda: r(1, 20),
        ("posixpath", "s"): lambda: rng.choice(PATHS), ("posixpath", "p"): lambda: rng.choice(PATHS),
        ("shlex", "s"): lambda: rng.choice(("ls -l 'my files'", 'echo "hello world" > out.txt', "grep -rn x src")),
        ("textwrap", "text"): lambda: ("    " + _g_sentence(rng) + "\n    " + _g_sentence(rng)) if r(0, 1) else
        " ".join(_g_sentence(rng) for _ in range(3)),
        ("string", "s"): lambda: _g_sentence(rng),
    }
    make = by_module.get((module, param)) or by_param.get(param)
    return make() if make else None


def _stdlib_stub(rng: random.Random) -> str | None:
    module, name, required, sentence = rng.choice(_pure_stdlib())
    fn = getattr(importlib.import_module(module), name)  # may be the C version: same behaviour
    examples, hints, ret, k = [], None, None, rng.randint(1, 3)
    for _ in range(6):
        args = [_stdlib_arg(module, p, rng) for p in required]
        if any(a is None for a in args):
            return None
        try:
            shown = f"{name}({', '.join(map(repr, args))})"  # before the call: some functions mutate arguments
            result = fn(*args)
        except (ValueError, TypeError, IndexError, statistics.StatisticsError):
            continue
        example = f"{shown}\n{result!r}"
        if result is None or len(example) > 160 or example in examples:
            continue
        examples.append(example)
        hints, ret = hints or [_hint(a) for a in args], ret or _hint(result)
        if len(examples) == k:
            break
    if not examples:
        return None
    doc = sentence + "." + rng.choice(("", "", f" Do not import {module}.", " Use only built-in functions."))
    return _render_stub(name, list(zip(required, hints, strict=True)), ret, doc, examples, rng)


@functools.cache
def _pure_stdlib() -> tuple[tuple[str, str, tuple[str, ...], str], ...]:
    """(module, name, parameters without a default, docstring sentence) of the STDLIB_PURE functions."""
    root, out = Path(sysconfig.get_paths()["stdlib"]), []
    for module, sig, sentence in _stdlib_functions():
        name = sig.split("(")[0]
        if name not in STDLIB_PURE.get(module, ()):
            continue
        tree = ast.parse((root / f"{module}.py").read_text(encoding="utf-8"))
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
        args = node.args.posonlyargs + node.args.args
        out.append((module, name, tuple(a.arg for a in args[: len(args) - len(node.args.defaults)]), sentence))
    return tuple(out)


def _stub_one(rng: random.Random) -> str:
    stub = _stdlib_stub(rng) if rng.random() < 0.2 else None
    return _CODE_PREFIX + (stub or _task_stub(rng)) + "\n```"


def function_stubs(n: int, rng: random.Random) -> list[str]:
    """HumanEval-format prompts: the code prefix, a typed stub whose docstring holds worked examples, a fence."""
    return _distinct(_stub_one, n, rng)


# --- short_tasks: one sentence, sometimes an assert -------------------------------------------------------------

SHORT_OPENERS = ("Write a function to", "Write a function to", "Write a python function to",
                 "Write a python function to", "Write a Python function to", "Create a function to",
                 "Write a program to")
# Never empty: a bare "Write a function to <task>." could be some benchmark item word for word.
SHORT_CONSTRAINTS = (
    " and return the result", " and return the answer", ", given as an argument", " passed in as a parameter",
    " using recursion", " without using built-in functions", " using a for loop", " in a single line",
    " using a dictionary", " using a list comprehension", " using the collections module", " using a lambda",
    " without modifying the input", " in linear time", " using a set", " using map and filter", " using a while loop",
    ", and return None for empty input", ", and return the result as a list", " with a generator",
    " using the itertools module", " and print the result",
)
# (verb phrase with {}, objects): MBPP-style one-line tasks composed from parts
SHORT_PARTS = (
    ("count the {} in a given string", ("vowels", "consonants", "upper case letters", "lower case letters",
                                        "digits", "spaces", "punctuation marks", "words of odd length",
                                        "distinct characters", "capitalized words")),
    ("remove all the {} from a given string", ("vowels", "digits", "spaces", "punctuation marks",
                                               "repeated characters", "characters at odd positions",
                                               "words shorter than four letters", "non-ascii characters")),
    ("check if a given string {}", ("starts and ends with the same character", "contains only letters",
                                    "has balanced parentheses", "contains at least one digit and one letter",
                                    "is a valid variable name", "has no repeated words", "is in upper case",
                                    "is a rotation of another given string")),
    ("compute the {} in a list of integers", ("sum of the odd numbers", "product of the even numbers",
                                              "smallest positive number", "number of perfect squares",
                                              "average of the first and last elements", "sum of squares",
                                              "count of numbers divisible by seven", "third largest value",
                                              "index of the smallest element", "median value")),
    ("remove the {} from a given list", ("even numbers", "negative numbers", "zeros", "duplicate values",
                                         "numbers divisible by three", "first and last elements",
                                         "elements that appear more than once", "empty strings")),
    ("order a list of {}", ("tuples by their second element", "strings by their length",
                                 "words by their last letter", "dictionaries by a given key",
                                 "numbers by their absolute value", "strings ignoring case",
                                 "pairs by the sum of their elements", "names by the number of vowels")),
    ("compute the {} of two given tuples", ("element-wise sum", "element-wise product", "common elements",
                                            "element-wise maximum", "element-wise difference",
                                            "concatenation without duplicates")),
    ("{} a given dictionary", ("invert", "sort by value", "find the key with the smallest value in",
                               "remove the keys with empty values from", "count the values greater than ten in",
                               "merge with another dictionary and add common values of",
                               "list the keys in alphabetical order of")),
    ("check whether a given number is {}", ("a perfect cube", "a power of three", "even without using modulo",
                                            "a palindrome in base two", "divisible by the sum of its digits",
                                            "the sum of two squares", "a multiple of eleven", "a perfect number")),
    ("convert {}", ("a number into its octal string", "a list of digits into an integer",
                    "a temperature table from Celsius to Kelvin",
                    "a tuple of characters into a string", "minutes into hours and minutes",
                    "a string of comma-separated numbers into a list of integers", "kilometers to miles",
                    "a list of pairs into a dictionary", "an integer into a list of its digits")),
    ("compute the {} for a given matrix", ("sum of each column", "largest element of each row",
                                           "product of the diagonal", "row with the largest sum", "number of zeros",
                                           "position of the maximum")),
    ("return the {} of a given integer", ("number of set bits", "sum of its even digits", "largest digit",
                                          "product of its non-zero digits", "number of trailing zeros",
                                          "list of divisors greater than one")),
)


def _short_one(rng: random.Random) -> str:
    opener = rng.choice(SHORT_OPENERS)
    constraint = rng.choice(SHORT_CONSTRAINTS)
    if rng.random() < 0.45:  # from a task we can run: an assert line with a true call
        task = rng.choice(TASKS)
        name, _, examples = _task_instance(task, rng, 1)
        text = f"{opener} {task.short}{constraint}."
        if examples and rng.random() < 0.7:
            call, result = examples[0].split("\n")
            text += f"\nassert {call} == {result}"
        return text
    pattern, objects = rng.choice(SHORT_PARTS)
    return f"{opener} {pattern.format(rng.choice(objects))}{constraint}."


def short_tasks(n: int, rng: random.Random) -> list[str]:
    """MBPP-style one-sentence tasks, some followed by an assert of a call."""
    return _distinct(_short_one, n, rng)
