"""The memory on disk: plain files in git (`<root>/entries/<id>/entry.json` and `code.patch`) and a SQLite index
beside them (`<root>/index.sqlite`, WAL, derived: rebuilt from the files whenever it is missing or stale).

An entry is written only if it is faithful (memory/faithful.py), under the content address of what it
claims; `replay` re-checks both for every stored entry, so an edited file is caught as well as a patch that
no longer reproduces its code.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path

from specpilot.errors import UserError
from specpilot.memory.entry import Entry
from specpilot.memory.faithful import check

COLUMNS = ("id", "title", "system", "base_commit", "option_only", "gpu", "target", "drafter", "regime", "dtype",
           "round", "agent", "reused")


class Store:
    def __init__(self, root: Path, repo: Path):
        self.root, self.repo = Path(root), Path(repo)
        self.entries = self.root / "entries"

    # files

    def add(self, entry: Entry) -> str:
        """Check the entry, write it (atomically: a whole folder renamed into place) and index it; -> its id."""
        problem = check(self.repo, entry)
        if problem:
            raise UserError(f"memory entry {entry.title!r} is not faithful: {problem}")
        final = self.entries / entry.id
        if not final.exists():
            self.entries.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.entries, prefix=".new-"))
            try:
                body = {k: v for k, v in entry.to_json().items() if k != "patch"}
                (tmp / "entry.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
                (tmp / "code.patch").write_text(entry.patch)
                os.replace(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        self._index([entry])
        return entry.id

    def read(self, entry_id: str) -> Entry:
        folder = self.entries / entry_id
        try:
            body = json.loads((folder / "entry.json").read_text())
            patch = (folder / "code.patch").read_text()
        except (OSError, ValueError) as exc:
            raise UserError(f"memory entry {entry_id}: cannot read it ({exc})") from None
        return Entry.from_json({**body, "patch": patch})

    def ids(self) -> list[str]:
        if not self.entries.is_dir():
            return []
        return sorted(p.name for p in self.entries.iterdir() if p.is_dir() and not p.name.startswith("."))

    def find(self, prefix: str) -> str:
        hits = [i for i in self.ids() if i.startswith(prefix)]
        if len(hits) != 1:
            raise UserError(f"no memory entry {prefix!r} in {self.root}" if not hits else
                            f"{prefix!r} names {len(hits)} entries: give more of the id")
        return hits[0]

    def replay(self, entry_id: str | None = None) -> dict[str, str | None]:
        """id -> None when the stored entry still holds (its content is its id, and it is faithful), else why."""
        out: dict[str, str | None] = {}
        for i in [self.find(entry_id)] if entry_id else self.ids():
            try:
                entry = self.read(i)
            except UserError as exc:
                out[i] = str(exc)
                continue
            out[i] = (f"its files were edited: their content is entry {entry.id}, not {i}" if entry.id != i
                      else check(self.repo, entry))
        return out

    # index

    def rows(self, **where) -> list[dict]:
        """Index rows (every entry whose files read), optionally filtered by column values."""
        if not self.ids():
            return []  # nothing to index: leave no index file behind
        self._index([self.read(i) for i in self.ids() if not self._indexed(i)])
        with closing(self._db()) as db:
            sql = "SELECT * FROM entries" + (" WHERE " + " AND ".join(f"{k} = ?" for k in where) if where else "")
            cur = db.execute(sql + " ORDER BY round, id", tuple(where.values()))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall() if (self.entries / r[0]).is_dir()]

    def _db(self) -> sqlite3.Connection:
        self.root.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.root / "index.sqlite", timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"CREATE TABLE IF NOT EXISTS entries ({', '.join(COLUMNS)}, PRIMARY KEY (id))")
        return db

    def _indexed(self, entry_id: str) -> bool:
        with closing(self._db()) as db:
            return db.execute("SELECT 1 FROM entries WHERE id = ?", (entry_id,)).fetchone() is not None

    def _index(self, entries: list[Entry]) -> None:
        if not entries:
            return
        with closing(self._db()) as db, db:
            db.executemany(f"INSERT OR REPLACE INTO entries VALUES ({', '.join('?' * len(COLUMNS))})",
                           [_row(e) for e in entries])


def _row(e: Entry) -> tuple:
    fp, prov = e.evidence["fingerprint"], e.provenance
    return (e.id, e.title, e.registry["system"], e.base_commit, int(e.option_only), fp["gpu"], fp["target"],
            fp["drafter"], fp["regime"], fp["dtype"], prov.get("round"), prov.get("agent"),
            int(bool(prov.get("reused"))))
