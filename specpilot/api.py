"""The Python API: a deployment loaded once, then chats answered in batches or streamed.

    import specpilot
    llm = specpilot.load("smollm2")                      # a preset, a deployment file, or a loop's best.toml
    print(llm.generate(["What is 7 * 6?"], max_new_tokens=64)[0])
    for piece in llm.stream("Name three primes.", temperature=0.7, seed=1):
        print(piece, end="", flush=True)

Greedy by default; temperature > 0 samples (top_p, top_k, seed), losslessly: the same seed gives AR's own sampled
answer whatever the system (kernels/sample). The system is the deployment's own (a loop's best.toml names the one
it proved), else stock where there is a drafter, else AR.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from specpilot.config import parse_system
from specpilot.core.contracts import Prompted, Sampling
from specpilot.deployment import Deployment, list_presets, load_deployment
from specpilot.errors import UserError
from specpilot.serve.text import Detokenizer


def load(name: str | Path, system: str | None = None, in_flight: int | None = None) -> LLM:
    """name: a preset (`specpilot presets`) or a deployment TOML file; system: another system to serve (its
    `base:key=value` name); in_flight: requests a batch serves at once (default: the deployment's)."""
    path = Path(name)
    dep = load_deployment(None, path) if path.suffix == ".toml" or path.is_file() else load_deployment(str(name))
    return LLM(dep, system, in_flight)


class LLM:
    """A deployment's target (+ drafter), tokenizer and one engine of its system."""

    def __init__(self, dep: Deployment, system: str | None = None, in_flight: int | None = None):
        from specpilot.runtime.engine import Engine
        from specpilot.runtime.pair import build_pair

        self.deployment = dep
        name = system or dep.system or ("stock" if dep.drafter is not None else "ar")
        self.system = parse_system(name)
        if self.system.speculative and dep.drafter is None:
            raise UserError(f"deployment {dep.name} has no drafter, so it cannot serve {self.system.name}")
        slots = in_flight or dep.in_flight
        if slots < 1:
            raise UserError(f"in_flight must be at least 1, got {slots}")
        self.target, self.drafter, self.tokenizer = build_pair(dep, with_drafter=self.system.speculative)
        self.engine = Engine(self.target, self.drafter, self.system, context=dep.context, slots=slots)
        self.engine.warmup()

    def _request(self, prompt: str, max_new_tokens: int | None, temperature: float, top_p: float, top_k: int,
                 seed: int) -> Prompted:
        ids = self.tokenizer.chat_prompt([{"role": "user", "content": prompt}])
        budget = max_new_tokens or self.deployment.max_new_tokens
        try:
            sampling = Sampling(temperature, top_p, top_k, seed) if temperature else None
        except ValueError as exc:
            raise UserError(str(exc)) from None
        return Prompted(ids, budget, tuple(self.tokenizer.eos_ids), sampling)

    def generate(self, prompts: list[str], max_new_tokens: int | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0) -> list[str]:
        """Each prompt's answer (one user turn each), all served together (in_flight at a time); request i
        samples with seed + i."""
        reqs = [self._request(p, max_new_tokens, temperature, top_p, top_k, seed + i) for i, p in enumerate(prompts)]
        return [self.tokenizer.decode(_text_tokens(g.tokens, r)) for g, r in zip(self.engine.generate(reqs), reqs,
                                                                                 strict=True)]

    def stream(self, prompt: str, max_new_tokens: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int = 0) -> Iterator[str]:
        """The answer in pieces as the engine commits them (a piece per target pass)."""
        if self.engine.slots > 1:
            raise UserError("stream() serves one request at a time: load the deployment with in_flight=1")
        req = self._request(prompt, max_new_tokens, temperature, top_p, top_k, seed)
        self.engine.sample_as([req])
        self.engine.sampler.set(0, req.sampling)
        steps = self.engine.steps(req.prompt, req.max_new_tokens, req.stop_ids, tokens=True)
        text, taken = Detokenizer(self.tokenizer), 0  # never half a character (serve/text.py)
        while True:
            try:
                tokens, last = next(steps), False
            except StopIteration as done:  # the last pass (one that met a stop token is not yielded)
                tokens, last = done.value.tokens, True
            kept = _text_tokens(req.cut(tokens), req)
            piece = text.add(kept[taken:], last)
            taken = len(kept)
            if piece:
                yield piece
            if last:
                return


def _text_tokens(tokens: list[int], req: Prompted) -> list[int]:
    """The answer without its stop token."""
    return tokens[:-1] if tokens and tokens[-1] in req.stop_ids else tokens


def presets() -> list[str]:
    """The presets load() knows by name."""
    return list_presets()
