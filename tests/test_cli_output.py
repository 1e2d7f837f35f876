"""The jsonl writer: the same text as one json.dumps a line, written in batches (#34)."""

from __future__ import annotations

import io
import json

from dlindex.cli._output import _BATCH, _jsonl


def test_jsonl_lines_are_those_of_json_dumps_across_batches() -> None:
    rows = [{"id": i, "path": f"/data/caf\u00e9_{i}.png", "label": None, "w": 1.5} for i in range(2 * _BATCH + 3)]
    rows[_BATCH] = {"id": -1, "path": "/data/bad\udce9.png", "when": object}  # a name that is not UTF-8
    out = io.StringIO()
    assert _jsonl(iter(rows), out, ("id", "path")) == len(rows)
    expected = [json.dumps(r, ensure_ascii=False, default=str) for r in rows]
    expected[_BATCH] = json.dumps(rows[_BATCH], ensure_ascii=True, default=str)  # \udce9 escaped
    assert out.getvalue() == "".join(line + "\n" for line in expected)
    assert "\\udce9" in out.getvalue().splitlines()[_BATCH]
