"""Index advice without timing: statement shapes, candidates per pattern, merging, findings."""

from __future__ import annotations

import pytest

from dlindex.advisor.candidates import Candidate, candidate_for, combine, existing_serves, merge
from dlindex.advisor.outcome import findings as _findings
from dlindex.advisor.replay import index_names
from dlindex.advisor.scratch import IndexDef
from dlindex.advisor.shapes import TableInfo, analyze, check_select, where_as_select, write_columns
from dlindex.advisor.sqltext import Constant
from dlindex.advisor.suggest import _combined_shape
from dlindex.advisor.workload import Statement

COLUMNS = ("id", "root_id", "file_path", "file_path_bytes", "label_id", "width", "height", "format", "bytes",
           "xxh3_128", "status", "error", "processed", "processing_status", "created_at")  # fmt: skip
IMAGES = TableInfo.make("image_metadata", COLUMNS, "id")
LABELS = TableInfo.make("labels", ("id", "name"), "id")
TABLES = {"image_metadata": IMAGES, "labels": LABELS}
DISTINCT = {"label_id": 1000, "width": 900, "height": 900, "bytes": 150_000, "created_at": 190_000, "file_path": 200_000,
            "xxh3_128": 200_000, "root_id": 1, "processed": 2, "status": 3, "processing_status": 4, "format": 3}  # fmt: skip
SHARE = {
    ("status", "ok"): 0.99,
    ("status", "corrupt"): 0.002,
    ("processed", 1): 0.7,
    ("processed", 0): 0.3,
    ("processing_status", "failed"): 0.01,
}


class Stats:
    """Statistics of a 200,000-row catalog, without a catalog."""

    def rows(self, table: str) -> int:
        return 200_000

    def distinct(self, table: str, column: str) -> int:
        return DISTINCT.get(column, 1000)

    def fraction(self, table: str, constant: Constant) -> float:
        return SHARE.get((constant.column, constant.value), 0.1)

    def width(self, table: str, column: str) -> float:
        return {"file_path": 27.0, "error": 1.0, "xxh3_128": 33.0}.get(column, 3.0)

    def row_width(self, table: str) -> float:
        return 200.0


STATS = Stats()


def candidate(sql: str, fp: str = "f1", weight: float = 1.0) -> Candidate | None:
    (access,) = [a for a in analyze(sql, TABLES).accesses if a.table == "image_metadata"][-1:]
    return candidate_for(access, fp, weight, IMAGES, STATS)


# --- what a statement asks ---------------------------------------------------------------------


def test_analyze_splits_equalities_constants_ranges_and_order() -> None:
    (a,) = analyze(
        "SELECT m.id, m.file_path FROM image_metadata AS m WHERE m.label_id = :label AND processed = 1 "
        "AND created_at >= ? AND created_at < ? AND width > 3 ORDER BY m.created_at DESC LIMIT 5",
        TABLES,
    ).accesses
    assert a.equal == ("label_id",) and a.constants == (Constant("processed", 1),)
    assert a.ranges == ("created_at", "width") and a.bounded == ("created_at",)
    assert a.order == ("created_at",) and a.order_desc
    assert a.columns == {"id", "file_path", "label_id", "processed", "created_at", "width"}


def test_analyze_sees_subqueries_joins_star_random_and_notes() -> None:
    shape = analyze(
        "SELECT * FROM image_metadata JOIN labels ON labels.id = image_metadata.label_id "
        "WHERE labels.name = 'cat' AND lower(image_metadata.format) = ? AND image_metadata.file_path LIKE '%x' "
        "AND image_metadata.id IN (SELECT id FROM image_metadata WHERE processing_status IS NULL ORDER BY random())",
        TABLES,
    )
    inner, outer, labels = shape.accesses[0], shape.accesses[1], shape.accesses[2]
    assert inner.constants == (Constant("processing_status", None),) and inner.order_random
    assert outer.columns is None and outer.in_lists == ("id",) and outer.equal == ("label_id",)
    assert labels.equal == ("id",) and labels.constants == (Constant("name", "cat"),)
    assert any("lower(format)" in n for n in shape.notes) and any("leading wildcard" in n for n in shape.notes)


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE image_metadata",
        "DELETE FROM image_metadata",
        "ATTACH DATABASE 'x.db' AS x",
        "PRAGMA writable_schema = 1",
        "SELECT 1; DROP TABLE labels",
        "SELECT * FROM labels; ",
        "WITH x AS (SELECT 1) DELETE FROM labels",
        "VACUUM INTO '/tmp/x.db'",
        "SELECT load_extension('evil')",
        "this is not sql",
        "",
    ],
)
def test_check_select_refuses_everything_but_one_read(sql: str) -> None:
    reason = check_select(sql)
    if sql == "SELECT * FROM labels; ":
        assert reason is None  # a trailing semicolon is not a second statement
    else:
        assert reason is not None and reason.startswith("not a read-only SELECT")


def test_check_select_accepts_reads_with_any_parameter_style() -> None:
    for sql in ("SELECT id FROM image_metadata WHERE label_id = ?1 AND width > $w AND height > @h AND bytes < :b",
                "WITH a AS (SELECT id FROM labels) SELECT * FROM a UNION SELECT 2"):  # fmt: skip
        assert check_select(sql) is None


def test_writes_are_read_for_their_columns_and_where() -> None:
    assert write_columns("UPDATE image_metadata SET processed = 1, error = ? WHERE id = ?") == (
        "image_metadata", ("processed", "error"))  # fmt: skip
    assert write_columns("INSERT INTO labels (name) VALUES (?)") == ("labels", None)
    assert where_as_select("DELETE FROM image_metadata WHERE root_id = ? AND file_path = ?") == (
        "SELECT rowid FROM image_metadata WHERE root_id = ? AND file_path = ?")  # fmt: skip


def test_a_literal_that_varies_between_statements_is_a_value_not_a_constant() -> None:
    r = Statement("f", "read", "", 3, 3, 1.0, 0, ("import",), variants=(
        "SELECT id FROM image_metadata WHERE label_id = 3 AND processed = 1",
        "SELECT id FROM image_metadata WHERE label_id = 7 AND processed = 1"))  # fmt: skip
    (a,) = _combined_shape(r, TABLES).accesses
    assert a.constants == (Constant("processed", 1),) and a.equal == ("label_id",)


# --- candidates per pattern --------------------------------------------------------------------


def test_label_among_processed_gets_a_partial_covering_index() -> None:
    c = candidate("SELECT file_path, label_id FROM image_metadata WHERE label_id = ? AND processed = 1")
    assert c is not None
    assert c.sql("i") == "CREATE INDEX i ON image_metadata (label_id, file_path, processed) WHERE processed = 1"
    assert (c.key, c.eq, c.include) == (("label_id",), 1, ("file_path", "processed"))


def test_equality_columns_by_selectivity_then_one_range_then_order() -> None:
    c = candidate("SELECT id FROM image_metadata WHERE width = ? AND label_id = ? AND created_at > ? AND bytes > ? "
                  "ORDER BY created_at")  # fmt: skip
    assert c is not None and c.key == ("label_id", "width", "created_at") and c.eq == 2  # 1,000 labels, 900 widths
    c = candidate("SELECT id FROM image_metadata WHERE label_id = ? ORDER BY created_at, width")
    assert c is not None and c.key == ("label_id", "created_at", "width")
    c = candidate("SELECT id FROM image_metadata WHERE label_id = ? AND width > ? ORDER BY created_at")
    assert c is not None and c.key == ("label_id", "width")  # the order cannot follow a range


def test_a_flag_never_leads_a_full_index() -> None:
    c = candidate("SELECT id FROM image_metadata WHERE processed = ? AND created_at > ?")
    assert c is not None and c.key == ("created_at",) and "processed" in c.include and not c.where
    assert candidate("SELECT id FROM image_metadata WHERE processed = ?") is None
    c = candidate("SELECT id FROM image_metadata WHERE status = 'ok' AND processed = 0 ORDER BY id")
    assert c is not None and c.key[0] == "id" and c.where_sql() == "processed = 0 AND status = 'ok'"


def test_constants_on_selective_columns_stay_in_the_key() -> None:
    c = candidate("SELECT id FROM image_metadata WHERE xxh3_128 = 'abc' AND processed = 1")
    assert c is not None and c.key == ("xxh3_128",) and c.where_sql() == "processed = 1"


def test_no_candidate_for_rowid_lookups_and_unfiltered_scans() -> None:
    assert candidate("SELECT file_path FROM image_metadata WHERE id = ?") is None
    assert candidate("SELECT file_path FROM image_metadata ORDER BY random() LIMIT 5") is None
    assert candidate("SELECT count(*) FROM image_metadata") is None


def test_covering_only_for_small_select_lists() -> None:
    c = candidate("SELECT * FROM image_metadata WHERE label_id = ?")
    assert c is not None and c.include == ()
    c = candidate(
        "SELECT id, root_id, file_path, width, height, format, bytes, xxh3_128 FROM image_metadata WHERE label_id = ?"
    )
    assert c is not None and c.include == ()  # seven extra columns: not a small list
    c = candidate("SELECT count(*) FROM image_metadata WHERE processing_status = 'failed'")
    assert c is not None and c.free and c.key == ("processing_status",)


def test_a_partial_index_over_few_rows_covers_every_column_read() -> None:
    """The corrupt list (0.2% of the rows) with dlindex query's default columns: read from the index alone."""
    columns = "id, root_id, file_path, file_path_bytes, label_id, width, height, status, processed, created_at"
    c = candidate(f"SELECT {columns} FROM image_metadata WHERE status = 'corrupt' ORDER BY id")
    assert c is not None and c.key == ("id",) and c.where_sql() == "status = 'corrupt'"
    assert set(c.include) == set(columns.split(", ")) - {"id"}
    c = candidate(f"SELECT {columns} FROM image_metadata WHERE processed = 1 ORDER BY id")
    assert c is not None and c.include == ()  # 70% of the rows: a copy of the table


def test_names_are_stable_and_marked() -> None:
    a = candidate("SELECT file_path FROM image_metadata WHERE label_id = ? AND processed = 1")
    b = candidate("SELECT file_path FROM image_metadata WHERE label_id = :x AND processed = 1", fp="other")
    assert (
        a is not None
        and b is not None
        and a.name == b.name
        and a.name.startswith("idx_dlindex_image_metadata_label_id_")
    )


# --- merging -----------------------------------------------------------------------------------


def test_prefixes_merge_into_the_longer_index() -> None:
    a = candidate("SELECT id FROM image_metadata WHERE label_id = ? AND processed = 1", "a")
    b = candidate("SELECT id FROM image_metadata WHERE label_id = ? AND width = ? AND processed = 1", "b")
    assert a is not None and b is not None
    merged = merge([a, b], STATS)
    assert len(merged) == 1 and merged[0].key in {("width", "label_id"), ("label_id", "width")}
    assert merged[0].fingerprints == ("a", "b")


def test_partial_wheres_relax_to_what_they_share() -> None:
    a = candidate("SELECT file_path FROM image_metadata WHERE label_id = ? AND processed = 1", "a")
    b = candidate("SELECT file_path FROM image_metadata WHERE label_id = ? AND status = 'ok' AND processed = 1", "b")
    assert a is not None and b is not None
    (m,) = merge([a, b], STATS)
    assert (
        m.where_sql() == "processed = 1" and m.key == ("label_id",) and "status" in m.include
    )  # 99% ok: filtered in the index
    c = candidate(
        "SELECT file_path FROM image_metadata WHERE label_id = ? AND processing_status = 'failed' AND processed = 1",
        "c",
    )
    assert c is not None
    (m,) = merge([a, c], STATS)
    assert m.key == ("label_id", "processing_status") and m.where_sql() == "processed = 1"  # 1% failed: seekable


def test_different_partial_wheres_or_tables_never_merge() -> None:
    a = candidate("SELECT id FROM image_metadata WHERE label_id = ? AND processed = 1", "a")
    b = candidate("SELECT id FROM image_metadata WHERE label_id = ? AND processed = 0", "b")
    assert a is not None and b is not None and combine(a, b, STATS) is None
    assert len(merge([a, b], STATS)) == 2


def test_a_count_joins_any_index_over_its_rows() -> None:
    a = candidate("SELECT count(*) FROM image_metadata WHERE processing_status = 'failed'", "count")
    b = candidate(
        "SELECT id, file_path, error FROM image_metadata WHERE processing_status = 'failed' ORDER BY id", "list"
    )
    assert a is not None and b is not None
    (m,) = merge([a, b], STATS)
    assert m.key == ("id",) and m.fingerprints == ("count", "list")


def test_an_existing_index_that_already_serves_a_candidate_is_enough() -> None:
    c = candidate("SELECT id FROM image_metadata WHERE label_id = ? AND processed = 1")
    assert c is not None
    served = IndexDef("idx_dlindex_x", "image_metadata", c.sql("idx_dlindex_x"), c.columns, c.where, True)
    plain = IndexDef(
        "by_label", "image_metadata", "CREATE INDEX by_label ON image_metadata (label_id)", ("label_id",), None, False
    )
    assert existing_serves(served, c, STATS) and not existing_serves(plain, c, STATS)  # plain does not cover processed


def test_a_full_index_does_not_stand_for_a_partial_candidate() -> None:
    """The failed list with more columns than an index covers: (id) WHERE ..., which the primary key is not."""
    c = candidate(
        "SELECT id, root_id, file_path, file_path_bytes, label_id, width, error FROM image_metadata "
        "WHERE status = 'ok' AND processing_status = 'failed' ORDER BY id"
    )
    assert (
        c is not None
        and c.key == ("id",)
        and not c.include
        and c.where_sql() == ("processing_status = 'failed' AND status = 'ok'")
    )
    primary = IndexDef("image_metadata_pkey", "image_metadata", None, ("id",), None, False)
    assert not existing_serves(primary, c, STATS)  # it reads every row; the candidate only the failed ones
    wider = IndexDef(
        "by_status", "image_metadata", "CREATE INDEX ...", ("processing_status", "id", "status"), None, False
    )
    assert existing_serves(wider, c, STATS)  # seeks the failed rows in id order, filters status inside


# --- findings on existing indexes ---------------------------------------------------------------


def test_unused_and_redundant_indexes() -> None:
    existing = [
        IndexDef(
            "wh",
            "image_metadata",
            "CREATE INDEX wh ON image_metadata (width, height)",
            ("width", "height"),
            None,
            False,
        ),
        IndexDef("w", "image_metadata", "CREATE INDEX w ON image_metadata (width)", ("width",), None, False),
        IndexDef("lab", "image_metadata", "CREATE INDEX lab ON image_metadata (label_id)", ("label_id",), None, False),
        IndexDef("sqlite_autoindex_image_metadata_1", "image_metadata", None, ("root_id", "file_path"), None, False),
    ]
    kept = candidate("SELECT file_path FROM image_metadata WHERE label_id = ? AND processed = 1", "hot")
    assert kept is not None
    before = {
        "hot": ("SEARCH image_metadata USING INDEX lab (label_id=?)",),
        "rare": ("SCAN image_metadata USING INDEX w",),
    }
    after = {"hot": (f"SEARCH image_metadata USING COVERING INDEX {kept.name} (label_id=?)",),
             "rare": ("SCAN image_metadata USING INDEX w",)}  # fmt: skip
    reads = {fp: Statement(fp, "read", "", 1, 1, 1.0, 0, ("dlindex",)) for fp in ("hot", "rare")}
    unused, redundant = _findings(existing, [kept], before, after, {"hot"}, reads)
    assert [f.name for f in unused] == ["wh"]
    assert {f.name: f.better for f in redundant} == {"w": "wh", "lab": kept.name}
    assert not any(f.droppable for f in (*unused, *redundant))  # none was made by dlindex


def test_index_names_read_from_plans() -> None:
    assert index_names(
        [
            "SEARCH t USING COVERING INDEX a (x=?)",
            "SCAN t USING INDEX b",
            "SEARCH t USING INTEGER PRIMARY KEY (rowid=?)",
        ]
    ) == {"a", "b"}
