"""Tokenizers: the target's own (Hugging Face files + chat template) or a byte tokenizer for random models."""

from __future__ import annotations

from pathlib import Path

from specpilot.errors import UserError


class ByteTokenizer:
    """UTF-8 bytes plus a few specials, with a minimal chat template; for the random tiny models."""

    BOS, EOS, USER, ASSISTANT, END = 256, 257, 258, 259, 260
    _NAMES = {256: "<s>", 257: "</s>", 258: "<|user|>", 259: "<|assistant|>", 260: "<|end|>"}

    def __init__(self, vocab_size: int):
        if vocab_size < 261:
            raise UserError(f"the byte tokenizer needs a vocabulary of at least 261 tokens, got {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_ids: tuple[int, ...] = (self.EOS, self.END)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        ids = [self.BOS]
        for m in messages:
            ids.append(self.USER if m["role"] == "user" else self.ASSISTANT)
            ids.extend(m["content"].encode("utf-8"))
            ids.append(self.END)
        return ids + [self.ASSISTANT]

    def encode(self, text: str) -> list[int]:
        """Raw text (a completion's prompt, no chat template)."""
        return [self.BOS, *text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """The checkpoint's tokenizer and chat template, through transformers (offline, local files)."""

    def __init__(self, folder: str | Path, enable_thinking: bool = False):
        from transformers import AutoTokenizer

        try:
            self.tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot load the tokenizer from {folder}: {str(exc).splitlines()[0]}") from None
        if not getattr(self.tok, "chat_template", None):
            raise UserError(f"the tokenizer in {folder} has no chat template")
        self.enable_thinking = enable_thinking
        self.vocab_size = len(self.tok)
        self.eos_ids = tuple(i for i in {self.tok.eos_token_id} if i is not None)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                            enable_thinking=self.enable_thinking)
        return self.tok.encode(text, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        """Raw text (a completion's prompt, no chat template), with the tokenizer's own special tokens."""
        return self.tok.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)
