"""Two-level verification (`verify=tlv`, speculative/two_level.py) on the CPU, in float32 with BF16-valued
weights (so W12 holds them exactly and AR is an exact reference): outputs equal AR's for a chain and for trees,
more tokens per exact pass than stock; a Q pass over wrong weights changes how much is accepted, never what;
the joined tree's shape; the 8-bit pass beside BF16 exact weights."""

import pytest
import torch

from specpilot.config import parse_system
from specpilot.core.contracts import Verdict, chain
from specpilot.errors import UserError
from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config
from specpilot.kernels.fewrow import FewRowWeight
from specpilot.runtime.engine import Engine
from specpilot.w12.attach import projections
from specpilot.w12.format import encode

PROMPT = [5, 6, 7, 8, 9, 10]


@pytest.fixture(scope="module")
def pair():
    cfg = tiny_target_config()
    target = random_target(cfg, seed=0)
    for _, dw in projections(target):  # BF16 values in float32: AR stays exact, W12 holds them
        dw.weight.data = dw.weight.data.bfloat16().float()
    return target, random_drafter(tiny_drafter_config(cfg), seed=1)


def run(target, drafter, system: str, new: int = 40):
    return Engine(target, drafter, parse_system(system), context=256).generate_one(PROMPT, new)


@pytest.mark.parametrize("tree", ["", ",tree=best_first,nodes=12", ",tree=ddtree,nodes=6"])
def test_two_level_outputs_are_ars(pair, tree):
    target, drafter = pair
    ar = run(target, drafter, "ar")
    stock = run(target, drafter, "stock" + tree.replace(",", ":", 1))
    tlv = run(target, drafter, "stock:weights=w12,verify=tlv" + tree)
    assert tlv.tokens == ar.tokens == stock.tokens
    per_pass = sum(tlv.accepted) / len(tlv.accepted)
    assert per_pass > 1.5 * sum(stock.accepted) / len(stock.accepted)  # the Q pass's next token is kept mostly
    assert max(tlv.accepted) <= 2 * 8  # at most both rounds' paths


def test_a_wrong_q_pass_changes_how_much_is_accepted_not_what(pair):
    """The 8-bit view replaced by another model's weights: every Q-pass guess is suspect, the outputs are AR's."""
    target, drafter = pair
    ar = run(target, drafter, "ar")
    kept = {}
    g = torch.Generator().manual_seed(7)
    for name, dw in projections(target):
        kept[name] = dw.w12
        dw.w12 = FewRowWeight.of_w12(encode((torch.randn(dw.weight.shape, generator=g) * 0.1).bfloat16()))
    try:
        tlv = run(target, drafter, "stock:weights=w12,verify=tlv")
    finally:
        for name, dw in projections(target):
            dw.w12 = kept[name]
    assert tlv.tokens == ar.tokens
    assert sum(tlv.accepted) / len(tlv.accepted) < 1.3  # the wrong guesses were refused, not committed


def test_tlv_with_bf16_exact_weights(pair):
    """verify=tlv alone: W12 forms are made for the 8-bit pass, the exact passes read the BF16 weights."""
    target, drafter = pair
    engine = Engine(target, drafter, parse_system("stock:verify=tlv"), context=256)
    assert engine.w12_report is not None and engine.plan.weights == "bf16"
    assert engine.generate_one(PROMPT, 40).tokens == run(target, drafter, "ar").tokens


def test_the_second_round_hangs_below_the_q_path(pair):
    engine = Engine(*pair, parse_system("stock:weights=w12,verify=tlv"), context=256)
    step, block = engine.spec, engine.block
    engine.pos.fill_(10)
    index = torch.arange(block)
    first = chain(torch.tensor([1]), torch.arange(2, 1 + block)[None], torch.tensor([10]), index, (index - 1)[None])
    q = Verdict(accepted=torch.tensor([2]), path=index[None], tokens=torch.arange(100, 100 + block)[None])
    second = chain(q.bonus, torch.arange(50, 49 + block)[None], torch.tensor([13]), index, (index - 1)[None])
    both = step.join(first, q, second)
    seen = both.visibility.tree[0]
    assert both.rows == 2 * block and both.longest == 2 * block and not both.chain
    assert int(both.parents[0, block]) == 2 and both.tokens[0, block] == q.bonus[0]  # under the Q path's last row
    assert seen[block, :3].all() and not seen[block, 3:block].any()  # it sees the Q path, not the rest
    assert seen[block + 3, block:block + 4].all() and not seen[block + 3, block + 4:].any()
    assert not seen[:block, block:].any()  # the first round does not see the second
    assert both.slots[0].tolist() == list(range(10, 10 + 2 * block))
    assert both.positions[0, block:].tolist() == list(range(13, 13 + block))


@pytest.mark.parametrize("system, needle", [
    ("stock:verify=tlv", "verify=tlv reads the projections' W12 forms"),
    ("ar:weights=w12", "weights=w12 reads the projections' W12 forms"),
    ("stock:weights=w12,verify=tlv", "weights=w12 and verify=tlv read"),
])
def test_w12_and_tlv_are_refused_on_a_model_without_bf16_weights(system, needle):
    """`tiny` on the CPU is float32 with values BF16 does not hold (as the CPU's SmolLM2): no projection gets a W12
    form, so tlv's 8-bit pass and weights=w12 would silently run the exact weights. One line, exit 2; in BF16 the
    same tiny runs them (a float32 model of BF16 values too: the tests above)."""
    from tests.test_cli import assert_one_line_error, specpilot

    proc = specpilot("generate", "hi", "--preset", "tiny", "-s", system, "--max-new-tokens", "4")
    assert_one_line_error(proc, needle, "float32 values that BF16 does not hold", "silently run the exact weights",
                          "bfloat16")
    target = random_target(tiny_target_config(), seed=3)  # float32: the engine itself refuses, whoever calls it
    with pytest.raises(UserError, match="this model has none"):
        Engine(target, random_drafter(tiny_drafter_config(target.cfg), seed=1), parse_system(system), context=64)
    bf16 = random_target(tiny_target_config(), seed=3, dtype=torch.bfloat16)
    engine = Engine(bf16, random_drafter(tiny_drafter_config(bf16.cfg), seed=1, dtype=torch.bfloat16),
                    parse_system(system), context=64)
    assert engine.w12_report["w12_bytes"] > 0
