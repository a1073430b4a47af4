"""follow_ups: second-turn requests (revise, extend, test, vary) for two-turn conversations."""

from __future__ import annotations

import random

from specpilot.training.corpus.chat import CITIES, LANGS, NARRATORS, RECIPIENTS, TONES, WRITING_TOPICS
from specpilot.training.corpus.common import _distinct

FOLLOW_UPS = (
    "Rewrite your answer in a {tone} tone.",
    "Make your answer shorter: no more than {words} words.",
    "Can you expand the {part} part of your answer with more detail?",
    "Add a concrete example to your explanation.",
    "Now turn your answer into a numbered list.",
    "Put the main points of your answer into a table with two columns.",
    "Rewrite it as a short poem of {lines} lines.",
    "Explain the same thing to a {age}-year-old.",
    "What are the weak points of your answer? Point out anything that might be wrong.",
    "Critique your previous answer, then give an improved version.",
    "Write unit tests for the code you wrote.",
    "Explain how your code works, step by step.",
    "Solve the same problem again, but with every number doubled.",
    "Now solve a variant of the problem where {number_change}.",
    "Rewrite your code in {lang}.",
    "Can you make the code faster? Explain what you changed.",
    "Translate your answer into {language}.",
    "Summarize your answer in one sentence.",
    "Give your answer a title and split it into sections with headings.",
    "Rewrite the story so that it has a {ending} ending.",
    "Move the setting of your story to {place} and keep everything else.",
    "Now tell the same thing from the point of view of {narrator}.",
    "Turn your answer into an email to {recipient}.",
    "Add a counterargument and respond to it.",
    "Which of your points is the most important, and why?",
    "Rewrite it for a professional audience, without slang.",
    "Use simpler words: the reader is still learning English.",
    "Add {k} more ideas to your list.",
    "Remove the weakest item from your list and explain why you removed it.",
    "Say the same thing in exactly {k} sentences.",
    "Return your answer as JSON with the keys {keys}.",
    "Check your calculation again. Is the final answer correct?",
    "What would change if {condition}?",
    "Describe a real situation where this would be useful.",
    "Can you reach the same result with a different method?",
    "Write a question a student might ask next, and answer it.",
    "Add comments to the code that explain each part.",
    "Make the code handle {edge} as well.",
    "Rewrite your answer as a conversation between two people.",
    "Make it {adjective}.",
    "Shorten the second paragraph and keep the rest as it is.",
    "Replace your example with one about {topic}.",
    "Suggest three possible titles for what you wrote.",
    "Rewrite the first sentence so that it grabs the reader's attention.",
    "Continue the story for one more paragraph.",
    "Give me the answer as a step-by-step checklist.",
    "What evidence would support your main claim?",
    "Write a short quiz based on your answer, with {k} questions and their answers.",
    "Rewrite it in the style of a {style}.",
    "Now argue for the opposite view in one paragraph.",
    "Explain step {k} of your solution in more detail.",
    "Generalize your solution so that it works for any n, and explain it.",
    "Write a version of the code that uses no loops.",
    "What is the time complexity of your solution, and can it be improved?",
    "Would the answer change if we rounded only at the end? Explain.",
    "Add a short conclusion that sums everything up.",
    'Rewrite your answer addressing the reader directly as "you".',
    "Put the key terms in bold and define each one in a sentence.",
    "Cut your answer to about half its length without losing the main ideas.",
    "List the pros and cons of the approach you suggested.",
    "Now write a one-line summary that would fit in a text message.",
    "Give one version for a {age}-year-old and one for an expert.",
    "Suggest {k} activities that build on your answer.",
    "Rewrite it as a formal letter.",
    "Keep the content but write it all in the present tense.",
    "Turn your answer into a short speech of about {words} words.",
    "Explain why the other possible answers are wrong.",
    "Now do the same for {other_case}.",
    "Add a table that compares the options you mentioned.",
    "Can you double-check your reasoning and list any assumptions you made?",
    "Rewrite your answer so that each paragraph starts with a question.",
    "Give a shorter solution in {lang}, even if it is less readable.",
)
_FOLLOW_VALUES = {
    "tone": TONES + ("casual", "enthusiastic", "neutral"), "words": (30, 50, 60, 80, 100, 150), "lines": (4, 6, 8),
    "part": ("first", "second", "last", "middle"), "age": (5, 8, 10, 12, 14), "lang": LANGS,
    "number_change": ("the first number is halved", "there are three more people", "the price rises by 10%",
                      "the time is doubled", "the rate is cut by a quarter", "one of the items is removed"),
    "language": ("French", "Spanish", "German", "Italian", "Portuguese", "Dutch"),
    "ending": ("happy", "sad", "surprising", "open", "funny"), "place": CITIES + ("a space station", "a small farm"),
    "narrator": NARRATORS, "recipient": RECIPIENTS, "k": (2, 3, 4, 5, 6),
    "keys": ('"summary" and "points"', '"question", "answer" and "steps"', '"name" and "value"',
             '"title", "items" and "notes"'),
    "condition": ("the budget were cut in half", "it had to be done in one day", "the audience were children",
                  "there were twice as many people", "we could not use the internet", "it had to work offline"),
    "edge": ("an empty input", "negative numbers", "very large inputs", "duplicate values", "invalid input"),
    "adjective": ("funnier", "more dramatic", "more formal", "more concise", "more vivid", "more persuasive"),
    "topic": WRITING_TOPICS[:20], "style": ("news report", "fairy tale", "sports commentary", "scientific abstract",
                                            "recipe", "travel guide", "movie trailer"),
    "other_case": ("the opposite case", "a list of strings instead of numbers", "the next year", "a larger group"),
}


# how people open a second turn; sentences of their own, so the request keeps its capital
FOLLOW_OPENERS = ("",) * 10 + ("Thanks. ", "Great, thanks! ", "Nice. ", "Good start. ", "OK. ", "That helps. ",
                               "Interesting. ", "Not quite what I wanted. ", "I like it. ", "Almost there. ")


def _follow_one(rng: random.Random) -> str:
    request = rng.choice(FOLLOW_UPS).format(**{k: rng.choice(v) for k, v in _FOLLOW_VALUES.items()})
    return rng.choice(FOLLOW_OPENERS) + request


def follow_ups(n: int, rng: random.Random) -> list[str]:
    """n second-turn requests that revise or extend an earlier answer; generic, so any first turn fits. Distinct
    while the pool lasts (a few thousand), then drawn again: a second turn is one per conversation."""
    out = _distinct(_follow_one, n, rng)
    return out + [_follow_one(rng) for _ in range(n - len(out))]
