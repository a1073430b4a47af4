"""`specpilot serve --preset tiny` as a user runs it (a subprocess), driven by the real `openai` client: each answer
is the single-request engine's answer for that prompt (greedy and sampled), streams equal whole answers, bad
input gets OpenAI's error JSON with a 4xx, a client that leaves frees its slot, SIGTERM drains, /metrics parses."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

IN_FLIGHT = 4


def start(*args: str) -> tuple[subprocess.Popen, str]:
    """A server on a free port; (its process, its URL) once it listens."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "specpilot.cli", "serve", "--preset", "tiny", "--port", "0",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()  # "serving tiny (stock, 4 in flight) at http://127.0.0.1:PORT"
    if " at http" not in line:
        proc.kill()
        raise AssertionError(f"the server did not start: {line!r} {proc.stderr.read()}")
    return proc, line.split(" at ")[1].strip()


@pytest.fixture(scope="module")
def server():
    proc, url = start("--max-in-flight", str(IN_FLIGHT))
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


@pytest.fixture(scope="module")
def alone():
    """The tiny deployment's single-request engines (stock and AR) and tokenizer, in this process."""
    from specpilot.config import parse_system
    from specpilot.deployment import load_deployment
    from specpilot.runtime.engine import Engine
    from specpilot.runtime.pair import build_pair

    dep = load_deployment("tiny")
    target, drafter, tok = build_pair(dep)
    return {"stock": Engine(target, drafter, parse_system("stock"), context=dep.context),
            "ar": Engine(target, drafter, parse_system("ar"), context=dep.context), "tok": tok}


def _client(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def _expected(alone, prompt: list[int], n: int, sampling=None, system: str = "stock") -> str:
    tok = alone["tok"]
    gen = alone[system].generate_one(prompt, n, tok.eos_ids, sampling=sampling)
    tokens = gen.tokens[:-1] if gen.tokens and gen.tokens[-1] in tok.eos_ids else gen.tokens
    return tok.decode(tokens)


def _chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_completions_and_chat_answer_as_the_engine_alone_streamed_or_whole(server, alone):
    client, tok = _client(server), alone["tok"]
    got = client.completions.create(model="tiny", prompt="Once upon", max_tokens=24, temperature=0)
    assert got.choices[0].text == _expected(alone, tok.encode("Once upon"), 24)
    assert got.usage.prompt_tokens == len(tok.encode("Once upon")) and got.usage.completion_tokens >= 1
    details = got.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 0 and details.rejected_prediction_tokens > 0  # stock drafts
    chat = client.chat.completions.create(model="tiny", messages=_chat("Hi there"), max_tokens=20, temperature=0)
    want = _expected(alone, tok.chat_prompt(_chat("Hi there")), 20)
    assert chat.choices[0].message.content == want and chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason in ("stop", "length")
    meta = chat.model_extra["meta_info"]
    assert meta["spec_verify_ct"] >= 1 and meta["accept_length"] >= 1.0 and meta["system"] == "stock"
    stream = client.chat.completions.create(model="tiny", messages=_chat("Hi there"), max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == chat.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens  # the usage chunk comes last


def test_a_seed_gives_the_same_sampled_text_twice_and_it_is_ar_sampling(server, alone):
    from specpilot.core.contracts import Sampling

    client, tok = _client(server), alone["tok"]
    texts = [client.completions.create(model="tiny", prompt="Roll", max_tokens=30, temperature=0.9, top_p=0.95,
                                       seed=11).choices[0].text for _ in range(2)]
    other = client.completions.create(model="tiny", prompt="Roll", max_tokens=30, temperature=0.9, top_p=0.95,
                                      seed=12).choices[0].text
    assert texts[0] == texts[1] != other
    assert texts[0] == _expected(alone, tok.encode("Roll"), 30, Sampling(0.9, 0.95, 0, 11), system="ar")


def _post(url: str, body: bytes, path: str = "/v1/chat/completions") -> tuple[int, dict, dict]:
    req = urllib.request.Request(url + path, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


LONG = "x" * 600  # past the tiny deployment's context
BAD = [  # (body, status, the parameter named, the code)
    (b'{"messages": [', 400, None, None),
    (b"\xff\xfe{}", 400, None, None),
    (b"[1, 2]", 400, None, None),
    (json.dumps({"model": "gpt-9", "messages": _chat("x")}).encode(), 404, "model", "model_not_found"),
    (json.dumps({"messages": _chat(LONG)}).encode(), 400, "messages", "context_length_exceeded"),
    (json.dumps({"messages": _chat("x"), "max_tokens": 0}).encode(), 400, "max_tokens", None),
    (json.dumps({"messages": _chat("x"), "max_tokens": 10_000}).encode(), 400, "max_tokens",
     "context_length_exceeded"),
    (json.dumps({"messages": _chat("x"), "temperature": 3}).encode(), 400, "temperature", None),
    (json.dumps({"messages": _chat("x"), "top_p": 0}).encode(), 400, "top_p", None),
    (json.dumps({"messages": _chat("x"), "top_k": -5}).encode(), 400, "top_k", None),
    (json.dumps({"messages": _chat("x"), "seed": "seven"}).encode(), 400, "seed", None),
    (json.dumps({"messages": _chat("x"), "n": 2}).encode(), 400, "n", "unsupported"),
    (json.dumps({"messages": []}).encode(), 400, "messages", None),
    (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), 400, "messages[0].role", None),
    (json.dumps({"messages": _chat("x"), "stop": 5}).encode(), 400, "stop", None),
]


@pytest.mark.parametrize("body,status,param,code", BAD)
def test_bad_input_gets_openais_error_json(server, body, status, param, code):
    got, reply, _ = _post(server, body)
    assert got == status, reply
    assert set(reply["error"]) == {"message", "type", "param", "code"} and reply["error"]["message"]
    assert (reply["error"]["param"], reply["error"]["code"]) == (param, code)


def test_64_concurrent_clients_each_get_their_own_answer(server, alone):
    tok = alone["tok"]
    prompts = [f"question {i}: {'ab' * (i % 7)}" for i in range(64)]
    budgets = [8 + i % 13 for i in range(64)]

    async def one(client, i: int) -> str:  # every other client streams
        reply = await client.chat.completions.create(model="tiny", messages=_chat(prompts[i]), max_tokens=budgets[i],
                                                     temperature=0, stream=i % 2 == 0)
        if isinstance(reply, openai.AsyncStream):
            return "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])
        return reply.choices[0].message.content

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0) as client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    got = asyncio.run(run())
    want = [_expected(alone, tok.chat_prompt(_chat(p)), n) for p, n in zip(prompts, budgets, strict=True)]
    assert got == want


def _metrics(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name + json.dumps(s.labels, sort_keys=True) if s.labels and "outcome" in s.labels else s.name): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_client_that_leaves_mid_stream_frees_its_slot_and_metrics_parse(server):
    import httpx

    before = _metrics(server)
    body = {"model": "tiny", "prompt": "tell me everything", "max_tokens": 480, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", server + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # the first event, then the client hangs up
    deadline = time.time() + 10
    while time.time() < deadline:  # the handler counts the disconnect; the engine's thread frees the slot after it
        m = _metrics(server)
        gone = m.get('specpilot_requests_total{"outcome": "disconnected"}', 0.0)
        if (gone > before.get('specpilot_requests_total{"outcome": "disconnected"}', 0.0)
                and m["specpilot_requests_in_flight"] == 0):
            break
        time.sleep(0.1)
    assert gone == before.get('specpilot_requests_total{"outcome": "disconnected"}', 0.0) + 1
    assert m["specpilot_requests_in_flight"] == 0 and m["specpilot_queue_depth"] == 0
    assert m["specpilot_output_tokens_total"] - before.get("specpilot_output_tokens_total", 0) < 480  # cut short
    assert m["specpilot_time_to_first_token_seconds_count"] >= 1 and m["specpilot_mean_accept_length"] >= 1.0
    ok = _client(server).completions.create(model="tiny", prompt="again", max_tokens=4, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")  # the server serves on


def test_sigterm_drains_requests_in_flight_and_a_full_queue_gets_503():
    import httpx

    proc, url = start("--max-in-flight", "2", "--max-waiting", "1")
    try:
        body = {"model": "tiny", "prompt": "drain me", "max_tokens": 300, "temperature": 0, "stream": True}

        async def one(http, i):
            async with http.stream("POST", url + "/v1/completions", json={**body, "prompt": f"drain {i}"}) as r:
                if r.status_code != 200:
                    return r.status_code, r.headers.get("retry-after"), None
                events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
                return 200, None, events

        async def run():
            async with httpx.AsyncClient(timeout=60) as http:
                tasks = [asyncio.create_task(one(http, i)) for i in range(6)]
                await asyncio.sleep(0.3)
                proc.send_signal(signal.SIGTERM)
                return await asyncio.gather(*tasks)

        results = asyncio.run(run())
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    served = [events for status, _, events in results if status == 200]
    refused = [(status, retry) for status, retry, _ in results if status != 200]
    assert len(served) + len(refused) == 6 and served
    assert all(status == 503 and retry == "1" for status, retry in refused) and refused  # 2 in flight, 1 waits
    for events in served:  # every request taken finished whole before the server stopped
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.slow  # three CLI processes, 13 s on two cores
def test_the_server_refuses_to_start_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "specpilot.cli", "serve", "--deployment", str(tmp_path / "no.toml")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0 and "error" in run.stderr
    run = subprocess.run([sys.executable, "-m", "specpilot.cli", "serve", "--max-in-flight", "0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--max-in-flight" in run.stderr
    import socket

    with socket.socket() as taken:  # a port something else listens at
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        run = subprocess.run([sys.executable, "-m", "specpilot.cli", "serve", "--port", str(taken.getsockname()[1])],
                             capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "cannot listen on 127.0.0.1" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow  # three load runs through the CLI, 8 s on two cores
def test_bench_serve_loads_this_server_closed_loop_and_open_loop(server, tmp_path):
    runs = []
    for mode in (["--concurrency", "1,4"], ["--rate", "50"]):
        out = tmp_path / "load.json"
        run = subprocess.run([sys.executable, "-m", "specpilot.cli", "bench", "serve", "--url", server, *mode,
                              "--max-tokens", "8", "--json", str(out)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        runs += json.loads(out.read_text())["runs"]
    assert [r["max_concurrency"] for r in runs[:2]] == [1, 4] and runs[2]["request_rate"] == 50
    for r in runs:
        assert r["failed"] == 0 and r["completed"] == r["num_requests"] > 0
        assert r["accept_length"] >= 1.0 and r["mean_ttft_ms"] > 0  # the server's meta_info was read
    assert runs[0]["peak_concurrency"] == 1 and runs[1]["peak_concurrency"] <= 4


def test_a_request_the_engine_refuses_is_answered_alone_and_the_others_go_on(alone):
    """Past the server's checks (serve/protocol.py) the engine may still refuse a request (serve/worker.py):
    that request gets its error, the others in flight their own answers."""
    from specpilot.config import parse_system
    from specpilot.core.contracts import Prompted
    from specpilot.deployment import load_deployment
    from specpilot.errors import UserError
    from specpilot.runtime.engine import Engine
    from specpilot.runtime.pair import build_pair
    from specpilot.serve.worker import EngineWorker, Job

    dep = load_deployment("tiny")
    target, drafter, tok = build_pair(dep)
    worker = EngineWorker(Engine(target, drafter, parse_system("stock"), context=dep.context, slots=2), 2, 8)
    prompts = [tok.encode(p) for p in ("one", "two", "three")]

    async def run():
        loop = asyncio.get_running_loop()
        jobs = [Job(Prompted(p, 12, tuple(tok.eos_ids)), loop) for p in prompts]
        jobs.insert(1, Job(Prompted(prompts[0], dep.context, ()), loop))  # does not fit the context
        for job in jobs:
            worker.submit(job)
        answers = []
        for job in jobs:
            out = []
            while (item := await job.updates.get()) is not None:
                if isinstance(item, Exception):
                    out = item
                    break
                out += item
            answers.append(out)
        return answers

    worker.start()
    try:
        answers = asyncio.run(run())
    finally:
        worker.stop()
    assert isinstance(answers[1], UserError) and "does not fit" in str(answers[1])
    for got, p in zip([answers[0], *answers[2:]], prompts, strict=True):
        want = alone["stock"].generate_one(p, 12, tok.eos_ids).tokens
        assert got == want


def test_an_engine_failure_answers_the_requests_in_flight_and_the_worker_serves_on(alone):
    from specpilot.config import parse_system
    from specpilot.core.contracts import Prompted
    from specpilot.deployment import load_deployment
    from specpilot.runtime.engine import Engine
    from specpilot.runtime.pair import build_pair
    from specpilot.serve.worker import EngineWorker, Job

    dep = load_deployment("tiny")
    target, drafter, tok = build_pair(dep)
    worker = EngineWorker(Engine(target, drafter, parse_system("stock"), context=dep.context, slots=2), 2, 8)
    real, calls = worker.batcher.step, []

    def failing_once():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return real()

    worker.batcher.step = failing_once

    async def answer(job):
        out = []
        while (item := await job.updates.get()) is not None:
            if isinstance(item, Exception):
                return item
            out += item
        return out

    async def run():
        loop = asyncio.get_running_loop()
        first = [Job(Prompted(tok.encode(p), 40, ()), loop) for p in ("a", "b")]
        for job in first:
            worker.submit(job)
        failed = [await answer(job) for job in first]
        later = Job(Prompted(tok.encode("c"), 12, tuple(tok.eos_ids)), loop)
        worker.submit(later)
        return failed, await answer(later)

    worker.start()
    try:
        failed, later = asyncio.run(run())
    finally:
        worker.stop()
    assert all(isinstance(f, RuntimeError) and "boom" in str(f) for f in failed)
    assert later == alone["stock"].generate_one(tok.encode("c"), 12, tok.eos_ids).tokens


def test_a_reader_behind_the_engine_gets_the_queued_steps_in_one_piece_counted_as_steps():
    """Steps queued behind the one a handler takes are merged into its piece (one SSE chunk, not one a step); the
    tokens and steps still count each, and the final update behind them still ends the answer."""
    import asyncio
    from types import SimpleNamespace

    from specpilot.serve.app import _Run
    from specpilot.serve.protocol import Ask

    class Bytes:
        eos_ids = (0,)

        @staticmethod
        def decode(tokens):
            return bytes(tokens).decode("utf-8", "replace")

    async def go():
        updates = asyncio.Queue()
        for u in ([104], [105, 32], [116], None):  # the prefill's token, two steps, the end
            updates.put_nowait(u)
        job = SimpleNamespace(updates=updates, generation=SimpleNamespace(tokens=[104, 105, 32, 116]))
        server = SimpleNamespace(served=SimpleNamespace(tokenizer=Bytes()))
        run = _Run(server, SimpleNamespace(transport=None), Ask(False, [1], 8, None), job)
        return [p async for p in run._pieces()], run

    pieces, run = asyncio.run(go())
    assert pieces == [("hi t", None), ("", "length")] and run.tokens == 4 and run.passes == 3 and run.ended


@pytest.mark.slow  # a CLI process and its engine's, 6 s on two cores
def test_an_engine_that_cannot_load_stops_the_server_in_one_line(tmp_path):
    """The engine is built in its own process: a checkpoint it cannot find is still one line and exit code 2."""
    dep = tmp_path / "gone.toml"
    dep.write_text('name = "gone"\ncontext = 256\ntokenizer = "bytes"\n[target]\npath = "' + str(tmp_path / "none")
                   + '"\n')
    run = subprocess.run([sys.executable, "-m", "specpilot.cli", "serve", "--deployment", str(dep), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "checkpoint folder not found" in run.stderr and "Traceback" not in run.stderr
    assert "serving" not in run.stdout


def test_when_the_engine_process_dies_requests_are_answered_and_later_ones_get_503():
    proc, url = start("--max-in-flight", "2")
    try:
        children = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
        engine = [c for c in children if "spawn_main" in open(f"/proc/{c}/cmdline").read()]
        assert len(engine) == 1, children  # the engine runs apart from the HTTP server (beside: the resource tracker)
        os.kill(int(engine[0]), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            body = json.dumps({"model": "tiny", "prompt": "after", "max_tokens": 4}).encode()
            req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=30)
            except urllib.error.HTTPError as exc:
                status, answer = exc.code, json.loads(exc.read())
                break
            assert time.monotonic() < deadline, "the server never saw its engine go"
            time.sleep(0.1)
        assert status in (500, 503) and "engine process exited" in answer["error"]["message"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
