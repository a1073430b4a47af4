"""`specpilot bench serve`: load on any OpenAI-compatible chat server, measured from the client's side.

Two modes, as `vllm bench serve` has them: a closed loop at a fixed concurrency C (C workers, each sending its
next request as soon as its previous one finished) and an open loop (Poisson arrivals at R requests/s from a
seeded generator, optionally capped at a maximum concurrency). Every request streams (SSE); per request we take
TTFT, the inter-token gaps, TPOT, the end-to-end latency, the token counts of the final `usage` chunk and, when
the server reports them, its speculation figures. A failed request (HTTP status >= 400, a connection error, a
timeout, a broken stream) is a row with its message, never the end of the run.

Torch-free: a client measuring a remote server needs none of the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from specpilot.datasets import load_requests
from specpilot.errors import UserError
from specpilot.results import provenance

PAPER_CONCURRENCY = (1, 8, 16, 24, 32)
PERCENTILES = (90, 99)  # and the median (p50), always


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str  # the user message


@dataclass(frozen=True)
class Target:
    """The server and what every request asks of it."""

    url: str  # base URL, without /v1
    model: str
    max_tokens: int = 256
    temperature: float = 0.0
    timeout: float = 600.0  # seconds per request, the whole stream included


@dataclass
class Outcome:
    """One request as the client saw it; times in seconds."""

    id: str
    start: float  # when it was sent, since the run's start
    error: str | None = None
    ttft: float | None = None
    e2el: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    accepted: int | None = None  # usage.completion_tokens_details.accepted_prediction_tokens
    rejected: int | None = None
    verify_ct: int | None = None  # meta_info.spec_verify_ct: target passes

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2el - ttft) / (completion_tokens - 1)."""
        if self.ttft is None or self.e2el is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.completion_tokens - 1)

    @property
    def accept_length(self) -> float | None:
        """Output tokens per target pass."""
        if not self.verify_ct or self.completion_tokens is None:
            return None
        return self.completion_tokens / self.verify_ct


# --- requests ----------------------------------------------------------------------------------------------------

def collect_prompts(datasets: Iterable[str], split: str, data_dir: str | None, limit: int | None) -> list[Prompt]:
    """Each request's first turn (mtbench's second turn would need the server's first answer), as `bench` picks
    the requests: per dataset, the split's requests in hash order, the first `limit`."""
    datasets = list(datasets)
    prompts = [Prompt(r.id, r.turns[0]) for name in datasets for r in load_requests(name, split, data_dir, limit)]
    if not prompts:
        raise UserError(f"no requests: the {split} split of {', '.join(datasets)} is empty")
    return prompts


def read_prompts(path: Path) -> list[Prompt]:
    """A JSONL file of {"prompt": "..."} (an optional "id" each), for prompts that are not a benchmark's."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path} line {n}: bad JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"]:
            raise UserError(f"{path} line {n}: expected an object with a non-empty string field 'prompt'")
        prompts.append(Prompt(str(record.get("id", f"{path.stem}/{len(prompts)}")), record["prompt"]))
    if not prompts:
        raise UserError(f"{path} holds no prompts")
    return prompts


def cycled(prompts: list[Prompt], n: int) -> list[Prompt]:
    """n requests from the set, in order, starting over when it runs out."""
    return [prompts[i % len(prompts)] for i in range(n)]


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Send times (seconds from the start) of a Poisson process at `rate`/s: the first at 0 (as vLLM sends it),
    then exponential gaps of mean 1/rate from random.Random(seed), so a seed gives the same schedule everywhere."""
    rng, at, times = random.Random(seed), 0.0, []
    for _ in range(n):
        times.append(at)
        at += rng.expovariate(rate)
    return times


# --- one request -------------------------------------------------------------------------------------------------

def normalize_url(url: str) -> str:
    """The server's base URL: http(s)://host[:port][/prefix], a trailing / or /v1 dropped."""
    parts = urlsplit(url.strip())
    try:
        parts.port  # noqa: B018 -- raises on a port that is not a number
    except ValueError:
        raise UserError(f"--url {url!r}: the port is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"--url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
    return url.strip().rstrip("/").removesuffix("/v1").rstrip("/")


def payload(target: Target, prompt: Prompt) -> dict:
    return {"model": target.model, "messages": [{"role": "user", "content": prompt.text}],
            "max_tokens": target.max_tokens, "temperature": target.temperature, "stream": True,
            "stream_options": {"include_usage": True}}


async def sse_events(lines) -> AsyncIterator[str]:
    """The data of each server-sent event (its `data:` lines joined); comments and other fields are skipped."""
    data: list[str] = []
    async for raw in lines:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


def _has_content(chunk: dict) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content"):
            return True
    return False


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _read_usage(chunk: dict, out: Outcome) -> None:
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        out.prompt_tokens = _int(usage.get("prompt_tokens"))
        out.completion_tokens = _int(usage.get("completion_tokens"))
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict):
            out.accepted = _int(details.get("accepted_prediction_tokens"))
            out.rejected = _int(details.get("rejected_prediction_tokens"))
    meta = chunk.get("meta_info")  # an extension (SGLang's name); OpenAI sends none
    if isinstance(meta, dict) and _int(meta.get("spec_verify_ct")):
        out.verify_ct = meta["spec_verify_ct"]


class StreamError(Exception):
    """The server's stream broke the protocol or carried an error object."""


async def _read_stream(resp: aiohttp.ClientResponse, out: Outcome, sent: float) -> None:
    last, chunks, done = None, 0, False
    async for data in sse_events(resp.content):
        if data.strip() == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError as exc:
            raise StreamError(f"bad JSON in the stream ({exc.msg})") from None
        if not isinstance(chunk, dict):
            raise StreamError("a stream chunk is not a JSON object")
        if chunk.get("error"):
            raise StreamError(f"error in the stream: {_message(chunk)}")
        now = time.perf_counter()
        if _has_content(chunk):
            if last is None:
                out.ttft = now - sent
            else:
                out.itl.append(now - last)
            last, chunks = now, chunks + 1
        _read_usage(chunk, out)
    out.e2el = time.perf_counter() - sent
    if not done:
        raise StreamError("the stream ended without [DONE]")
    if last is None:
        raise StreamError("the stream carried no content")
    if out.completion_tokens is None:  # no usage chunk: a content chunk is a token, as near as we can tell
        out.completion_tokens = chunks


def _message(body) -> str:
    """The message of an OpenAI error object ({"error": {"message": ...}}), else the body itself, shortened."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        text = inner.get("message", inner) if isinstance(inner, dict) else inner
    else:
        text = body
    text = " ".join(str(text).split())
    return text if len(text) <= 200 else text[:197] + "..."


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    text = await resp.text(errors="replace")
    try:
        return _message(json.loads(text))
    except json.JSONDecodeError:
        return _message(text) or resp.reason or ""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def send_one(session: aiohttp.ClientSession, target: Target, prompt: Prompt, zero: float) -> Outcome:
    """Stream one chat completion; every failure ends up in the outcome's error."""
    sent = time.perf_counter()
    out = Outcome(prompt.id, sent - zero)
    try:
        async with session.post(f"{target.url}/v1/chat/completions", json=payload(target, prompt),
                                timeout=aiohttp.ClientTimeout(total=target.timeout)) as resp:
            if resp.status >= 400:
                out.error = f"HTTP {resp.status}: {await _error_text(resp)}"
            else:
                await _read_stream(resp, out, sent)
    except (aiohttp.ClientError, OSError, TimeoutError, StreamError, ValueError) as exc:  # UnicodeDecodeError too
        out.error = _describe(exc)
    return out


# --- the two loops -----------------------------------------------------------------------------------------------

class InFlight:
    """Counts requests between send and answer, and the most at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    @contextlib.asynccontextmanager
    async def one(self):
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            yield
        finally:
            self.now -= 1


def _session() -> aiohttp.ClientSession:
    # limit=0: no pool cap, so the loops, not aiohttp's default of 100 connections, set the concurrency
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


async def closed_loop(target: Target, prompts: list[Prompt], concurrency: int,
                      on_done: Callable[[Outcome], None] = lambda _o: None) -> tuple[list[Outcome], float, int]:
    """C workers share one queue of requests; each sends its next as soon as its previous one is answered.
    Returns the outcomes, the seconds from start to the last answer, and the most requests in flight at once."""
    queue, outcomes, flight = iter(prompts), [], InFlight()  # one thread: the workers share the iterator safely

    async def worker(session: aiohttp.ClientSession) -> None:
        for prompt in queue:
            async with flight.one():
                out = await send_one(session, target, prompt, zero)
            outcomes.append(out)
            on_done(out)

    async with _session() as session:
        zero = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return outcomes, time.perf_counter() - zero, flight.peak


async def open_loop(target: Target, prompts: list[Prompt], rate: float, max_concurrency: int | None, seed: int,
                    on_done: Callable[[Outcome], None] = lambda _o: None) -> tuple[list[Outcome], float, int]:
    """Request i arrives at arrival_times(...)[i] whatever the server's state; past a cap of max_concurrency in
    flight it waits for a free place (then its TTFT starts when it is sent, as vLLM measures it)."""
    schedule, flight = arrival_times(len(prompts), rate, seed), InFlight()
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    async def one(session: aiohttp.ClientSession, prompt: Prompt, at: float) -> Outcome:
        await asyncio.sleep(max(0.0, zero + at - time.perf_counter()))
        async with gate, flight.one():
            out = await send_one(session, target, prompt, zero)
        on_done(out)
        return out

    async with _session() as session:
        zero = time.perf_counter()
        outcomes = await asyncio.gather(*(one(session, p, at) for p, at in zip(prompts, schedule, strict=True)))
        return list(outcomes), time.perf_counter() - zero, flight.peak


# --- figures -----------------------------------------------------------------------------------------------------

def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between the closest ranks, numpy's default
    ("linear", Hyndman and Fan's type 7): rank (n - 1) * q / 100 of the sorted values. None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    rank = (len(ordered) - 1) * q / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def _stats_ms(name: str, seconds: list[float]) -> dict:
    """mean, median, std (population, as numpy's and vLLM's) and the PERCENTILES of one metric, in ms."""
    ms = [1000 * s for s in seconds]
    stats = {f"mean_{name}_ms": statistics.fmean(ms) if ms else None,
             f"median_{name}_ms": percentile(ms, 50),
             f"std_{name}_ms": statistics.pstdev(ms) if ms else None}
    stats.update({f"p{q}_{name}_ms": percentile(ms, q) for q in PERCENTILES})
    return stats


def _total(values: Iterable[int | None]) -> int | None:
    """Their sum; None when no request reported one (a server without the figure is not a server with zero)."""
    given = [v for v in values if v is not None]
    return sum(given) if given else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def request_row(out: Outcome) -> dict:
    return {"id": out.id, "start_s": out.start, "ttft_ms": _ms(out.ttft), "tpot_ms": _ms(out.tpot),
            "e2el_ms": _ms(out.e2el), "input_tokens": out.prompt_tokens, "output_tokens": out.completion_tokens,
            "accept_length": out.accept_length, "error": out.error}


def summarize(outcomes: list[Outcome], duration: float, max_concurrency: int | None, rate: float | None,
              peak: int | None = None) -> dict:
    """One run's figures, named as `vllm bench serve` names them, then ours: the accept length (output tokens
    over target passes, of the requests whose server reported its passes), the speculation token counts, and a
    row per request."""
    ok = [o for o in outcomes if o.error is None]
    inputs = sum(o.prompt_tokens or 0 for o in ok)
    outputs = sum(o.completion_tokens or 0 for o in ok)
    per_s = (lambda n: n / duration) if duration > 0 else (lambda _n: None)
    verified = [o for o in ok if o.accept_length is not None]
    summary = {
        "duration": duration, "completed": len(ok), "failed": len(outcomes) - len(ok),
        "num_requests": len(outcomes), "total_input_tokens": inputs, "total_output_tokens": outputs,
        "request_throughput": per_s(len(ok)), "output_throughput": per_s(outputs),
        "total_token_throughput": per_s(inputs + outputs),
        "max_concurrency": max_concurrency, "request_rate": "inf" if rate is None else rate,
        "peak_concurrency": peak,  # measured at the client: most requests between send and answer
    }
    summary |= _stats_ms("ttft", [o.ttft for o in ok if o.ttft is not None])
    summary |= _stats_ms("tpot", [o.tpot for o in ok if o.tpot is not None])
    summary |= _stats_ms("itl", [gap for o in ok for gap in o.itl])
    summary |= _stats_ms("e2el", [o.e2el for o in ok if o.e2el is not None])
    summary |= {
        "accept_length": (sum(o.completion_tokens for o in verified) / sum(o.verify_ct for o in verified)
                          if verified else None),
        "accepted_prediction_tokens": _total(o.accepted for o in ok),
        "rejected_prediction_tokens": _total(o.rejected for o in ok),
        "errors": _error_counts(outcomes),
        "requests": [request_row(o) for o in outcomes],
    }
    return summary


def _error_counts(outcomes: list[Outcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.error is not None:
            counts[o.error] = counts.get(o.error, 0) + 1
    return counts


# --- a run, the server's models, the report ----------------------------------------------------------------------

@dataclass(frozen=True)
class Level:
    """One run: a closed loop at `concurrency`, or (rate set) an open loop capped at `concurrency` (None: no cap)."""

    concurrency: int | None
    rate: float | None = None

    @property
    def name(self) -> str:
        if self.rate is None:
            return f"concurrency {self.concurrency}"
        return f"rate {self.rate:g}/s" + (f", at most {self.concurrency} in flight" if self.concurrency else "")


def run_level(target: Target, prompts: list[Prompt], level: Level, seed: int = 0,
              on_done: Callable[[Outcome], None] = lambda _o: None) -> dict:
    """One run's summary (blocking: its own event loop)."""
    if level.rate is None:
        loop = closed_loop(target, prompts, level.concurrency, on_done)
    else:
        loop = open_loop(target, prompts, level.rate, level.concurrency, seed, on_done)
    outcomes, duration, peak = asyncio.run(loop)
    return summarize(outcomes, duration, level.concurrency, level.rate, peak)


async def _get_models(url: str, timeout: float) -> tuple[int, object]:
    async with aiohttp.ClientSession() as session, session.get(
            f"{url}/v1/models", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        text = await resp.text(errors="replace")
        try:
            return resp.status, json.loads(text)
        except json.JSONDecodeError:
            return resp.status, text


def server_models(url: str, timeout: float = 10.0) -> list[str] | None:
    """The ids GET /v1/models lists (None: the server has no such route); a server that cannot be reached, or
    that is not an OpenAI-compatible one, is a UserError before any load."""
    try:
        status, body = asyncio.run(_get_models(url, timeout))
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise UserError(f"cannot reach {url}: {_describe(exc)}") from None
    if status in (404, 405):
        return None
    if status >= 400:
        raise UserError(f"{url}/v1/models answered HTTP {status}: {_message(body)}")
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise UserError(f"{url}/v1/models did not answer an OpenAI model list; is {url} an OpenAI-compatible server?")
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def pick_model(url: str, model: str | None, timeout: float = 10.0) -> str:
    """--model, else the first model the server lists (checked to be reachable either way)."""
    models = server_models(url, timeout)
    if model is not None:
        return model
    if not models:
        raise UserError(f"{url} lists no model at /v1/models; name one with --model")
    return models[0]


def report(target: Target, setup: dict, runs: list[dict]) -> dict:
    """The result file: provenance (date, commit, command), the server and the request set, then a summary per
    run in the order they ran."""
    return {**provenance(), "bench": "serve", "url": target.url, "model": target.model,
            "max_tokens": target.max_tokens, "temperature": target.temperature, "timeout": target.timeout,
            **setup, "runs": runs}
