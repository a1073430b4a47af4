"""The one typed configuration: the option registry, systems, kernel plans, environment overrides at the edge,
diagnostics refused where outputs matter, and the records that name the complete configuration."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specpilot.cli import app
from specpilot.config import OPTIONS, KernelPlan, parse_system
from specpilot.config.options import PLAN_GROUPS
from specpilot.config.plan import NOT_OPTIONS
from specpilot.errors import UserError

PACKAGE = Path(__file__).resolve().parents[1] / "specpilot"


def _python_files(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.rglob("*.py")) if "__pycache__" not in p.parts]


def _reads_environment(tree: ast.AST) -> list[str]:
    """Every os.environ / os.getenv / environ use in a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
            found.append(f"line {node.lineno}: .{node.attr}")
        if isinstance(node, ast.Name) and node.id in ("environ", "getenv"):
            found.append(f"line {node.lineno}: {node.id}")
        if isinstance(node, ast.ImportFrom) and node.module == "os" and any(a.name in ("environ", "getenv")
                                                                            for a in node.names):
            found.append(f"line {node.lineno}: from os import")
    return found


def test_no_kernel_module_reads_the_environment():
    offenders = {str(p.relative_to(PACKAGE)): hits for p in _python_files(PACKAGE / "kernels")
                 if (hits := _reads_environment(ast.parse(p.read_text())))}
    assert not offenders, offenders
    # The check itself finds a read where there is one.
    assert sorted(_reads_environment(ast.parse("import os\nx = os.environ.get('A')\ny = os.getenv('B')"))) == [
        "line 2: .environ", "line 3: .getenv"]


def _variables_read(tree: ast.AST) -> set[str]:
    """The names of the environment variables a module reads by constant: os.environ.get("X"), os.environ["X"]."""
    names = set()
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target, arg = node.func.value, node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript):
            target, arg = node.value, node.slice
        if isinstance(target, ast.Attribute) and target.attr == "environ" and isinstance(arg, ast.Constant):
            names.add(arg.value)
    return names


def test_the_package_reads_no_option_from_the_environment_but_the_override():
    """Outside config/env.py (SPECPILOT_OPTIONS, an override) the package reads only paths and provenance."""
    allowed = {"config/env.py": {"SPECPILOT_OPTIONS"}, "models/smollm2.py": {"SPECPILOT_MODELS"},
               "datasets.py": {"SPECPILOT_DATA_DIR"}, "results.py": {"SPECPILOT_COMMIT"},
               "controller/compare.py": set(),
               # the stand-in agents' switches (test fixtures: which cheat to play, where the sealed file lies)
               "fixtures/agents/clis.py": {"SPECPILOT_STANDIN"},
               "fixtures/agents/standin.py": {"SPECPILOT_SEALED_FILE"}}
    for path in _python_files(PACKAGE):
        rel = str(path.relative_to(PACKAGE))
        read = {n for n in _variables_read(ast.parse(path.read_text())) if n.startswith("SPECPILOT_")}
        assert read <= allowed.get(rel, set()), (rel, read)
    assert _variables_read(ast.parse("import os\nos.environ.get('A', '1')\nos.environ['B']")) == {"A", "B"}


def _plan_attributes_read() -> set[str]:
    """Every attribute of a kernel plan the engine's code reads (`plan.gemv`, `self.plan.tune_rounds`, ...)."""
    seen = set()
    for folder in ("kernels", "models", "weights", "runtime", "speculative", "training"):
        for path in _python_files(PACKAGE / folder):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Attribute):
                    continue
                owner = node.value
                name = getattr(owner, "id", None) or getattr(owner, "attr", "")
                if name in ("plan", "drafter_plan"):
                    seen.add(node.attr)
    return seen


def test_options_json_lists_every_knob_the_kernels_and_the_engine_use():
    result = CliRunner().invoke(app, ["options", "--json"])
    assert result.exit_code == 0, result.output
    listed = {o["name"]: o for o in json.loads(result.output)["options"]}
    assert set(listed) == set(OPTIONS)
    assert all(listed[n]["default"] == OPTIONS[n].default and listed[n]["help"] for n in listed)
    fields = {f.name for f in dataclasses.fields(KernelPlan)} - set(NOT_OPTIONS)
    assert fields == {o.name for o in OPTIONS.values() if o.group in PLAN_GROUPS}  # the plan is the options
    methods = {n for n in dir(KernelPlan) if not n.startswith("_")} - fields
    read = _plan_attributes_read() - methods - set(NOT_OPTIONS)
    assert read <= fields and {"gemv", "ahead", "l2", "tune_rounds", "cluster"} <= read  # each is an option
    used = set()
    for path in _python_files(PACKAGE):
        if path.relative_to(PACKAGE).parts[:2] != ("fixtures", "agents"):  # the stand-ins' edits: text for other trees
            used |= set(re.findall(r"system\.get\(\"(\w+)\"\)", path.read_text()))
    assert used and used <= set(OPTIONS)
    assert {"graphs", "lookahead", "pad_us", "fault", "block_size"} <= used  # the engine reads its own


def test_options_table_and_system_help_name_every_option():
    out = CliRunner().invoke(app, ["options"]).output
    assert all(name in out for name in OPTIONS)
    import typer

    commands = typer.main.get_command(app).commands
    for command, param in (("bench", "system"), ("generate", "system"), ("force", "candidate"), ("compare", "a")):
        text = next(p.help for p in commands[command].params if p.name == param)
        assert "Bases: ar, stock" in text and "specpilot/config/options.py" in text, command
        assert all(f"{o.name}=" in text for o in OPTIONS.values() if o.group != "diagnostic"), command
        assert "SPECPILOT_OPTIONS" in text and "attn_ablate" not in text
    shown = CliRunner().invoke(app, ["generate", "--help"], terminal_width=200).output
    assert "Bases: ar, stock" in " ".join(shown.replace("│", " ").split())  # wherever the panel wraps it


def test_a_system_records_every_option_and_its_plan():
    system = parse_system("stock:gemv=true,l2=weights_kv,block_size=4")
    record = system.to_json()
    assert record["system"] == "stock:block_size=4,gemv=true,l2=weights_kv"
    assert set(record["options"]) == set(OPTIONS) and record["options"]["pdl"] == "auto"
    assert record["changed"] == ["block_size", "gemv", "l2"]
    plan = system.plan()
    assert plan.gemv and plan.l2 == "weights_kv" and plan.ahead and len(plan.table) == 0
    assert set(plan.to_json()) == {o.name for o in OPTIONS.values() if o.group in PLAN_GROUPS} | {"tuning"}
    with pytest.raises(UserError, match="does not apply"):  # no option outside the base's
        parse_system("ar:block_size=0")
    assert parse_system("stock:block_size=0,gemv=false") == parse_system("stock")  # defaults are dropped
    stock_only = {"block_size", "tree", "nodes", "tree_k", "tree_accept", "verify", "hybrid_tree", "batch_rows",
                  "batch_budget", "admit"}
    assert {o.name for o in OPTIONS.values() if o.bases == ("stock",)} == stock_only
    assert set(parse_system("ar").to_json()["options"]) == set(OPTIONS) - stock_only


def test_plans_are_per_engine_and_equal_plans_share_one_tuning():
    from specpilot.bench.harness import Runner
    from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config

    target = random_target(tiny_target_config(vocab=64, num_layers=2), seed=0)
    drafter = random_drafter(tiny_drafter_config(target.cfg, block_size=4), seed=1)
    runner = Runner(target, drafter, None, context=64)
    plans = {name: runner.engine(parse_system(name)).plan
             for name in ("ar:gemv=true", "stock:gemv=true", "ar:gemv=true,l2=off", "ar")}
    assert plans["ar:gemv=true"] is plans["stock:gemv=true"]  # one tuning for one set of kernels
    assert plans["ar:gemv=true,l2=off"] is not plans["ar:gemv=true"] and plans["ar"].gemv is False
    a, b = plans["ar:gemv=true"], plans["ar:gemv=true,l2=off"]
    a.table.chosen[("gemv", 1)] = {"BLOCK_N": 8}
    assert b.table.config(("gemv", 1)) is None  # one engine's tuning does not leak into another's
    assert a.but(gemv=False).table is a.table  # the drafter's view of a plan shares its table


def test_a_runner_keeps_at_most_max_engines_least_recently_used_first():
    from specpilot.bench.harness import Runner
    from specpilot.fixtures.random_models import random_drafter, random_target, tiny_drafter_config, tiny_target_config

    target = random_target(tiny_target_config(vocab=64, num_layers=2), seed=0)
    drafter = random_drafter(tiny_drafter_config(target.cfg, block_size=4), seed=1)
    runner = Runner(target, drafter, None, context=64, max_engines=2)
    stock, ar, tree = (parse_system(n) for n in ("stock", "ar", "stock:nodes=4"))
    first = runner.engine(stock)
    runner.engine(ar)
    assert runner.engine(stock) is first  # used again: now the most recent
    runner.engine(tree)  # a third: the least recently used (ar) goes
    assert set(runner._engines) == {"stock", "stock:nodes=4"} and runner.engine(stock) is first
    assert runner.engine(ar) is not None and len(runner._engines) == 2


def test_two_plans_tune_apart_and_the_kernel_reads_its_own(monkeypatch):
    """Two engines' plans in one process: each tuning fills its own table, and a kernel launched under a plan
    runs that plan's choice."""
    import specpilot.kernels.gemv.triton as gemv_mod
    from specpilot.kernels.gemv.triton import gemv_triton
    from specpilot.kernels.tuning import candidates
    from specpilot.kernels.tuning.descent import tune_step

    launched = []

    class Spy:
        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append((kw.get("BLOCK_N"), kw.get("BLOCK_K"), kw.get("AHEAD")))

    monkeypatch.setattr(gemv_mod, "_STREAM", Spy())
    monkeypatch.setattr(gemv_mod, "_STREAM_TUNED", Spy())  # the first, untuned run
    x, w = torch.randn(1, 64), torch.randn(32, 64)
    fast = {True: 2, False: 5}  # the fastest candidate differs with loading ahead on or off
    for ahead in (True, False):
        plan = KernelPlan.stock(gemv=True, kernels="triton", ahead=ahead, tune_rounds=1)

        def step(plan=plan):
            gemv_triton(x, w, plan=plan)

        def measure(_, plan=plan, ahead=ahead):
            (key,) = plan.table.record(step)
            cfg = {k: v for k, v in plan.table.config(key).items() if k != "AHEAD"}
            return abs(candidates.GEMV.index(cfg) - fast[ahead]) if cfg in candidates.GEMV else 9.0

        tune_step(step, measure, plan)
        (key,) = plan.table.record(step)
        want = candidates.GEMV[fast[ahead]]
        assert plan.table.config(key) == want
        launched.clear()
        step()
        fits = gemv_mod.ahead_fits(want["BLOCK_N"], want, False, KernelPlan.stock())
        assert launched == [(want["BLOCK_N"], want["BLOCK_K"], ahead and fits)]


def test_diagnostics_are_refused_where_outputs_matter():
    with pytest.raises(UserError, match="diagnostic"):
        parse_system("ar:gemv=true,attn_ablate=no_kv")
    system = parse_system("ar:gemv=true,attn_ablate=no_kv", diagnostics=True)
    assert system.diagnostic() and system.plan().attn_ablate == "no_kv"
    runner = CliRunner()
    for args in (["bench", "--system", "ar:attn_ablate=no_kv"],
                 ["generate", "hi", "--system", "ar:attn_ablate=relaxed"],
                 ["force", "--candidate", "stock:attn_ablate=no_merge"], ["compare", "--b", "ar:attn_ablate=no_kv"]):
        result = runner.invoke(app, args, standalone_mode=False)
        assert isinstance(result.exception, UserError) and "diagnostic" in str(result.exception), args


def test_environment_override_applies_at_the_edge_and_is_recorded(monkeypatch):
    from specpilot.config.env import parse
    from specpilot.results import environment

    monkeypatch.setenv("SPECPILOT_OPTIONS", "pad_us=5,block_size=4")
    ar, stock = parse("ar"), parse("stock:gemv=true")
    assert ar.get("pad_us") == 5.0 and ar.get("block_size") == 0  # block_size does not apply to ar
    assert stock.name == "stock:block_size=4,gemv=true,pad_us=5.0" and stock.to_json()["env_overrides"] == [
        "block_size", "pad_us"]
    assert parse_system("ar").get("pad_us") == 0.0  # parse_system itself never reads the environment
    assert environment()["env_overrides"] == {"SPECPILOT_OPTIONS": "pad_us=5,block_size=4"}
    for bad in ("warp=9", "pad_us=-1", "attn_ablate=no_kv"):
        monkeypatch.setenv("SPECPILOT_OPTIONS", bad)
        with pytest.raises(UserError):
            parse("ar")
    monkeypatch.delenv("SPECPILOT_OPTIONS")
    assert environment()["env_overrides"] == {}


def test_an_override_records_only_what_the_run_reads(monkeypatch):
    """tree_k acts only with tree=eagle2, block_size only on stock: an override naming them elsewhere is listed as
    ignored, never as an option the result ran under."""
    from specpilot.config.env import parse

    monkeypatch.setenv("SPECPILOT_OPTIONS", "tree_k=8,pad_us=5,block_size=4")
    stock = parse("stock")
    assert stock.name == "stock:block_size=4,pad_us=5.0" and stock.get("tree_k") == 4
    assert stock.to_json()["env_overrides"] == ["block_size", "pad_us"] and stock.to_json()["env_ignored"] == [
        "tree_k"]
    ar = parse("ar").to_json()
    assert ar["env_overrides"] == ["pad_us"] and ar["env_ignored"] == ["block_size", "tree_k"]
    eagle = parse("stock:tree=eagle2").to_json()
    assert eagle["env_overrides"] == ["block_size", "pad_us", "tree_k"] and eagle["env_ignored"] == []
    monkeypatch.setenv("SPECPILOT_OPTIONS", "tree=chain")  # drops the system's own eagle2 option
    chain = parse("stock:tree=eagle2,tree_k=8").to_json()
    assert chain["system"] == "stock" and chain["env_overrides"] == ["tree"] and chain["env_ignored"] == ["tree_k"]
    monkeypatch.setenv("SPECPILOT_OPTIONS", "tree_k=4")  # at its default, still unread by a chain
    assert parse("stock").to_json()["env_overrides"] == [] and parse("stock").to_json()["env_ignored"] == ["tree_k"]


def test_generate_honours_every_option(monkeypatch):
    """The issue's case: `ar:pad_us=200000` used to run as fast as plain `ar` (the option was dropped)."""
    import specpilot.runtime.engine as engine_mod

    built = []
    real = engine_mod.Engine

    class Recording(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(engine_mod, "Engine", Recording)
    runner = CliRunner()
    slow = runner.invoke(app, ["generate", "Hello", "--system", "ar:pad_us=100000", "--max-new-tokens", "4"])
    assert slow.exit_code == 0, slow.output
    ms = float(re.search(r"decode ([\d.]+) ms", slow.output).group(1))
    assert ms >= 3 * 100.0  # three decode steps, each with its 100 ms pad
    name = "stock:block_size=4,fault=logit_bias,lookahead=2"
    assert runner.invoke(app, ["generate", "Hello", "--system", name, "--max-new-tokens", "4"]).exit_code == 0
    assert built[-1].system.name == name and built[-1].block == 4 and built[-1].fault == "logit_bias"
    assert built[-1].lookahead == 2


def test_generate_prints_the_text_as_decoded(monkeypatch):
    """Piped output is the model's text unchanged: no wrapping at 80 columns, no rich markup eaten."""
    import specpilot.models.tokenizer as tokenizer

    text = "[bold]not markup[/bold] " + "x" * 150
    monkeypatch.setattr(tokenizer.ByteTokenizer, "decode", lambda self, ids: text)
    result = CliRunner().invoke(app, ["generate", "Hello", "--system", "ar", "--max-new-tokens", "3"])
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == text


def test_code_hash_covers_every_package_file(tmp_path):
    from specpilot.controller.worker import code_hash

    copy = tmp_path / "specpilot"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    first = code_hash(copy)
    (copy / "__pycache__").mkdir(exist_ok=True)
    (copy / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"compiled")
    assert code_hash(copy) == first  # byte-compiled caches do not count
    for rel in ("kernels/attention/cluster.cu", "presets/tiny.toml", "config/options.py"):
        path = copy / rel
        original = path.read_bytes()
        path.write_bytes(original + b"\n// changed\n")
        assert code_hash(copy) != first, rel
        path.write_bytes(original)
        assert code_hash(copy) == first


def test_the_controller_times_two_systems_that_differ_only_in_a_kernel_knob():
    from specpilot.controller.compare import Side, compare, source_tree

    spec = {"preset": "tiny", "datasets": ["builtin"], "limit": 3, "max_new_tokens": 6}
    with source_tree(None) as here:
        card = compare(Side("ar", here), Side("ar:greedy_kernel=false", here), spec, block=3, timeout=300,
                       noise=0.01)
    a, b = card["ab"]["a"]["config"], card["ab"]["b"]["config"]
    assert a["system"] == "ar" and b["system"] == "ar:greedy_kernel=false"
    differ = {k for k in a["options"] if a["options"][k] != b["options"][k]}
    assert differ == {"greedy_kernel"} and b["plan"]["greedy_kernel"] is False and a["plan"]["greedy_kernel"]
    assert card["ab"]["outputs_equal"] and len(card["ab"]["ratios"]) == 3
    assert card["decision"]["verdict"] in ("promote", "reject")


def test_bench_results_name_the_complete_configuration(tmp_path):
    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["bench", "--preset", "tiny", "--system", "stock:block_size=4", "--limit", "1",
                                      "--max-new-tokens", "6", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for name in ("ar", "stock:block_size=4"):
        config = report["systems"][name]["config"]
        assert config["system"] == name and config["env_overrides"] == []
        assert set(config["plan"]) >= {"gemv", "l2", "tune_rounds", "tuning"}
    assert report["schema"] == 1 and report["env_overrides"] == {}


def test_a_record_gives_the_values_an_engine_ran_at_not_the_drafters_default():
    stock = parse_system("stock:tree=best_first")
    ran = stock.resolving(block_size=8, nodes=8)
    assert ran == stock and ran.name == stock.name  # the same system: results and caches key on it alike
    record = ran.to_json()
    assert record["options"]["block_size"] == 8 and record["options"]["nodes"] == 8
    assert record["asked"] == {"block_size": 0, "nodes": 0} and record["changed"] == ["tree"]
    assert stock.to_json()["options"]["block_size"] == 0 and stock.to_json()["asked"] == {}  # not run: as asked


def test_bench_results_record_the_deployment_and_the_values_that_ran(tmp_path):
    import hashlib

    data = tmp_path / "data" / "gsm8k" / "test.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(8)))
    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["bench", "--preset", "tiny", "--system", "stock:nodes=6,tree=best_first",
                                      "--dataset", "builtin", "--dataset", "gsm8k", "--data-dir", str(data.parents[1]),
                                      "--limit", "1", "--max-new-tokens", "4", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    dep = report["deployment"]
    assert dep["name"] == "tiny" and dep["source"].endswith("tiny.toml") and dep["context"] == 512
    assert dep["target"]["seed"] == 0 and dep["drafter"]["seed"] == 1 and dep["drafter"]["random"]["block_size"] == 8
    assert dep["tokenizer"] == "bytes" and dep["twin"] is False and dep["enable_thinking"] is False
    assert dep["device"] == "cpu" and dep["dtype"] == "torch.float32" and dep["asked"]["dtype"] == "auto"
    assert report["data_files"] == {"builtin": None, "gsm8k": {
        "path": str(data.resolve()), "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}}
    config = report["systems"]["stock:nodes=6,tree=best_first"]["config"]
    assert config["options"]["block_size"] == 8 and config["options"]["nodes"] == 6  # the drafter's block, as run
    assert config["asked"] == {"block_size": 0}
    assert "block_size" not in report["systems"]["ar"]["config"]["options"]


def test_a_deployment_records_its_folders_absolute(tmp_path):
    from specpilot.deployment import load_deployment

    (tmp_path / "models" / "t").mkdir(parents=True)
    path = tmp_path / "dep.toml"
    path.write_text('[target]\npath = "models/t"\nseed = 3\n[twin]\nwidth = 2\n')
    served = load_deployment(path=path).as_served()
    assert served["target"] == {"path": str((tmp_path / "models" / "t").resolve()), "random": None, "seed": 3}
    assert served["tokenizer"] == served["target"]["path"] and served["asked"]["tokenizer"] == "target"
    assert served["twin"] is True and served["twin_width"] == 2 and served["drafter"] is None
    json.dumps(served)  # plain JSON throughout


def test_no_import_cycle_between_modules():
    """No chain of imports (lazy ones included) leads a module back to itself, but a package's __init__ and
    the submodules it imports lazily (attention -> attention.triton -> attention)."""
    modules = {}
    for path in _python_files(PACKAGE):
        name = ".".join(("specpilot", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specpilot"):
                deps |= {m for m in (node.module, *(f"{node.module}.{a.name}" for a in node.names)) if m in modules}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in modules}
        graph[name] = deps - {name}

    def reaches(start: str, goal: str, seen: set) -> bool:
        for dep in graph[start]:
            if dep == goal or (dep not in seen and not seen.add(dep) and reaches(dep, goal, seen)):
                return True
        return False

    cycles = [(a, b) for a in graph for b in graph[a] if reaches(b, a, set())
              and not (b.startswith(a + ".") or a.startswith(b + "."))]
    assert not cycles, cycles
