"""Agent backends: how each kind of agent is started and how its streamed output is read.

`--agent claude[:EXE]`   Claude Code headless: `claude -p PROMPT --output-format stream-json --verbose --max-turns N
                         --allowedTools ... --append-system-prompt RULES --permission-mode acceptEdits
                         [--max-budget-usd X]`; one JSON event per line, the last a `result` with `num_turns` and
                         `total_cost_usd` (older releases: `cost_usd`).
`--agent codex[:EXE]`    `codex exec --json --sandbox workspace-write --ask-for-approval never --skip-git-repo-check
                         -C WORKTREE PROMPT`, stdin /dev/null (an open pipe makes it wait for input); JSONL events
                         (`thread.started`, `turn.started`, `item.completed`, `turn.completed` with `usage`).
                         `--ask-for-approval` on `exec` needs a codex from April 2026 on (openai/codex#16888);
                         older releases refuse it there (openai/codex#13614) and the agent ends at once.
`--agent command:EXE`    any program: `EXE BRIEF` with the brief also on stdin, the worktree as its directory.

Neither CLI's own turn limit holds (claude's --max-turns has been seen exceeded; codex has none): the watcher
counts turns itself from the stream (claude: each `assistant` event; codex: each completed item that acts or
answers) and has the group killed past the cap, as past the money cap where the backend reports money. A plain
command reports neither unless it prints such events (a `{"type": "assistant"}` line counts a turn, a
`{"type": "result", "total_cost_usd": x}` line sets its cost), and is held to its wall time.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from specpilot.errors import UserError

CLAUDE_TOOLS = ("Read", "Edit", "Write", "Glob", "Grep", "Bash(git diff:*)", "Bash(git status:*)",
                "Bash(python:*)", "Bash(specpilot:*)", "Bash(pytest:*)")
CODEX_ACTS = ("command_execution", "file_change", "mcp_tool_call", "web_search", "agent_message")


@dataclass
class Budget:
    wall_s: float
    turns: int | None = None
    usd: float | None = None

    def to_json(self) -> dict:
        return {"wall_s": self.wall_s, "turns": self.turns, "usd": self.usd}


@dataclass
class Watch:
    """What the stream said so far: turns counted, money reported, the final result event; `line` returns a reason
    to kill the agent's group once a cap is passed."""

    backend: str
    budget: Budget
    turns: int = 0
    cost_usd: float | None = None
    usage: dict = field(default_factory=dict)
    result: dict | None = None
    unparsed: int = 0  # lines that were not JSON (a command's plain output)

    def line(self, text: str) -> str | None:
        try:
            event = json.loads(text)
        except (ValueError, RecursionError):  # plain output, or JSON nested past the parser's depth
            self.unparsed += 1
            return None
        if isinstance(event, dict):
            self._event(event)
        if self.budget.turns is not None and self.turns > self.budget.turns:
            return f"{self.turns} turns counted from its output, over the cap of {self.budget.turns}"
        if self.budget.usd is not None and self.cost_usd is not None and self.cost_usd > self.budget.usd:
            return f"it reported ${self.cost_usd:.2f} spent, over the cap of ${self.budget.usd:.2f}"
        return None

    def _event(self, e: dict) -> None:
        kind = e.get("type")
        if self.backend == "codex":
            item, usage = e.get("item"), e.get("usage")
            if kind == "item.completed" and isinstance(item, dict) and item.get("type") in CODEX_ACTS:
                self.turns += 1
            elif kind == "turn.completed" and isinstance(usage, dict):
                for k, v in usage.items():
                    if isinstance(v, int | float):
                        self.usage[k] = self.usage.get(k, 0) + v
            return
        if kind == "assistant":
            self.turns += 1
        elif kind == "result":
            self.result = {k: e.get(k) for k in ("subtype", "is_error", "num_turns", "duration_ms", "session_id")}
            cost = e.get("total_cost_usd", e.get("cost_usd"))
            if isinstance(cost, int | float):
                self.cost_usd = float(cost)
            if isinstance(e.get("usage"), dict):
                self.usage = e["usage"]

    def to_json(self) -> dict:
        return {"turns": self.turns, "cost_usd": self.cost_usd, "usage": self.usage, "result": self.result,
                "unparsed": self.unparsed}


@dataclass
class Backend:
    kind: str  # claude | codex | command
    exe: str

    @property
    def name(self) -> str:
        return self.kind if self.kind != "command" else f"command:{self.exe}"

    def argv(self, worktree: Path, brief: Path, prompt: str, rules: str, budget: Budget) -> list[str]:
        if self.kind == "claude":
            out = [self.exe, "-p", prompt, "--output-format", "stream-json", "--verbose",
                   "--max-turns", str(budget.turns or 50), "--allowedTools", *CLAUDE_TOOLS,
                   "--append-system-prompt", rules, "--permission-mode", "acceptEdits"]
            return out + (["--max-budget-usd", f"{budget.usd:g}"] if budget.usd is not None else [])
        if self.kind == "codex":
            return [self.exe, "exec", "--json", "--sandbox", "workspace-write", "--ask-for-approval", "never",
                    "--skip-git-repo-check", "-C", str(worktree), prompt]
        return [self.exe, str(brief)]

    def stdin(self, brief: Path) -> Path | None:
        """What the program reads on stdin (None: /dev/null)."""
        return brief if self.kind == "command" else None

    def watch(self, budget: Budget) -> Watch:
        return Watch(self.kind, budget)


def backend(spec: str) -> Backend:
    """`claude`, `claude:EXE`, `codex`, `codex:EXE` or `command:EXE` (EXE: a path or a name on PATH)."""
    kind, _, exe = spec.partition(":")
    if kind not in ("claude", "codex", "command"):
        raise UserError(f"unknown agent {spec!r}: builtin, claude[:EXE], codex[:EXE] or command:EXE")
    if kind == "command" and not exe:
        raise UserError("--agent command:EXE needs the program to run")
    exe = exe or kind
    found = shutil.which(exe) if "/" not in exe else (exe if Path(exe).is_file() and os.access(exe, os.X_OK)
                                                      else None)
    if found is None:
        raise UserError(f"agent {spec!r}: {exe!r} is not an executable file or a program on PATH")
    return Backend(kind, str(Path(found).resolve()))
