"""A timing worker: one process per system, running from that system's source tree.

The controller starts this file as a script (from the controller's own install) with PYTHONPATH set
to the system's worktree, so `specpilot` is imported from there; the worker reports the hash of the
code it actually imported, then serves one JSON command per line on stdin:
  {"run": [request ids]} -> {"rows": [{"id", "tokens", "decode_s", "prefill_s", "steps"}, ...]}
  {"quit": true}
Models are built and graphs captured (warm-up) before the first reply, so no timing includes them; the
first reply also carries the system's complete configuration (every option, the kernel plan and the tuning
table it chose), which the evidence card records.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def code_hash(package_dir: Path) -> str:
    """sha256 over every file of the package (relative path + bytes, in path order): the Python sources and
    everything they load at run time (the cluster attention's CUDA source, the presets), byte-compiled
    caches excepted."""
    h = hashlib.sha256()
    for path in sorted(p for p in package_dir.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        h.update(str(path.relative_to(package_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    import specpilot
    from specpilot.bench.datasets import load_requests
    from specpilot.bench.harness import Runner
    from specpilot.config.env import parse
    from specpilot.deployment import load_deployment
    from specpilot.models.pair import build_pair
    from specpilot.results import system_record

    spec = json.loads(sys.argv[1])
    hello = {"code_hash": code_hash(Path(specpilot.__file__).parent), "package": specpilot.__file__}
    dep = load_deployment(spec.get("preset"), spec.get("deployment"))
    system = parse(spec["system"])
    requests = {r.id: r for d in spec["datasets"]
                for r in load_requests(d, spec.get("split", "dev"), spec.get("data_dir"), spec.get("limit"))}
    target, drafter, tok = build_pair(dep, with_drafter=system.base == "stock")
    runner = Runner(target, drafter, tok, dep.context)
    runner.warmup(system)
    _reply({**hello, "requests": sorted(requests), "config": system_record(runner.engine(system))})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        rows = []
        for rid in cmd["run"]:
            for rec in runner.run(system, requests[rid], spec["max_new_tokens"]):
                rows.append({"id": rec.id, "tokens": rec.tokens, "decode_s": rec.decode_s, "prefill_s": rec.prefill_s,
                             "steps": len(rec.accepted)})
        _reply({"rows": rows})


if __name__ == "__main__":
    main()
