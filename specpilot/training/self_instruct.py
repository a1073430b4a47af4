"""Prompts written by the target itself: meta-prompts that ask for a prompt, and a parser for what comes back.

Templates cover a genre's shape but not its spread of wording; the target's own questions add that, in the
distribution the drafter will serve. SmolLM2-135M is tiny, so the meta-prompts are short and concrete ("Write one
math word problem about a bake sale for a third grade student. Write only the problem."), and `parse` is strict:
the model labels its output, answers its own question, repeats itself, refuses or stops mid-sentence, and most
of that must be cut or thrown away. Use: `meta_prompts` -> generate each with `SAMPLING` (at most `MAX_NEW_TOKENS`)
-> `parse(kind, text)`.
"""

from __future__ import annotations

import random
import re
import zlib
from collections import Counter

from specpilot.datasets import _MATH_SUFFIX
from specpilot.training.corpus import (
    AUDIENCES,
    FORMS,
    HUMANITIES_TOPICS,
    PEOPLE,
    PERSONAS,
    PROBLEMS,
    STEM_TOPICS,
    WRITING_TOPICS,
)
from specpilot.training.distill import Sampling

SAMPLING = Sampling(temperature=0.9, top_k=50)  # varied enough not to repeat itself, low enough to stay on task
MAX_NEW_TOKENS = 128  # a prompt, not an answer: a long output is usually a self-answer

EVERYDAY = ("shopping", "cooking dinner", "a bake sale", "a school trip", "a vegetable garden", "pocket money",
            "a birthday party", "a road trip", "a lemonade stand", "a bus ride", "a farm", "a library",
            "football practice", "a zoo visit", "painting a room", "ordering pizza", "train tickets",
            "a swimming pool", "a bike race", "a fruit market", "a book fair", "recycling cans", "a camping trip",
            "a movie night", "baking cookies", "a toy store", "a concert", "building a fence", "a fish tank",
            "a class election", "a car wash fundraiser", "planting trees")
GRADES = ("second grade", "third grade", "fourth grade", "fifth grade", "sixth grade", "seventh grade",
          "eighth grade")
ACTIVITIES = ("buys fruit at a market", "saves money for a bike", "bakes cookies for a party",
              "runs around a track", "collects stickers", "sells lemonade", "reads a long book",
              "plants flowers in rows", "shares sweets with friends", "drives to a nearby town")
MATH_TOPICS = ("quadratic equations", "prime numbers", "probability with dice", "counting arrangements",
               "triangles", "circles", "remainders", "logarithms", "arithmetic sequences", "inequalities",
               "fractions", "exponents", "polynomials", "complex numbers", "trigonometry", "areas of shapes",
               "divisibility", "absolute value", "systems of equations", "functions", "geometric series",
               "coordinates and lines")
CODE_TOPICS = ("strings", "lists of numbers", "dictionaries", "dates", "file names", "prime numbers", "sorting",
               "counting words", "matrices", "sets", "temperatures", "student grades", "shopping lists",
               "passwords", "binary numbers", "recursion", "tuples", "money amounts", "email addresses",
               "times of day")
ADJECTIVES = ("shorter", "funnier", "more formal", "simpler", "more detailed", "friendlier")

KINDS: dict[str, tuple[tuple[str, ...], float]] = {
    "word_problem": ((
        "Write one math word problem about {everyday} for a {grade} student. Write only the problem.",
        "Write a short math story problem where {name} {activity}. End with a question. Do not solve it.",
        "Write a math word problem with two steps about {everyday}. Use numbers. Write only the problem.",
        "Make up a math question about money and {everyday}. Only write the question.",
    ), 0.15),
    "competition_math": ((
        "Write one hard math competition problem about {math}. Write only the problem.",
        "Write a challenging math question about {math}. Do not give the answer.",
        "Write one short problem about {math} for a high school math contest. Only the problem.",
    ), 0.10),
    "function_task": ((
        'Describe a small Python function that works with {code}. Start with "Write a Python function".',
        "Write a programming task about {code} in one or two sentences. Do not write the code.",
        "Write a Python function header and docstring for a task about {code}. Do not write the body.",
    ), 0.10),
    "one_line_task": ((
        'Write one sentence that starts with "Write a function to" about {code}.',
        'Give one short Python exercise about {code}. Start with "Write a python function to".',
    ), 0.08),
    "assistant_question": ((
        "Write one question a person might ask an assistant about {topic}.",
        "What is a good question to ask about {topic}? Write only the question.",
        "Write a request for advice about {problem}. Write only the request.",
    ), 0.10),
    "writing": ((
        "Write a request asking for a {form} about {topic}. Write only the request.",
        "Ask a writer for a {form} for {audience}. Write one sentence.",
    ), 0.09),
    "roleplay": ((
        "Write a role-play request that asks the assistant to pretend to be {persona}.",
        "Write one sentence that asks an assistant to act as {persona} and help with {problem}.",
    ), 0.07),
    "reasoning": ((
        "Write a short logic puzzle about {name} and {name2}. End with a question.",
        "Write a riddle that needs careful thinking. End with a question.",
        "Write a short puzzle about the order of {k} people standing in a line. End with a question.",
    ), 0.07),
    "stem": ((
        "Write one question a student might ask about {stem}.",
        "Write a science question about {stem}. Write only the question.",
    ), 0.07),
    "humanities": ((
        "Write one essay question about {hum}.",
        "Write a history or philosophy question about {hum}. Only write the question.",
    ), 0.07),
    "extraction": ((
        "Write a short paragraph about {topic} with names, dates and numbers. Then ask to list all the names and "
        "numbers.",
        "Write three short reviews of {product} with star ratings. Then ask which review is the most negative.",
    ), 0.05),
    "follow_up": ((
        "Write a short request asking someone to change their last answer, for example to make it {adjective}.",
        "Write one follow-up request after an answer about {topic}, such as asking for an example.",
    ), 0.05),
}
TOPICS = EVERYDAY + MATH_TOPICS + CODE_TOPICS + WRITING_TOPICS + STEM_TOPICS + HUMANITIES_TOPICS
MATH_KINDS = frozenset({"word_problem", "competition_math"})
CODE_KINDS = frozenset({"function_task", "one_line_task"})
# kinds whose last sentence must ask (a question, or an imperative); text after their last "?" is a self-answer
QUESTION_KINDS = frozenset({"word_problem", "competition_math", "reasoning", "assistant_question", "stem",
                            "humanities", "follow_up"})
MIN_CHARS, MAX_CHARS = 25, 800


def _counts(n: int) -> list[tuple[str, int]]:
    """Per-kind counts summing to n, by largest remainder."""
    raw = [(kind, n * share) for kind, (_, share) in KINDS.items()]
    counts = {kind: int(x) for kind, x in raw}
    for kind, _ in sorted(raw, key=lambda kx: int(kx[1]) - kx[1])[: n - sum(counts.values())]:
        counts[kind] += 1
    return list(counts.items())


def _values(rng: random.Random) -> dict:
    (name, _), (name2, _) = rng.sample(PEOPLE, 2)
    return {
        "everyday": rng.choice(EVERYDAY), "grade": rng.choice(GRADES), "name": name, "name2": name2,
        "activity": rng.choice(ACTIVITIES), "math": rng.choice(MATH_TOPICS), "code": rng.choice(CODE_TOPICS),
        "topic": rng.choice(TOPICS), "problem": rng.choice(PROBLEMS), "form": rng.choice(FORMS),
        "audience": rng.choice(AUDIENCES), "persona": rng.choice(PERSONAS), "k": rng.randint(3, 6),
        "stem": rng.choice(STEM_TOPICS), "hum": rng.choice(HUMANITIES_TOPICS), "adjective": rng.choice(ADJECTIVES),
        "product": rng.choice(("a blender", "a hotel", "a pair of shoes", "a phone", "a cafe", "a backpack")),
    }


def meta_prompts(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """n (kind, meta-prompt) pairs, the kinds in their KINDS shares, shuffled; deterministic per rng state."""
    out = [(kind, rng.choice(KINDS[kind][0]).format(**_values(rng))) for kind, k in _counts(n) for _ in range(k)]
    rng.shuffle(out)
    return out


# --- parse ------------------------------------------------------------------------------------------------------

_LABEL = re.compile(
    r"^\s*(?:(?:sure|okay|ok|certainly|of course)\b[,!.]?\s*)?"
    r"(?:here(?:'s| is| are)\b[^:\n]*?[:.](?=\s|$)|one\s*:|"
    r"(?:(?:a|the|my|your|one|new)\s+)?(?:[\w-]+\s+){0,2}?"
    r"(?:problem|question|task|puzzle|request|prompt|exercise|riddle|instruction|scenario|query)s?"
    r"(?:\s*#?\d+)?\s*[*_]*\s*(?::|\s-\s)|\d+[.)]\s)\s*", re.I)
_KINDS_WORD = r"(?:problem|question|task|puzzle|request|prompt|exercise|riddle)s?"
# a label alone on a line below some preamble ("...\nQuestion:\nWhat is ...?"): the content starts after it
_LINE_LABEL = re.compile(r"\n[ \t]*[*_]*" + _KINDS_WORD + r"[*_]*\s*:[*_]*[ \t]*\n", re.I)
# a label opening a line, or a short lead-in naming what follows ("A good question to ask about X is:")
_INLINE_LABEL = re.compile(
    r"(?:^|(?<=\n)|(?<=[.?!] ))[ \t]*[*_]*(?:here is |here's |this is )?"
    r"(?:(?:a|an|the|my|one|good|possible|great|simple|short|math|word|logic|follow-up|example of)\s+)*"
    + _KINDS_WORD + r"(?: (?:to ask|for (?:you|me)))?(?: about [^.?!:\n]{0,40})?(?: is| would be| could be)?"
    r"(?: like this)?[*_]*\s*:[*_]*[ \t]*", re.I)
# where the model starts answering its own question, or starts a second one
_CUT = re.compile(
    r"(?:^|\n|(?<=[.?!:])[ \t]+)[*_#\s]*(?:"
    r"(?:answers?|solutions?|explanation|hints?|notes?|steps?|output|response|reasoning|expected output|"
    r"example solution|final answer|working)\s*[*_]*\s*[:\-]|"
    r"step 1\b|let'?s solve\b|let'?s think\b|to solve this\b|the answer is\b|the solution is\b|solution\s*\n)"
    r"|\n[^\w\n]{0,3}\s*(?:2[.)]\s|two\s*:|(?:problem|question|task|puzzle|exercise)\s*#?2\b)", re.I)
_REFUSAL = re.compile(
    r"\b(?:i'?m sorry|i am sorry|i can'?t|i cannot|i'?m unable|i am unable|as an ai|i'?m not able|i am not able|"
    r"i do not have|i don'?t have the ability|not allowed to)\b", re.I)
# the model speaking as the assistant instead of writing a user's prompt
_ASSISTANT_VOICE = re.compile(
    r"\b(?:how (?:can|may) i (?:help|assist)|what can i (?:help|assist|do)|i'?m (?:here|ready) to (?:help|assist)|"
    r"i am (?:here|ready) to (?:help|assist)|i'?m (?:a|an) (?:ai|chatbot|assistant|language model)|"
    r"i am (?:a|an) (?:ai|chatbot|assistant|language model)|glad you asked|i'?d be (?:happy|glad) to|"
    r"what'?s on your mind|let me know (?:your|if you|what)|what would you like|what'?s your (?:specific )?question|"
    r"you'?d like to (?:know|discuss|ask)|i'?d be delighted|i'?m here to|i am here to|how may i|"
    r"nice to meet you)\b", re.I)
_IMPERATIVE = re.compile(
    r"^(?:(?:from|using|based on|given|for|in|with|after|according to|if|now|then|next|finally|first)\b"
    r"[^,:.?!]{0,50}[,:]\s*)?(?:find|compute|calculate|determine|solve|evaluate|simplify|express|show|prove|"
    r"how|what(?! a\b)|which|who|why|when|where|give|write|list|explain|identify|decide|figure|work out|use|"
    r"estimate|describe|name|count|extract|summari[sz]e|tell|say|can|could|would|please|round|convert|factor|"
    r"expand|rewrite|draw|check|verify|order|rank|sort|arrange|choose|match|complete|fill|create|make|plan|"
    r"design|compare|predict|state|put|read|turn|classify|return|translate|implement|define|build|generate|"
    r"pretend|imagine|act|suppose|assume|discuss|analy[sz]e|argue|outline|draft|compose|suggest|recommend|"
    r"help|add|change|shorten|continue|answer (?:using|the|these|this|each|all|in|with|based))\b", re.I)
_CODE_WORD = re.compile(r"\b(?:function|program|def|script|class|method|python)\b", re.I)
_SENTENCE_END = re.compile(r"[.?!][\"')\]”’]*(?=\s|$)")
_ENDS_WELL = re.compile(r"[.?!][\"')\]”’]*$")
_STOP = frozenset("the a an and or of to in on is are was be for with it that this at as by from".split())


def _code_block(text: str) -> tuple[str, str]:
    """(prose before the first code block, the block if it is closed and short, else "")."""
    start = text.find("```")
    if start < 0:
        return text, ""
    end = text.find("```", start + 3)
    block = text[start:end + 3] if end > 0 else ""
    return text[:start], block if "def " in block and len(block) <= 600 else ""


def _drop_headings(text: str) -> str:
    lines = []
    for line in text.split("\n"):
        if re.match(r"\s*#{1,6}\s", line):
            line = re.sub(r"^\s*#{1,6}\s*", "", line)
            rest = _LABEL.sub("", line, count=1).strip()
            if not rest or (len(rest) < 60 and not re.search(r"[.?!]$", rest)):
                continue  # a title, or a label on its own
        lines.append(line)
    return "\n".join(lines)


def _drop_labels(text: str) -> str:
    """Remove inline labels, capitalizing what follows them ("The question: does it..." -> "Does it...")."""
    out, pos = [], 0
    for m in _INLINE_LABEL.finditer(text):
        out.append(text[pos:m.start()])
        pos = m.end()
        if pos < len(text):
            text = text[:pos] + text[pos].upper() + text[pos + 1:]
    return ("".join(out) + text[pos:]).strip()


def _unwrap(text: str) -> str:
    """Strip surrounding quotes, emphasis and labels, as often as they nest."""
    before = None
    while before != text:
        before = text
        text = re.sub(r"^[^\w\s\"'“‘(\[$\\`]+", "", text.strip()).strip("*_").strip()  # bullets, emoji
        text = _LABEL.sub("", text, count=1)
        if len(text) > 1 and text[0] in "\"'“‘" and text[-1] in "\"'”’":
            text = text[1:-1]
        elif text and text[0] in "\"“" and text.count(text[0]) == 1 and "”" not in text:
            text = text[1:]  # an opening quote whose closing one was cut off
    return text.strip()


def _paragraphs(text: str, kind: str) -> str:
    """The first paragraph; the next ones too while a paragraph introduces them (ends with ":"), and for
    extraction the instruction that follows the passage."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    if not paragraphs:
        return ""
    out, rest = paragraphs[0], paragraphs[1:]
    while rest and out.endswith(":"):
        out += "\n\n" + rest.pop(0)
    if kind == "extraction" and rest and (_asks_anything(out) != _asks_anything(rest[0])):
        out += "\n\n" + rest[0]  # the passage, then what to do with it (or the other way round)
    return out


def _sentences(text: str) -> list[str]:
    return [x for x in re.split(r"(?<=[.?!])\s+|\n", text.strip()) if x.strip()]


def _asks_anything(text: str) -> bool:
    return "?" in text or any(_IMPERATIVE.match(x.strip("*_ ")) for x in _sentences(text))


def _complete(text: str) -> str:
    """Drop a trailing unfinished sentence (generation stopped mid-way)."""
    text = re.sub(r"\s*[^.?!]*(?:\.\.\.|…)$", "", text)  # trailing off is not an ending
    last = re.split(r"\n\s*\n", text)[-1].split("\n")
    if _ENDS_WELL.search(text) or (len(last) >= 2 and all(0 < len(line) <= 100 for line in last)):
        return text  # a sentence's end, or a list or table (a passage to work on)
    ends = list(_SENTENCE_END.finditer(text))
    return text[: ends[-1].end()] if ends else ""


def _repetitive(text: str, kind: str) -> bool:
    lines = [line.strip().lower() for line in text.split("\n") if len(line.strip()) > 10]
    if len(lines) != len(set(lines)):
        return True
    sentences = [s.strip().lower() for s in re.split(r"(?<=[.?!])\s+", text) if len(s.strip()) > 15]
    if len(sentences) != len(set(sentences)):
        return True
    prose = re.sub(r"\$[^$]*\$|\\[a-zA-Z]+", " ", text)  # LaTeX repeats its commands legitimately
    words = re.findall(r"[a-z']+", prose.lower())
    content = [w for w in words if w not in _STOP and len(w) > 2]
    if content and Counter(content).most_common(1)[0][1] > max(6, 0.25 * len(content)):
        return True
    if kind == "extraction":
        return False  # a passage of records (reviews, a table) repeats its phrasing by design
    trigrams = Counter(zip(words, words[1:], words[2:], strict=False))
    return bool(trigrams) and trigrams.most_common(1)[0][1] >= 3 and 9 * trigrams.most_common(1)[0][1] >= len(words)


def _asks(text: str, kind: str) -> str:
    """Cut a self-answer after the question; "" if the text asks nothing of the reader."""
    if kind in QUESTION_KINDS:
        if "?" in text:
            tail = text[text.rfind("?") + 1:].strip()
            if tail and not _IMPERATIVE.match(tail):
                text = text[: text.rfind("?") + 1]
        last = _sentences(text)[-1] if text.strip() else ""
        return text if last.endswith("?") or _IMPERATIVE.match(last) else ""
    if kind == "extraction":  # a passage and an instruction, in either order
        parts = text.split("\n\n")
        return text if _asks_anything(parts[0]) or _asks_anything(parts[-1]) else ""
    return text if _asks_anything(text) else ""


def parse(kind: str, text: str) -> str | None:
    """A usable prompt from a model's raw output, or None. Pure: the same input always gives the same answer."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    block = ""
    if kind in CODE_KINDS:
        text, block = _code_block(text)
    elif "```" in text:
        text = text[: text.find("```")]
    text = _unwrap(_drop_headings(text))
    labels = list(_LINE_LABEL.finditer(text))
    if labels:
        text = text[labels[-1].end():]
    text = _drop_labels(text)
    cut = _CUT.search(text)
    if cut and cut.start() > 0:
        text = text[: cut.start()]
    text = _unwrap(_paragraphs(_unwrap(text), kind))
    if not (block and text.endswith(":")):  # "Complete this function:" followed by its stub
        text = _asks(_complete(text), kind)
    if not text or text.count('"') % 2 or _REFUSAL.search(text) or _ASSISTANT_VOICE.search(text):
        return None
    if _repetitive(text, kind):
        return None
    if kind in MATH_KINDS and not re.search(r"[\d$]", text):  # a math problem without a number asks nothing
        return None
    letters = sum(ch.isalpha() for ch in text)
    if letters < (0.35 if kind in MATH_KINDS else 0.55) * len(re.sub(r"\s", "", text)):  # LaTeX is symbol-heavy
        return None
    if kind in CODE_KINDS and not _CODE_WORD.search(text + block):
        return None
    body = text[0].upper() + text[1:] + ("\n\n" + block if block else "")
    if kind in MATH_KINDS and zlib.crc32(body.encode()) % 2 == 0:  # half, like the benchmark's format
        body += _MATH_SUFFIX
    return body if MIN_CHARS <= len(body) <= MAX_CHARS else None
