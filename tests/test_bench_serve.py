"""`specpilot bench serve` against a fake OpenAI-compatible server run in this process (aiohttp.web in a thread):
timings against the server's known delays, the loops' concurrency and arrival schedule, failures, the accept
length, the percentile function, the JSON, and the command end to end."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.bench import serve_load as sl
from specpilot.errors import UserError
from tests.test_cli import assert_one_line_error, specpilot

MODEL = "fake-model"


@dataclass
class Behaviour:
    """What the fake server does; prompts containing FAIL500, FAIL429 or SLOW fail or stall on purpose."""

    first_delay: float = 0.0  # before the first token
    token_delay: float = 0.0  # before each further token
    tokens: int = 4
    verify_ct: int | None = 2  # meta_info.spec_verify_ct; None: no meta_info
    usage: bool = True  # the final usage chunk
    accepted: int = 3
    rejected: int = 1


@dataclass
class FakeServer:
    behaviour: Behaviour = field(default_factory=Behaviour)
    url: str = ""
    in_flight: int = 0
    peak: int = 0
    arrivals: list[float] = field(default_factory=list)  # perf_counter at each chat request's arrival
    bodies: list[dict] = field(default_factory=list)

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append(time.perf_counter())
        body = await request.json()
        self.bodies.append(body)
        prompt = body["messages"][0]["content"]
        if "FAIL500" in prompt:
            return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
        if "FAIL429" in prompt:
            return web.json_response({"error": {"message": "slow down"}}, status=429)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await self._stream(request, 1.0 if "SLOW" in prompt else 0.0)
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, stall: float) -> web.StreamResponse:
        b = self.behaviour
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(obj) -> None:
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
        await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})  # no content
        await asyncio.sleep(b.first_delay + stall)
        for i in range(b.tokens):
            if i:
                await asyncio.sleep(b.token_delay)
            await send({**base, "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]})
        await send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": None})
        final = {**base, "choices": []}
        if b.usage:
            final["usage"] = {"prompt_tokens": 7, "completion_tokens": b.tokens, "total_tokens": 7 + b.tokens,
                              "completion_tokens_details": {"accepted_prediction_tokens": b.accepted,
                                                            "rejected_prediction_tokens": b.rejected}}
        if b.verify_ct is not None:
            final["meta_info"] = {"spec_verify_ct": b.verify_ct}
        await send(final)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture
def server():
    """A FakeServer on 127.0.0.1 at a free port, served by its own event loop in a thread."""
    fake, loop, ready = FakeServer(), asyncio.new_event_loop(), threading.Event()
    app = web.Application()
    app.router.add_get("/v1/models", fake.models)
    app.router.add_post("/v1/chat/completions", fake.chat)
    runner = web.AppRunner(app)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    fake.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.SockSite(runner, sock).start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield fake
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def dead_url() -> str:
    """A port where nothing listens (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def prompts(n: int, *special: str) -> list[sl.Prompt]:
    return [sl.Prompt(f"p/{i}", f"question {i}") for i in range(n)] + [sl.Prompt(s, s) for s in special]


def target(url: str, **kw) -> sl.Target:
    return sl.Target(url, MODEL, **{"max_tokens": 16, "timeout": 10.0, **kw})


# --- one request's figures ---------------------------------------------------------------------------------------

def test_timings_follow_the_servers_delays(server):
    server.behaviour = Behaviour(first_delay=0.08, token_delay=0.04, tokens=5)
    outcomes, _, _ = asyncio.run(sl.closed_loop(target(server.url), prompts(2), 1))
    for o in outcomes:
        assert o.error is None
        assert 0.08 <= o.ttft < 0.08 + 0.15
        assert len(o.itl) == 4  # 5 content chunks; the empty first chunk and the usage chunk are no tokens
        assert all(0.03 <= gap < 0.04 + 0.1 for gap in o.itl)
        assert 0.035 <= o.tpot < 0.04 + 0.05  # (e2el - ttft) / 4
        assert o.e2el >= o.ttft + sum(o.itl) - 1e-6
        assert (o.prompt_tokens, o.completion_tokens, o.accepted, o.rejected) == (7, 5, 3, 1)
    summary = sl.summarize(outcomes, 1.0, 1, None)
    assert summary["mean_itl_ms"] == pytest.approx(1000 * np.mean([g for o in outcomes for g in o.itl]))
    assert 80 <= summary["median_ttft_ms"] < 230


def test_the_request_asks_for_a_stream_with_usage(server):
    outcomes, _, _ = asyncio.run(sl.closed_loop(target(server.url, max_tokens=9, temperature=0.5), prompts(1), 1))
    assert outcomes[0].error is None
    assert server.bodies == [{"model": MODEL, "messages": [{"role": "user", "content": "question 0"}],
                              "max_tokens": 9, "temperature": 0.5, "stream": True,
                              "stream_options": {"include_usage": True}}]


def test_accept_length_is_output_tokens_over_target_passes(server):
    server.behaviour = Behaviour(tokens=6, verify_ct=4, accepted=5, rejected=2)
    outcomes, _, _ = asyncio.run(sl.closed_loop(target(server.url), prompts(3), 2))
    assert [o.accept_length for o in outcomes] == [1.5, 1.5, 1.5]
    summary = sl.summarize(outcomes, 1.0, 2, None)
    assert summary["accept_length"] == 1.5
    assert (summary["accepted_prediction_tokens"], summary["rejected_prediction_tokens"]) == (15, 6)
    assert summary["total_output_tokens"] == 18 and summary["total_input_tokens"] == 21


def test_without_usage_or_meta_info_tokens_are_counted_and_no_accept_length(server):
    server.behaviour = Behaviour(tokens=3, usage=False, verify_ct=None)
    outcomes, _, _ = asyncio.run(sl.closed_loop(target(server.url), prompts(2), 1))
    assert [(o.completion_tokens, o.prompt_tokens, o.accept_length) for o in outcomes] == [(3, None, None)] * 2
    summary = sl.summarize(outcomes, 2.0, 1, None)
    assert summary["accept_length"] is None and summary["accepted_prediction_tokens"] is None
    assert summary["total_output_tokens"] == 6 and summary["output_throughput"] == 3.0


# --- the loops ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("concurrency", [1, 3])
def test_closed_loop_holds_exactly_c_requests_in_flight(server, concurrency):
    server.behaviour = Behaviour(first_delay=0.03, tokens=2)
    outcomes, duration, peak = asyncio.run(sl.closed_loop(target(server.url), prompts(9), concurrency))
    assert server.peak == concurrency and peak == concurrency  # reached, never passed
    assert sorted(o.id for o in outcomes) == sorted(p.id for p in prompts(9))
    assert duration >= 0.03 * 9 / concurrency


def test_open_loop_sends_on_the_seeded_schedule(server):
    rate, seed, n = 10.0, 7, 8
    outcomes, _, _ = asyncio.run(sl.open_loop(target(server.url), prompts(n), rate, None, seed))
    expected = sl.arrival_times(n, rate, seed)
    sent = sorted(o.start for o in outcomes)
    assert sent == pytest.approx(expected, abs=0.04)
    arrived = [t - server.arrivals[0] for t in sorted(server.arrivals)]
    assert arrived == pytest.approx(expected, abs=0.06)


def test_arrival_times_are_a_seeded_poisson_process():
    times = sl.arrival_times(4000, 4.0, seed=3)
    assert times == sl.arrival_times(4000, 4.0, seed=3) and times != sl.arrival_times(4000, 4.0, seed=4)
    gaps = np.diff(times)
    assert times[0] == 0 and (gaps > 0).all()
    assert gaps.mean() == pytest.approx(0.25, rel=0.06)  # exponential: mean 1/rate, std 1/rate
    assert gaps.std() == pytest.approx(0.25, rel=0.1)


def test_open_loop_cap_bounds_the_requests_in_flight(server):
    server.behaviour = Behaviour(first_delay=0.1, tokens=2)
    outcomes, _, peak = asyncio.run(sl.open_loop(target(server.url), prompts(6), 200.0, 2, 0))
    assert server.peak == 2 and peak == 2
    assert all(o.error is None for o in outcomes)


# --- failures ----------------------------------------------------------------------------------------------------

def test_failures_are_counted_and_the_run_goes_on(server):
    batch = prompts(4, "FAIL500", "FAIL429", "SLOW")
    outcomes, _, _ = asyncio.run(sl.closed_loop(target(server.url, timeout=0.3), batch, 2))
    errors = {o.id: o.error for o in outcomes if o.error}
    assert errors == {"FAIL500": "HTTP 500: boom", "FAIL429": "HTTP 429: slow down", "SLOW": "timed out"}
    summary = sl.summarize(outcomes, 1.0, 2, None)
    assert (summary["completed"], summary["failed"], summary["num_requests"]) == (4, 3, 7)
    assert summary["errors"] == {"HTTP 500: boom": 1, "HTTP 429: slow down": 1, "timed out": 1}
    assert summary["total_output_tokens"] == 16  # the 4 answered, 4 tokens each; failures add nothing
    rows = {r["id"]: r for r in summary["requests"]}
    assert rows["FAIL500"]["error"] == "HTTP 500: boom" and rows["FAIL500"]["ttft_ms"] is None


def test_a_dead_server_fails_every_request_without_raising():
    outcomes, _, _ = asyncio.run(sl.closed_loop(target(dead_url()), prompts(3), 2))
    assert len(outcomes) == 3
    assert all(o.error and "connect" in o.error.lower() for o in outcomes)
    summary = sl.summarize(outcomes, 0.1, 2, None)
    assert (summary["completed"], summary["failed"], summary["mean_ttft_ms"]) == (0, 3, None)


@pytest.mark.parametrize(("events", "error"), [
    ([b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'], "the stream ended without [DONE]"),
    ([b"data: {not json\n\n", b"data: [DONE]\n\n"], "bad JSON in the stream"),
    ([b'data: {"error": {"message": "overloaded"}}\n\n'], "error in the stream: overloaded"),
    ([b"data: [DONE]\n\n"], "the stream carried no content"),
])
def test_a_broken_stream_is_a_failed_request(events, error):
    async def fake_stream():
        for event in events:
            for line in event.splitlines(keepends=True):
                yield line

    class Resp:
        content = fake_stream()

    out = sl.Outcome("x", 0.0)
    with pytest.raises(sl.StreamError, match=error.replace("[", r"\[").replace("]", r"\]")):
        asyncio.run(sl._read_stream(Resp(), out, time.perf_counter()))


def test_sse_events_join_data_lines_and_skip_comments():
    async def collect(raw: bytes) -> list[str]:
        async def lines():
            for line in raw.splitlines(keepends=True):
                yield line
        return [e async for e in sl.sse_events(lines())]

    raw = b": keep-alive\r\n\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nevent: x\ndata:[DONE]\n"
    assert asyncio.run(collect(raw)) == ['{"a":\n1}', "[DONE]"]


# --- figures -----------------------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_is_numpys_linear_percentile(values, q):
    assert sl.percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-9, abs=1e-6)


def test_percentile_edges():
    assert sl.percentile([], 50) is None
    assert sl.percentile([3.0], 99) == 3.0
    assert sl.percentile([1, 2, 3, 4], 50) == 2.5 and sl.percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    with pytest.raises(ValueError):
        sl.percentile([1.0], 101)


def test_summary_statistics_match_numpy():
    outcomes = [sl.Outcome(f"r{i}", 0.0, ttft=t, e2el=t + 1, completion_tokens=11)
                for i, t in enumerate([0.1, 0.2, 0.4, 0.8, 1.6])]
    s = sl.summarize(outcomes, 4.0, 5, None)
    ttft_ms = np.array([100, 200, 400, 800, 1600])
    assert s["mean_ttft_ms"] == pytest.approx(ttft_ms.mean())
    assert s["std_ttft_ms"] == pytest.approx(ttft_ms.std())  # population, as numpy and vLLM
    assert s["median_ttft_ms"] == pytest.approx(400) and s["p90_ttft_ms"] == pytest.approx(1280)
    assert s["p99_ttft_ms"] == pytest.approx(np.percentile(ttft_ms, 99))
    assert s["mean_tpot_ms"] == pytest.approx(100)  # 1 s over 10 tokens after the first
    assert s["request_throughput"] == 1.25 and s["request_rate"] == "inf"
    assert sl.summarize(outcomes, 4.0, None, 2.5)["request_rate"] == 2.5


# --- the command -------------------------------------------------------------------------------------------------

VLLM_KEYS = {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
             "output_throughput", "total_token_throughput", "max_concurrency", "request_rate",
             *(f"{stat}_{metric}_ms" for stat in ("mean", "median", "std", "p90", "p99")
               for metric in ("ttft", "tpot", "itl", "e2el"))}


def test_cli_closed_loop_writes_the_json(server, tmp_path):
    server.behaviour = Behaviour(first_delay=0.02, tokens=4, verify_ct=2)
    out = tmp_path / "serve.json"
    proc = specpilot("bench", "serve", "--url", server.url + "/v1/", "--dataset", "builtin", "--limit", "2",
                     "--concurrency", "1,2", "--max-tokens", "16", "--json", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["model"] == MODEL and report["url"] == server.url  # asked /v1/models; /v1/ dropped
    assert {"date", "commit", "command", "python"} <= report.keys() and "bench serve" in report["command"]
    assert report["datasets"] == ["builtin"] and report["split"] == "dev" and report["num_prompts"] == 2
    assert [r["max_concurrency"] for r in report["runs"]] == [1, 2]
    for run in report["runs"]:
        assert VLLM_KEYS <= run.keys()
        assert (run["completed"], run["failed"], run["total_output_tokens"]) == (2, 0, 8)
        assert run["accept_length"] == 2.0 and run["request_rate"] == "inf"
        assert [r["output_tokens"] for r in run["requests"]] == [4, 4]
        assert all(r["id"].startswith("builtin/") and r["error"] is None for r in run["requests"])
    assert server.peak == 2 and len(server.bodies) == 4
    assert server.bodies[0]["max_tokens"] == 16 and server.bodies[0]["temperature"] == 0.0
    assert "concurrency 2" in proc.stdout and "concurrency 1: 2 done, 0 failed" in proc.stderr


def test_cli_open_loop_from_a_prompts_file(server, tmp_path):
    file = tmp_path / "prompts.jsonl"
    file.write_text('{"prompt": "hello"}\n{"prompt": "FAIL500"}\n\n{"prompt": "bye", "id": "last"}\n')
    out = tmp_path / "open.json"
    proc = specpilot("bench", "serve", "--url", server.url, "--model", "m", "--prompts", file, "--rate", "50,100",
                     "--max-concurrency", "1", "--num-requests", "5", "--json", out)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [(r["request_rate"], r["max_concurrency"], r["completed"], r["failed"]) for r in runs] == \
        [(50.0, 1, 3, 2), (100.0, 1, 3, 2)]  # 5 requests cycle through 3 prompts: the FAIL500 one twice
    assert [r["id"] for r in runs[0]["requests"]] == ["prompts/0", "prompts/1", "last", "prompts/0", "prompts/1"]
    assert runs[0]["errors"] == {"HTTP 500: boom": 2}
    assert {b["model"] for b in server.bodies} == {"m"} and server.peak == 1


def test_cli_nothing_listening_is_one_line(tmp_path):
    out = tmp_path / "x.json"
    proc = specpilot("bench", "serve", "--url", dead_url(), "--concurrency", "1", "--json", out)
    assert_one_line_error(proc, "cannot reach http://127.0.0.1:")
    assert not out.exists()


@pytest.mark.parametrize(("args", "needles"), [
    (["--url", "localhost:8000"], ["--url", "http://HOST:PORT"]),
    (["--url", "http://x", "--concurrency", "0"], ["--concurrency", "'0'"]),
    (["--url", "http://x", "--concurrency", "1,a"], ["--concurrency"]),
    (["--url", "http://x", "--rate", "-2"], ["--rate", "'-2'"]),
    (["--url", "http://x", "--rate", "2", "--concurrency", "4"], ["not both"]),
    (["--url", "http://x", "--max-concurrency", "4"], ["--max-concurrency", "--rate"]),
    (["--url", "http://x", "--max-tokens", "0"], ["--max-tokens"]),
    (["--url", "http://x", "--timeout", "0"], ["--timeout"]),
    (["--url", "http://x", "--dataset", "trivia"], ["unknown dataset", "trivia"]),
    (["--url", "http://x", "--json", "/nonexistent/dir/out.json"], ["cannot write", "does not exist"]),
])
def test_cli_mistakes_are_one_line(args, needles):
    assert_one_line_error(specpilot("bench", "serve", *args), *needles)


def test_bench_options_before_serve_are_refused():
    assert_one_line_error(specpilot("bench", "--limit", "2", "serve", "--url", "http://x"), "--limit",
                          "bench serve")


def test_bench_help_lists_serve_and_keeps_its_options():
    proc = specpilot("bench", "--help")
    assert proc.returncode == 0
    assert "serve" in proc.stdout and "--preset" in proc.stdout and "--in-flight" in proc.stdout
    top = specpilot("--help").stdout
    assert top.index("bench") < top.index("generate")  # still the first command listed


def test_normalize_url():
    assert sl.normalize_url("http://h:1/v1/") == "http://h:1"
    assert sl.normalize_url(" https://h/prefix/ ") == "https://h/prefix"
    with pytest.raises(UserError, match="port"):
        sl.normalize_url("http://h:port")


def test_server_models_and_pick(server):
    assert sl.server_models(server.url) == [MODEL]
    assert sl.pick_model(server.url, None) == MODEL and sl.pick_model(server.url, "other") == "other"
    assert [p.id for p in sl.cycled(prompts(3), 7)] == ["p/0", "p/1", "p/2", "p/0", "p/1", "p/2", "p/0"]
