"""An answer's text as its tokens come: each new piece decoded once, never a half character, and cut at a stop
string.

A token can end inside a UTF-8 character (its next token completes it), and a tokenizer may print a token
differently after what precedes it, so each piece is decoded with a few tokens of what came before and only the
part after them is new (the way vLLM's incremental detokenizer works); a piece that ends in U+FFFD waits for the
next token.
"""

from __future__ import annotations

LOOKBACK = 6  # tokens decoded before a new piece, for the tokenizer's context


class Detokenizer:
    """tokens in, new text out; `stop`: strings that end the answer (the text stops before the first one)."""

    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.tokenizer, self.stop = tokenizer, stop or []
        self.tokens: list[int] = []
        self.prefix = self.read = 0  # tokens[prefix:read] were decoded into text already
        self.text = ""  # everything said so far (stop strings held back: see `held`)
        self.sent = 0  # characters of `text` given out
        self.stopped = False

    def add(self, tokens: list[int], last: bool = False) -> str:
        """The text that is new and safe to send after these tokens (last: the answer ends here, so send what was
        held back)."""
        if self.stopped:
            return ""
        self.tokens.extend(tokens)
        before = self.tokenizer.decode(self.tokens[self.prefix : self.read])
        now = self.tokenizer.decode(self.tokens[self.prefix :])
        if len(now) > len(before) and (last or not now.endswith("\ufffd")):
            self.text += now[len(before) :]
            self.prefix, self.read = max(len(self.tokens) - LOOKBACK, 0), len(self.tokens)
        return self._release(last)

    def _release(self, last: bool) -> str:
        for s in self.stop:
            at = self.text.find(s, max(self.sent - len(s), 0))
            if at >= 0:
                self.text, self.stopped = self.text[:at], True
        # hold back a tail that could be the start of a stop string
        held = 0 if last or self.stopped else max((_overlap(self.text, s) for s in self.stop), default=0)
        end = max(len(self.text) - held, self.sent)
        piece, self.sent = self.text[self.sent : end], end
        return piece


def _overlap(text: str, stop: str) -> int:
    """The longest end of `text` that begins `stop` (shorter than it)."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0
