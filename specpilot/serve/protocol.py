"""The OpenAI wire format: a request body checked and turned into an Ask, the answers and stream chunks built.

Fields that change what is generated and that SpecPilot does not do (n > 1, logprobs, echo, best_of, tools) are
refused with a 400, never silently ignored; fields that change nothing here (user, metadata, ...) are ignored as
OpenAI's own server ignores what it does not use. Defaults are OpenAI's: temperature 1, top_p 1, max_tokens up to
the context; top_k and a request's seed as vLLM and SGLang take them.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field

from specpilot.core.contracts import Sampling

REFUSED = {"n": lambda v: v not in (None, 1), "best_of": lambda v: v not in (None, 1),
           "logprobs": lambda v: v not in (None, False, 0), "top_logprobs": lambda v: v not in (None, 0),
           "echo": lambda v: bool(v), "tools": lambda v: bool(v), "functions": lambda v: bool(v),
           "suffix": lambda v: bool(v), "logit_bias": lambda v: bool(v)}


class ApiError(Exception):
    """An error answered as OpenAI does: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Ask:
    """A checked request: its prompt's token ids, budget, sampling (None: greedy), stop strings, streaming."""

    chat: bool
    prompt: list[int]
    max_tokens: int
    sampling: Sampling | None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def parse(body, chat: bool, model: str, tokenizer, room: int) -> Ask:
    """body: the decoded JSON; model: the served model's id; room: context slots a request may fill (its prompt,
    its answer and a step's draft rows)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    asked = body.get("model")
    if asked is not None and asked != model:
        raise ApiError(404, f"The model `{asked}` does not exist (this server serves `{model}`)", "model",
                       "model_not_found")
    for name, bad in REFUSED.items():
        if bad(body.get(name)):
            raise ApiError(400, f"`{name}` = {body[name]!r} is not supported by this server", name, "unsupported")
    prompt = _chat_prompt(body, tokenizer) if chat else _text_prompt(body, tokenizer)
    if len(prompt) >= room:
        raise ApiError(400, f"This model's context holds {room} tokens; the prompt has {len(prompt)}", "messages" if
                       chat else "prompt", "context_length_exceeded")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is None:
        limit = room - len(prompt)
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    limit = _number(limit, name, int, 1)
    if len(prompt) + limit > room:
        raise ApiError(400, f"This model's context holds {room} tokens: {len(prompt)} in the prompt + {limit} to "
                       f"generate do not fit (lower `{name}`)", name, "context_length_exceeded")
    return Ask(chat, prompt, limit, _sampling(body), _stop(body.get("stop")), _flag(body, "stream"),
               _include_usage(body))


def _chat_prompt(body: dict, tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "`messages` must be a non-empty list", "messages")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
            raise ApiError(400, f"messages[{i}] needs a role of system, developer, user or assistant",
                           f"messages[{i}].role")
        turns.append({"role": "system" if m["role"] == "developer" else m["role"],
                      "content": _content(m.get("content"), i)})
    return tokenizer.chat_prompt(turns)


def _content(content, i: int) -> str:
    """A message's text: a string, or a list of text parts (no images here)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                         isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def _text_prompt(body: dict, tokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if min(prompt) < 0 or max(prompt) >= tokenizer.vocab_size:
            raise ApiError(400, f"a prompt token id is outside 0..{tokenizer.vocab_size - 1}", "prompt")
        return list(prompt)
    raise ApiError(400, "`prompt` must be a non-empty string, a list of one string, or a list of token ids "
                   "(one prompt a request)", "prompt")


def _sampling(body: dict) -> Sampling | None:
    temperature = _number(body.get("temperature", 1.0), "temperature", float, 0.0, 2.0)
    top_p = _number(body.get("top_p", 1.0), "top_p", float, 0.0, 1.0)
    top_k = _number(body.get("top_k", 0), "top_k", int, -1)  # -1 or 0: every token (vLLM says -1)
    seed = body.get("seed")
    seed = random.getrandbits(31) if seed is None else _number(seed, "seed", int, 0, 2**63 - 1)
    if temperature == 0:
        return None
    if top_p == 0:
        raise ApiError(400, "`top_p` must be in (0, 1]", "top_p")
    return Sampling(temperature, top_p, max(top_k, 0), seed)


def _number(value, name: str, kind: type, low: float | None = None, high: float | None = None):
    ok = isinstance(value, int | float) and not isinstance(value, bool) and (kind is float or float(value).is_integer())
    if not ok or (low is not None and value < low) or (high is not None and value > high):
        where = f" in {low}..{high}" if high is not None else (f" >= {low}" if low is not None else "")
        raise ApiError(400, f"`{name}` must be {'an integer' if kind is int else 'a number'}{where}, got {value!r}",
                       name)
    return kind(value)


def _stop(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, "`stop` must be a non-empty string or a list of up to 4 of them", "stop")
    return stops


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool) and value is not None:
        raise ApiError(400, f"`{name}` must be true or false", name)
    return bool(value)


def _include_usage(body: dict) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise ApiError(400, "`stream_options` must be an object", "stream_options")
    return _flag(options, "include_usage")


def usage(ask: Ask, completion: int, steps: int, drafted: int) -> dict:
    """OpenAI's usage, with speculation in its standard fields: tokens a step accepted from the drafts, and drafted
    tokens verified and not accepted (steps: target passes; drafted: draft tokens they verified)."""
    accepted = max(completion - steps, 0)
    return {"prompt_tokens": len(ask.prompt), "completion_tokens": completion,
            "total_tokens": len(ask.prompt) + completion,
            "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                          "rejected_prediction_tokens": max(drafted - accepted, 0)}}


def meta_info(completion: int, steps: int, system: str) -> dict:
    """Speculation per response, as SGLang's meta_info: target passes and tokens per pass."""
    return {"spec_verify_ct": steps, "accept_length": completion / steps if steps else 0.0, "system": system}


def answer(ask: Ask, model: str, text: str, finish: str, extra: dict) -> dict:
    """The whole answer (no streaming)."""
    if ask.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
        return {"id": f"chatcmpl-{ask.id}", "object": "chat.completion", "created": ask.created, "model": model,
                "choices": [choice], **extra}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": f"cmpl-{ask.id}", "object": "text_completion", "created": ask.created, "model": model,
            "choices": [choice], **extra}


def chunk(ask: Ask, model: str, text: str | None, finish: str | None, first: bool = False, extra: dict | None = None,
          choices: bool = True) -> dict:
    """One server-sent event's object (choices=False: the usage chunk, whose choices are empty)."""
    if ask.chat:
        delta = {"role": "assistant", "content": text or ""} if first else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        head = {"id": f"chatcmpl-{ask.id}", "object": "chat.completion.chunk"}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        head = {"id": f"cmpl-{ask.id}", "object": "text_completion"}
    return {**head, "created": ask.created, "model": model, "choices": [choice] if choices else [], **(extra or {})}
