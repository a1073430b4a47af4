"""Lattice replay along AR's output: the chain walk reproduces the engine's own steps."""


from specpilot.bench.oracle import accept_lengths, lattice_taus, walk
from specpilot.runtime.engine import Engine
from tests.conftest import prompts


def test_walk_moves_by_what_each_step_commits():
    assert walk([2, 9, 1, 3, 1, 1, 1]) == [2, 1, 3, 1]
    assert walk([]) == []


def test_replayed_chain_equals_the_engine_and_the_oracle_bounds_it(looping_target, trained):
    drafter, _, _, tc, _ = trained
    engine = Engine(looping_target, drafter, context=96)
    seen_long_step = False
    for prompt in prompts(4, seed=2):  # prompts the drafter was trained on: it drafts them well
        ar = engine.generate_one(prompt, 30, (), "ar").tokens
        stock = engine.generate_one(prompt, 30, (), "stock")
        chain, oracle = accept_lengths(looping_target, drafter, prompt, ar, tc.block_size)
        assert all(1 <= c <= o <= tc.block_size for c, o in zip(chain, oracle, strict=True))
        replayed = walk(chain)
        # the engine's last step is cut by the budget; every earlier step must match exactly
        assert replayed[: len(stock.accepted) - 1] == stock.accepted[:-1]
        seen_long_step |= max(stock.accepted) > 1
        taus = lattice_taus(looping_target, drafter, prompt, ar, tc.block_size)
        assert taus["replay_chain_tau"] <= taus["oracle_tau"]
    assert seen_long_step  # the trained drafter is accepted, so the comparison has teeth
