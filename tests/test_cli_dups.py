"""`dlindex dups`: exact and near groups through the CLI, formats, --keep, --rest | mark, errors."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from dlindex.quality.duplicate_groups import DEFAULT_MAX_DISTANCE, DEFAULT_THRESHOLD

from .backends import ON_BOTH_BACKENDS, where
from .conftest import DLINDEX, REPO, invoke, one_error_line, rows

pytestmark = ON_BOTH_BACKENDS


def pattern(seed: int, size: tuple[int, int] = (96, 72)) -> Image.Image:
    """A smooth random picture: its dhash has many 1 bits, unlike a plain colour."""
    low = np.random.default_rng(seed).random((4, 5, 3)) * 255
    return Image.fromarray(low.astype(np.uint8)).resize(size, Image.Resampling.BICUBIC)


@pytest.fixture
def dup_db(tmp_path: Path, runner: CliRunner) -> Path:
    """a/orig.png with a byte copy and a half-size copy; b/other.png with a JPEG re-encode; c/unique.png."""
    root = tmp_path / "images"
    for folder in ("a", "b", "c"):
        (root / folder).mkdir(parents=True)
    pattern(1).save(root / "a" / "orig.png")
    shutil.copyfile(root / "a" / "orig.png", root / "a" / "copy.png")
    pattern(1).resize((48, 36), Image.Resampling.LANCZOS).save(root / "a" / "half.png")
    pattern(2).save(root / "b" / "other.png")
    pattern(2).save(root / "b" / "other_q60.jpg", quality=60)
    pattern(3).save(root / "c" / "unique.png")
    db = where(tmp_path / "dups.db")
    assert invoke(runner, "scan", str(root), "--db", str(db), "--workers", "1", "-q").exit_code == 0
    return db


def compute_dhash(runner: CliRunner, db: Path) -> None:
    result = invoke(runner, "features", "compute", "--type", "dhash", "--extractor", "dhash", "-w", "1", "-q",
                    "--db", str(db))  # fmt: skip
    assert result.exit_code == 0, result.output


def ids_by_name(db: Path) -> dict[str, int]:
    return {Path(str(p)).name: int(str(i)) for i, p in rows(db, "SELECT id, file_path FROM image_metadata")}


def jsonl(result: object) -> list[dict[str, object]]:
    assert result.exit_code == 0 and result.stderr == "", result.output  # type: ignore[attr-defined]
    return [json.loads(line) for line in result.stdout.splitlines()]  # type: ignore[attr-defined]


def test_exact_duplicates_by_content_hash(runner: CliRunner, dup_db: Path) -> None:
    ids = ids_by_name(dup_db)
    (group,) = jsonl(invoke(runner, "dups", "--db", str(dup_db)))
    pair = sorted([ids["orig.png"], ids["copy.png"]])
    assert group["ids"] == pair and group["kind"] == "exact" and group["size"] == 2 and group["group"] == 1
    assert group["kept"] == pair[0]  # same pixels and bytes: the smaller id
    assert [Path(str(p)).name for p in group["paths"]] == [
        n for i, n in sorted((v, k) for k, v in ids.items()) if i in pair
    ]  # type: ignore[union-attr]
    assert all(Path(str(p)).is_absolute() for p in group["paths"])  # type: ignore[union-attr]


def test_near_duplicates_by_dhash_and_keep(runner: CliRunner, dup_db: Path) -> None:
    compute_dhash(runner, dup_db)
    ids = ids_by_name(dup_db)
    groups = jsonl(invoke(runner, "dups", "--type", "dhash", "--db", str(dup_db)))
    a = sorted(ids[n] for n in ("orig.png", "copy.png", "half.png"))
    b = sorted(ids[n] for n in ("other.png", "other_q60.jpg"))
    assert [(g["ids"], g["kind"]) for g in groups] == [(a, "near"), (b, "near")]
    assert groups[0]["kept"] == min(ids["orig.png"], ids["copy.png"])  # largest: not the half-size copy
    first = jsonl(invoke(runner, "dups", "--type", "dhash", "--keep", "first", "--db", str(dup_db)))
    assert [g["kept"] for g in first] == [a[0], b[0]]
    exact_only = jsonl(
        invoke(runner, "dups", "--type", "dhash", "--max-distance", "0", "--label", "b", "--db", str(dup_db))
    )
    assert [g["ids"] for g in exact_only] in ([], [b])  # a JPEG re-encode may or may not keep every bit


def test_csv_and_table(runner: CliRunner, dup_db: Path) -> None:
    result = invoke(runner, "dups", "--format", "csv", "--db", str(dup_db))
    assert result.exit_code == 0, result.output
    header, row = list(csv.reader(io.StringIO(result.stdout)))
    assert header == ["group", "kind", "size", "kept", "ids", "paths"]
    assert row[:3] == ["1", "exact", "2"] and len(row[4].split()) == 2 and len(json.loads(row[5])) == 2
    table = invoke(runner, "dups", "--format", "table", "--db", str(dup_db))
    assert table.exit_code == 0 and " exact " in table.stdout and f" {row[4]} " in table.stdout


def test_rest_piped_into_mark_through_real_processes(runner: CliRunner, dup_db: Path) -> None:
    compute_dhash(runner, dup_db)
    ids = ids_by_name(dup_db)
    rest = invoke(runner, "dups", "--type", "dhash", "--rest", "--db", str(dup_db))
    assert rest.exit_code == 0, rest.output
    kept = {min(ids["orig.png"], ids["copy.png"]), ids["other.png"]}  # the largest of each group
    expected = sorted(set(ids.values()) - kept - {ids["unique.png"]})
    assert sorted(map(int, rest.stdout.split())) == expected
    cli = " ".join(DLINDEX)
    shell = f"{cli} dups --type dhash --rest --db {dup_db} | {cli} mark --exclude -q --db {dup_db}"
    done = subprocess.run(shell, shell=True, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    excluded = [i for (i,) in rows(dup_db, "SELECT id FROM image_metadata WHERE excluded = 1 ORDER BY id")]
    assert excluded == expected
    again = invoke(runner, "dups", "--type", "dhash", "--rest", "--db", str(dup_db))
    assert (again.exit_code, again.stdout) == (0, "")  # one copy of each is left: nothing more to set aside


def test_bad_input_is_one_error_line(runner: CliRunner, dup_db: Path, tmp_path: Path) -> None:
    db = str(dup_db)
    assert "compute it first: dlindex features compute --type dhash" in one_error_line(
        invoke(runner, "dups", "--type", "dhash", "--db", db)
    )
    # a built-in name needs no --extractor, so the hint gives none (it once said colorhist)
    assert one_error_line(invoke(runner, "dups", "--type", "colorthumb", "--db", db)).endswith(
        "run dlindex features compute --type colorthumb (or features import)"
    )
    compute_dhash(runner, dup_db)
    np.savez(tmp_path / "e.npz", ids=np.arange(1, 7), vectors=np.random.default_rng(0).random((6, 8)))
    assert invoke(runner, "features", "import", str(tmp_path / "e.npz"), "--type", "emb", "--db", db).exit_code == 0
    cases = {
        ("--type", "nope"): "unknown feature type 'nope'; known types: dhash, emb",
        ("--type", "colorthumb"): "compute it: dlindex features compute --type colorthumb",
        ("--type", "dhash", "--threshold", "0.1"): "use --max-distance",
        ("--type", "emb", "--max-distance", "3"): "use --threshold",
        ("--type", "dhash", "--max-distance", "65"): "from 0 to 64",
        ("--type", "dhash", "--max-distance", "-1"): "from 0 to 64",
        ("--type", "emb", "--threshold", "2.5"): "from 0 to 2",
        ("--max-distance", "3"): "--max-distance needs a feature type",
    }
    for args, message in cases.items():
        assert message in one_error_line(invoke(runner, "dups", *args, "--db", db)), args
    usage = invoke(runner, "dups", "--rest", "--format", "csv", "--db", db)
    assert usage.exit_code == 2 and "--rest prints ids only" in usage.stderr
    assert jsonl(invoke(runner, "dups", "--type", "emb", "--threshold", "0", "--db", db)) == []


def test_help_states_the_library_defaults(runner: CliRunner) -> None:
    text = " ".join(invoke(runner, "dups", "--help", "--db", "x").stdout.split())
    assert f"[default: ({DEFAULT_MAX_DISTANCE})]" in text or f"[default: {DEFAULT_MAX_DISTANCE}]" in text
    assert f"{DEFAULT_THRESHOLD}" in text


def test_html_report_marks_the_kept_image_of_each_group(runner: CliRunner, dup_db: Path, tmp_path: Path) -> None:
    compute_dhash(runner, dup_db)
    ids = ids_by_name(dup_db)
    page = tmp_path / "dups.html"
    result = invoke(runner, "dups", "--type", "dhash", "--html", str(page), "--db", str(dup_db))
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"wrote {page}: 2 groups, 5 images")
    groups = [json.loads(line) for line in result.stdout.splitlines()]
    text = page.read_text(encoding="utf-8")
    for group in groups:  # every member drawn with its id; the kept one flagged
        for image_id in group["ids"]:
            assert f'data-id="{image_id}"' in text
        assert f'data-id="{group["kept"]}" data-kept="1"' in text or f'data-kept="1" data-id="{group["kept"]}"' in text
    assert "data:image/" in text and 'src="file:' not in text and "unique.png" not in text
    assert text.index("orig.png") < text.index("other.png")  # the 3-image group first
    assert ids["unique.png"] not in {i for g in groups for i in g["ids"]}


def test_html_report_of_more_groups_than_a_page_holds_keeps_only_those_it_draws(
    runner: CliRunner, dup_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dlindex.quality.report.DEFAULT_MAX_GROUPS", 1)  # a page of one group, two in the catalog
    compute_dhash(runner, dup_db)
    page = tmp_path / "dups.html"
    result = invoke(runner, "dups", "--type", "dhash", "--html", str(page), "--db", str(dup_db))
    assert result.exit_code == 0, result.output
    assert [len(json.loads(line)["ids"]) for line in result.stdout.splitlines()] == [3, 2]  # the output: every group
    assert result.stderr.startswith(f"wrote {page}: 1 groups, 3 images")
    text = " ".join(page.read_text(encoding="utf-8").split())
    assert "2 groups of duplicates, 5 images" in text and "left out: 1 groups and 2 images" in text
    assert "other.png" not in text


def test_html_report_is_never_written_over_a_users_file(runner: CliRunner, dup_db: Path, tmp_path: Path) -> None:
    page = tmp_path / "notes.html"
    page.write_text("my notes")
    result = invoke(runner, "dups", "--html", str(page), "--overwrite", "--db", str(dup_db))
    assert "is not a dlindex report; not overwritten" in one_error_line(result)
    assert page.read_text() == "my notes"
    ours = tmp_path / "dups.html"
    assert invoke(runner, "dups", "--html", str(ours), "--db", str(dup_db)).exit_code == 0
    assert "exists; give --overwrite" in one_error_line(
        invoke(runner, "dups", "--html", str(ours), "--db", str(dup_db))
    )
    assert invoke(runner, "dups", "--html", str(ours), "--overwrite", "--db", str(dup_db)).exit_code == 0
    usage = invoke(runner, "dups", "--overwrite", "--db", str(dup_db))
    assert usage.exit_code == 2 and "give --html FILE" in " ".join(usage.output.split())


def test_html_report_opens_in_a_real_browser(runner: CliRunner, dup_db: Path, tmp_path: Path) -> None:
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        pytest.skip(
            "no headless browser installed (chromium, chromium-browser, google-chrome); apt-get install chromium"
        )
    compute_dhash(runner, dup_db)
    page = tmp_path / "dups.html"
    assert invoke(runner, "dups", "--type", "dhash", "--html", str(page), "--db", str(dup_db)).exit_code == 0
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
               "--virtual-time-budget=10000", "--dump-dom", page.as_uri()]  # fmt: skip
    dumped = subprocess.run(command, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert dumped.returncode == 0, dumped.stderr.decode(errors="replace")[-2000:]
    dom = dumped.stdout.decode()
    assert 'data-loaded="5"' in dom and 'data-broken="0"' in dom  # the page's script saw every preview decode
