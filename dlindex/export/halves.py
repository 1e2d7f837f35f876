"""A big jsonl manifest in two processes: the lower half of the ids here, the upper in a second.

The second process writes a part file that is appended when both are done.

Fetching rows from SQLite and formatting them is CPU work in one interpreter; a second
process halves the wall time of a million-row manifest on two cores. The child is spawned,
not forked (an SQLite connection must never cross a fork), opens the catalog read-only and
reports its counts through a pipe; whatever goes wrong there fails the whole export.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dlindex.export.dealing import Dealing, OutsideSplit
from dlindex.export.gcpause import paused_gc
from dlindex.export.jsonl import deal, jsonl_lines
from dlindex.export.plan import ID, ExportError, Group, Tally, UpperHalf, split_of
from dlindex.export.shards import Context
from dlindex.export.texts import TextSource

_BATCH = 4096


@dataclass
class Running:
    process: Any
    conn: Any
    part: Path

    def finish(self, group: Group) -> int:
        """Wait for the child; add its counts to the group's tally; return its sample count."""
        report = self._report()
        assert group.tally is not None
        group.tally.samples[(group.split, group.rank)] += report["samples"]
        for label, n in report["labels"]:
            group.tally.labels[(group.split, label)] += n
        return int(report["samples"])

    def finish_splits(self) -> tuple[dict[str, int], Counter[tuple[str, Any]]]:
        """Wait for a child dealing rows to splits: its samples per split, and per (split, label)."""
        report = self._report()
        labels: Counter[tuple[str, Any]] = Counter()
        for split, label, n in report["labels"]:
            labels[(split, label)] += n
        return dict(report["splits"]), labels

    def split_part(self, split: str) -> Path:
        """The part file of one split, when the child dealt rows to splits."""
        return self.part.with_name(f"{self.part.name}.{split}")

    def _report(self) -> dict[str, Any]:
        try:
            report = self.conn.recv()
        except EOFError:
            report = {"error": "it exited without a report"}
        self.process.join()
        if "error" in report:
            self.part.unlink(missing_ok=True)
            for split in report.get("splits") or ():
                self.split_part(split).unlink(missing_ok=True)
            if report.get("outside"):
                raise OutsideSplit(report["error"])
            raise ExportError(f"the second export process failed: {report['error']}")
        return dict(report)

    def kill(self) -> None:
        self.process.kill()
        self.process.join()


def start(ctx: Context, group: Group, upper: UpperHalf, dealing: Dealing | None = None) -> Running:
    """Start a process that writes the rows of ``upper`` as jsonl lines to a part file (with
    ``dealing``: each row to its split's part file, ``Running.split_part``)."""
    part = ctx.out / ".upper.part"
    # Only what formatting needs travels: no rows, no open connection.
    plan = replace(ctx.plan, groups=(), tally=Tally())
    light = replace(ctx, plan=plan, progress=None, upper=None, texts=None if ctx.texts is None else True)
    spawn = multiprocessing.get_context("spawn")
    parent_conn, child_conn = spawn.Pipe(duplex=False)
    args = (light, upper, group.split, group.rank, part, child_conn, dealing)
    process = spawn.Process(target=_main, args=args, daemon=True)
    process.start()
    child_conn.close()
    return Running(process, parent_conn, part)


def _main(
    ctx: Context, upper: UpperHalf, split: str, rank: int, part: Path, conn: Any, dealing: Dealing | None
) -> None:
    try:
        with paused_gc():
            report = _write(ctx, upper, split, rank, part) if dealing is None else _deal(ctx, upper, part, dealing)
    except OutsideSplit as e:  # the parent says what a count of the selection says
        report = {"error": str(e), "outside": True, "splits": dealing.names if dealing else ()}
    except BaseException as e:  # reported to the parent, which raises
        report = {"error": f"{type(e).__name__}: {e}"}
    conn.send(report)
    conn.close()


def _reader(upper: UpperHalf) -> Any:
    """The second process's read-only connection, reading the same state as the first (``--at``)."""
    from dlindex.catalog.connection import backend_for, connect_reader

    db = connect_reader(upper.db, timeout=30)
    if upper.at is not None:
        backend_for(upper.db).pin_state(db, upper.at)
    return db


def _with_texts(ctx: Context, db: Any) -> Context:
    """The child's own texts, read through its own connection (the parent's cannot cross)."""
    return ctx if ctx.texts is None else replace(ctx, texts=TextSource(db.execute))  # True in the parent's copy


def _write(ctx: Context, upper: UpperHalf, split: str, rank: int, part: Path) -> dict[str, Any]:
    db = _reader(upper)
    ctx = _with_texts(ctx, db)
    lines = jsonl_lines(ctx)
    tally = Tally()
    try:
        cursor = db.execute(upper.sql, dict(upper.params))
        keep = None
        if upper.keep is not None:  # a split of fractions: the database narrowed the rows by hash
            assign, name = split_of(dict(upper.keep[0])), upper.keep[1]
            keep = lambda row: assign(row) == name  # noqa: E731
        with open(part, "wb") as f:
            while batch := cursor.fetchmany(_BATCH):
                if keep is not None:
                    batch = list(filter(keep, batch))
                tally.add(split, rank, batch)
                if ctx.texts is not None:
                    ctx.texts.load([row[ID] for row in batch])
                f.write("".join(lines(batch, {})).encode("utf-8", "surrogateescape"))
    finally:
        db.close()
    return {"samples": sum(tally.samples.values()), "labels": [[k[1], n] for k, n in tally.labels.items()]}


def _deal(ctx: Context, upper: UpperHalf, part: Path, dealing: Dealing) -> dict[str, Any]:
    """The rows of ``upper``, each line to its split's part file (``part.SPLIT``)."""
    db = _reader(upper)
    ctx = _with_texts(ctx, db)
    lines, dealer, names = jsonl_lines(ctx), dealing.dealer(), list(dealing.names)
    samples = dict.fromkeys(names, 0)
    labels: Counter[tuple[str, Any]] = Counter()
    files = {name: open(part.with_name(f"{part.name}.{name}"), "wb") for name in names}  # noqa: SIM115
    try:
        cursor = db.execute(upper.sql, dict(upper.params))
        while batch := cursor.fetchmany(_BATCH):
            rows, splits = dealer(batch)
            if ctx.texts is not None:
                ctx.texts.load([row[ID] for row in rows])
            out, counted = deal(rows, lines(rows, {}), splits, names)
            for name, text in out.items():
                if text:
                    samples[name] += len(text)
                    files[name].write("".join(text).encode("utf-8", "surrogateescape"))
            labels.update(counted)
    finally:
        for f in files.values():
            f.close()
        db.close()
    return {"splits": samples, "labels": [[split, label, n] for (split, label), n in labels.items()]}
