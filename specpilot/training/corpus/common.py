"""What the genre modules share: distinct draws, `<name>` placeholders, the standard-library file filter, and
the tables (people, weekdays, e-mail domains) that more than one genre draws from."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path


def _distinct(one: Callable[[random.Random], str], n: int, rng: random.Random) -> list[str]:
    """n distinct draws of `one` (fewer only if it cannot make that many), in draw order."""
    out: dict[str, None] = {}
    for _ in range(20 * n + 100):
        if len(out) >= n:
            break
        out.setdefault(one(rng), None)
    return list(out)


def _fill(template: str, values: dict) -> str:
    """Replace <name> placeholders: LaTeX is full of braces, so str.format does not fit math templates."""
    return re.sub(r"<(\w+)>", lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


def _skip(path: Path) -> bool:
    parts = set(path.parts)
    return bool(parts & {"test", "tests", "idle_test", "site-packages"}) or path.name.startswith("test_")


# --- shared tables: word problems, code tasks and chat all draw on them -----------------------------------------

PEOPLE = (("Amara", "f"), ("Bruno", "m"), ("Carmen", "f"), ("Dev", "m"), ("Elena", "f"), ("Farid", "m"),
          ("Grace", "f"), ("Hugo", "m"), ("Ines", "f"), ("Jamal", "m"), ("Keiko", "f"), ("Luis", "m"),
          ("Maya", "f"), ("Nikolai", "m"), ("Olivia", "f"), ("Pablo", "m"), ("Rania", "f"), ("Samuel", "m"),
          ("Tara", "f"), ("Umar", "m"), ("Valeria", "f"), ("Wei", "m"), ("Yasmin", "f"), ("Zane", "m"),
          ("Aisha", "f"), ("Diego", "m"), ("Freya", "f"), ("Kwame", "m"), ("Lucia", "f"), ("Marco", "m"),
          ("Nadia", "f"), ("Oscar", "m"), ("Paula", "f"), ("Ravi", "m"), ("Sofia", "f"), ("Theo", "m"),
          ("Hiroshi", "m"), ("Mei", "f"), ("Jonas", "m"), ("Leila", "f"), ("Emeka", "m"), ("Ingrid", "f"),
          ("Tomas", "m"), ("Zara", "f"), ("Arjun", "m"), ("Chloe", "f"), ("Mustafa", "m"), ("Beatriz", "f"))
_PRONOUNS = {"f": ("she", "her", "her", "She", "Her"), "m": ("he", "him", "his", "He", "His")}
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
DOMAINS = ("example.com", "mail.org", "school.edu", "company.net")
