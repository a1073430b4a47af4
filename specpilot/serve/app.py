"""`specpilot serve`: an OpenAI-compatible HTTP server (aiohttp) over one engine of many slots.

Routes: POST /v1/completions and /v1/chat/completions (server-sent events when `stream`), GET /v1/models,
/health and /metrics. The event loop parses, streams and answers; the engine steps in a process of its own
(serve/worker.py). Every error is OpenAI's JSON with a 4xx or 5xx status, never a traceback. SIGTERM (or SIGINT)
drains: new requests get 503, those in flight finish (up to `drain_s`), then the server exits.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from dataclasses import dataclass

from aiohttp import web

from specpilot.core.contracts import Prompted
from specpilot.errors import UserError
from specpilot.serve.metrics import Metrics
from specpilot.serve.protocol import ApiError, Ask, answer, chunk, meta_info, parse, usage
from specpilot.serve.text import Detokenizer
from specpilot.serve.worker import Full, Gone, Job

POLL_S = 0.25  # how often a request waiting on the engine looks whether its client is still there


@dataclass
class Served:
    """What one server serves: the model's id, its system, tokenizer, and the engine's context (tokens of a slot),
    rows (a step's rows a request) and whether it speculates."""

    model: str
    system: str
    tokenizer: object
    context: int
    rows: int
    speculative: bool
    in_flight: int


class Server:
    """worker: serve/worker's EngineProcess or EngineWorker over the served engine, not started yet."""

    def __init__(self, served: Served, worker, drain_s: float = 60.0):
        self.served, self.drain_s = served, drain_s
        self.worker = worker
        worker.on_done, worker.on_first = self._done, self._first
        self.metrics = Metrics(self.worker.stats, served.model)
        self.room = served.context - served.rows  # prompt + answer, beside a step's draft rows
        self.drafts = max(served.rows - 1, 0) if served.speculative else 0
        self.draining = False
        self.app = web.Application(client_max_size=8 * 2**20)
        self.app.add_routes([web.post("/v1/completions", self.completions),
                             web.post("/v1/chat/completions", self.chat),
                             web.get("/v1/models", self.models), web.get("/health", self.health),
                             web.get("/metrics", self.scrape)])

    # ----- routes -------------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def models(self, request: web.Request) -> web.Response:
        s = self.served
        card = {"id": s.model, "object": "model", "created": 0, "owned_by": "specpilot", "system": s.system,
                "max_model_len": self.room}
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        return web.json_response({"status": "ok"})

    async def scrape(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.text(), content_type="text/plain", charset="utf-8")

    # ----- a request ----------------------------------------------------------------------------------
    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            if self.draining:
                raise ApiError(503, "the server is shutting down", kind="server_error", code="shutting_down")
            ask = parse(await _json(request), chat, self.served.model, self.served.tokenizer, self.room)
            job = Job(Prompted(ask.prompt, ask.max_tokens, tuple(self.served.tokenizer.eos_ids), ask.sampling),
                      asyncio.get_running_loop())
            try:
                self.worker.submit(job)
            except Full:
                raise ApiError(503, "too many requests are waiting; retry shortly", kind="server_error",
                               code="overloaded") from None
            except Gone as exc:
                raise ApiError(503, str(exc), kind="server_error", code="engine_gone") from None
        except ApiError as exc:
            self.metrics.requests.labels("refused").inc()
            headers = {"Retry-After": "1"} if exc.status == 503 else None
            return web.json_response(exc.body(), status=exc.status, headers=headers)
        self.metrics.prompt_tokens.inc(len(ask.prompt))
        run = _Run(self, request, ask, job)
        try:
            return await (run.stream() if ask.stream else run.whole())
        finally:
            if not run.ended:  # the client left, or the handler failed: the slot is freed at once
                self.worker.cancel(job)
            self.metrics.requests.labels(run.outcome).inc()

    def _first(self, job: Job) -> None:
        """A job's first token (on the engine thread): its time to first token, whether or not it finishes."""
        self.metrics.ttft.observe(job.first - job.submitted)

    def _done(self, job: Job) -> None:
        """A finished job's figures (on the engine thread)."""
        passes = len(job.generation.accepted)
        if passes:
            self.metrics.accept.observe((len(job.generation.tokens) - 1) / passes)
        self.metrics.output_tokens.inc(len(job.generation.tokens))

    # ----- running --------------------------------------------------------------------------------------
    async def run(self, host: str, port: int, ready=None) -> None:
        """Serves until SIGTERM/SIGINT, then drains. ready(url): called once the socket listens."""
        self.worker.start()
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            self.worker.stop()
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        bound = site._server.sockets[0].getsockname()[1]  # the port the OS gave where port was 0
        if ready is not None:
            ready(f"http://{host}:{bound}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        self.draining = True
        deadline = time.monotonic() + self.drain_s
        while self.worker.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await runner.cleanup()  # handlers still writing their last bytes are waited for
        self.worker.stop()


class _Run:
    """One request's answer, whole or streamed, from the engine's updates."""

    def __init__(self, server: Server, request: web.Request, ask: Ask, job: Job):
        self.server, self.request, self.ask, self.job = server, request, ask, job
        self.text = Detokenizer(server.served.tokenizer, ask.stop)
        self.tokens = self.passes = 0
        self.ended = False  # the engine finished it (or it was given up by a stop string, cancelled already)
        self.outcome = "disconnected"
        self._held = _NOTHING  # an update taken while merging (the final one, an error), for the next _next

    async def _next(self):
        """The job's next update, or _GONE where its client is gone (looked at every POLL_S while waiting). One
        already queued is taken at once: a task and a timer per token cost the event loop, and so the engine's
        thread its GIL, more than the step of a small model (AR at 16 in flight streamed a third of the API's
        tokens a second on an H100, 2026-12-06)."""
        if self._held is not _NOTHING:
            update, self._held = self._held, _NOTHING
            return update
        try:
            return self.job.updates.get_nowait()
        except asyncio.QueueEmpty:
            pass
        get = asyncio.ensure_future(self.job.updates.get())
        while True:
            done, _ = await asyncio.wait({get}, timeout=POLL_S)
            if done:
                return get.result()
            transport = self.request.transport
            if transport is None or transport.is_closing():
                get.cancel()
                return _GONE

    async def _pieces(self):
        """(text, finish reason or None) as the tokens come; the last one carries the finish reason."""
        while True:
            update = await self._next()
            if update is _GONE:
                return
            if isinstance(update, Exception):
                self.ended, self.outcome = True, "failed"
                raise ApiError(400 if isinstance(update, UserError) else 500, str(update),
                               kind="invalid_request_error" if isinstance(update, UserError) else "server_error")
            last = update is None
            if not last:
                update = self._merged(update)
            piece = self.text.add([] if last else update, last)
            if self.text.stopped and not last:  # a stop string: the engine need not go on
                self.server.worker.cancel(self.job)
                self.ended = True
                yield piece, "stop"
                return
            if last:
                self.ended = True
                yield piece, self._finish()
                return
            if piece:
                yield piece, None

    def _merged(self, update: list[int]) -> list[int]:
        """This step's tokens and those of the steps queued behind it (a reader that fell behind sends one piece
        for them, not one each), counted; a final update or an error behind them is kept for _next."""
        tokens, steps = list(update), 1
        while True:
            try:
                more = self.job.updates.get_nowait()
            except asyncio.QueueEmpty:
                break
            if more is None or isinstance(more, Exception):
                self._held = more
                break
            tokens += more
            steps += 1
        self.tokens += len(tokens)
        self.passes += steps
        return tokens

    def _finish(self) -> str:
        tokens = self.job.generation.tokens if self.job.generation else []
        stopped = self.text.stopped or (tokens and tokens[-1] in self.server.served.tokenizer.eos_ids)
        return "stop" if stopped else "length"

    def _extra(self) -> dict:
        steps = max(self.passes - 1, 0)  # the first update is the prefill's token
        return {"usage": usage(self.ask, self.tokens, steps, steps * self.server.drafts),
                "meta_info": meta_info(self.tokens, steps, self.server.served.system)}

    async def whole(self) -> web.StreamResponse:
        parts, finish = [], None
        try:
            async for piece, why in self._pieces():
                parts.append(piece)
                finish = why
        except ApiError as exc:
            return web.json_response(exc.body(), status=exc.status)
        if finish is None:
            return web.Response(status=499)  # the client is gone: nobody reads this
        self.outcome = "ok"
        body = answer(self.ask, self.server.served.model, "".join(parts), finish, self._extra())
        return web.json_response(body)

    async def stream(self) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(self.request)
        model, ask = self.server.served.model, self.ask
        try:
            if ask.chat:  # the role first, as OpenAI's chat streams begin
                await _event(response, chunk(ask, model, "", None, first=True))
            async for piece, finish in self._pieces():
                await _event(response, chunk(ask, model, piece, finish))
                if finish is not None:
                    extra = self._extra()
                    if ask.include_usage:
                        await _event(response, chunk(ask, model, None, None, extra=extra, choices=False))
                    self.outcome = "ok"
            if self.outcome == "ok":
                await response.write(b"data: [DONE]\n\n")
        except ApiError as exc:
            await _event(response, exc.body())
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, ConnectionError):
            return response  # the client left mid-stream: the caller frees its slot
        return response


_GONE = object()
_NOTHING = object()  # no update held back


async def _event(response: web.StreamResponse, obj: dict) -> None:
    await response.write(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")


async def _json(request: web.Request):
    raw = await request.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc.msg} at character {exc.pos}") from None


def serve(served: Served, worker, host: str, port: int, drain_s: float = 60.0) -> None:
    """Runs the server until SIGTERM/SIGINT (prints the URL it listens at, on stdout, once ready)."""
    server = Server(served, worker, drain_s)

    def ready(url: str) -> None:
        print(f"serving {served.model} ({served.system}, {served.in_flight} in flight) at {url}", flush=True)

    asyncio.run(server.run(host, port, ready))
    print("drained, stopped", file=sys.stderr, flush=True)
