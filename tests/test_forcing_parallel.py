"""Forcing's outputs made by worker processes (forcing/parallel.py) give the same report as made in this process."""

import pytest

from specpilot.bench.datasets import load_requests
from specpilot.bench.harness import Runner
from specpilot.deployment import load_deployment
from specpilot.forcing.parallel import pool_for
from specpilot.forcing.run import force
from specpilot.models.pair import build_pair


@pytest.mark.slow
def test_workers_give_the_same_report_as_this_process():
    dep = load_deployment("tiny")
    target, drafter, tok = build_pair(dep)
    runner = Runner(target, drafter, tok, dep.context)
    requests = load_requests("builtin", "dev", None, 3)
    here = force(runner, "stock", "stock:block_size=2", requests, 12)
    with pool_for(2, "tiny", None, ["stock", "stock:block_size=2", "ar"], requests) as procs:
        turns = []
        there = force(Runner(target, drafter, tok, dep.context), "stock", "stock:block_size=2", requests, 12,
                      progress=lambda: turns.append(1), generate=procs.generate)
    assert there["systems"] == here["systems"] and there["verdict"] == here["verdict"]
    assert there["systems"]["candidate"]["tokens"] > 0 and len(turns) == 3 * len(requests)
    assert pool_for(1, "tiny", None, ["stock"], requests) is None
