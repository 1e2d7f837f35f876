"""`export --verify` reads a wds export as its readers do: a tar changed and index.json
re-signed to match (hashes computed as the writer does) is still one problem line."""

from __future__ import annotations

import array
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex.export import verify_export

from .conftest import export, invoke, rewrite_export_file

SHARD = "train-000000.tar"


@pytest.fixture
def wds_export(scanned_db: Path, tmp_path: Path) -> Path:
    out = tmp_path / "w"
    export(scanned_db, out, format="wds")
    return out


def _edit_header(tar: bytes, at: int, **fields: bytes) -> bytes:
    """The tar with the header at byte ``at`` changed, its checksum made right again."""
    spans = {"name": (0, 100), "size": (124, 136), "type": (156, 157), "link": (157, 257)}
    head = bytearray(tar[at : at + 512])
    for field, value in fields.items():
        lo, hi = spans[field]
        head[lo:hi] = value.ljust(hi - lo, b"\0")
    head[148:156] = b" " * 8
    head[148:156] = b"%06o\0 " % sum(head)
    return tar[:at] + bytes(head) + tar[at + 512 :]


def _tamper_shard(**fields: bytes) -> Callable[[Path], None]:
    def tamper(out: Path) -> None:
        rewrite_export_file(out, SHARD, _edit_header((out / SHARD).read_bytes(), 0, **fields))

    return tamper


def _reverse_ids(out: Path) -> None:
    ids = array.array("q", (out / "ids.i64").read_bytes())
    ids.reverse()
    rewrite_export_file(out, "ids.i64", ids.tobytes())


def _claim_samples(out: Path) -> None:
    index = json.loads((out / "index.json").read_text())
    index["dlindex_shards"][0]["samples"] = 10**7
    (out / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (_tamper_shard(name=b"../../x.png"), r"member name '../../x.png' has an empty, '.' or '..' part"),
        (_tamper_shard(type=b"2", link=b"/etc/passwd"), "is a symbolic link to '/etc/passwd'"),
        (_tamper_shard(type=b"3"), "is a character device"),
        (_tamper_shard(name=b"cat/000.png"), "is not named KEY.EXT"),
        (_tamper_shard(size=b"%011o\0" % (10 << 30)), "claims 10737418240 bytes"),
        (_reverse_ids, "ids.i64: sample 0 is id"),
        (_claim_samples, f"{SHARD}: holds 1 samples, index.json says 10000000"),
    ],
    ids=["dotdot", "symlink", "device", "folder", "10GB", "reversed-ids", "claimed-samples"],
)
def test_a_resigned_tampered_wds_export_fails_verify_with_one_line(
    runner: CliRunner, wds_export: Path, tamper: Callable[[Path], None], message: str
) -> None:
    assert verify_export(wds_export).ok
    tamper(wds_export)
    result = invoke(runner, "export", "--verify", str(wds_export))
    assert result.exit_code == 1, result.output
    problem, error = result.stderr.strip().splitlines()
    assert message in problem, problem
    assert error == f"Error: 1 problem(s) in {wds_export}"


def test_a_class_out_of_range_and_a_sample_without_its_cls(wds_export: Path) -> None:
    tar = (wds_export / SHARD).read_bytes()
    at = tar.index(b".cls\0") - 12  # the first .cls header (its name is the 12-digit key, then .cls)
    rewrite_export_file(wds_export, SHARD, tar[: at + 512] + b"7" + tar[at + 513 :])  # class 7 of two
    assert "'7' is not a class of the export (0 to 1)" in verify_export(wds_export).problems[0]
    rewrite_export_file(wds_export, SHARD, _edit_header(tar, at, name=tar[at : at + 12] + b".txt"))
    assert "has no a .cls member" not in verify_export(wds_export).problems[0]
    assert "has no .cls member" in verify_export(wds_export).problems[0]


def test_a_manifest_with_fewer_rows_than_claimed(scanned_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "j"
    export(scanned_db, out, format="jsonl")
    lines = (out / "train-000000.jsonl").read_bytes().splitlines(keepends=True)
    rewrite_export_file(out, "train-000000.jsonl", b"".join(lines[:-1]))
    assert verify_export(out).problems == ("train-000000.jsonl: holds 5 rows, index.json says 6 samples",)


def test_the_summary_says_what_was_checked(runner: CliRunner, wds_export: Path) -> None:
    result = invoke(runner, "export", "--verify", str(wds_export))
    assert result.exit_code == 0, result.output
    assert "7 files, 6 samples in the shards" in result.stdout
    assert "source images" not in result.stdout


def test_a_manifest_whose_source_tree_is_gone_is_one_problem(
    runner: CliRunner, scanned_db: Path, image_tree: Path, tmp_path: Path
) -> None:
    """A moved or unmounted tree is one line naming the root, not a `missing` line per image
    (up to 1,000 of them), and the summary does not claim the images were checked."""
    export(scanned_db, tmp_path / "m", format="jsonl")
    image_tree.rename(image_tree.with_name("elsewhere"))
    result = verify_export(tmp_path / "m")
    assert result.problem_count == 1 and result.samples == 0, result.problems
    assert result.problems[0].startswith(f"source root {image_tree.resolve()} is missing (moved or unmounted?)")
    cli = invoke(runner, "export", "--verify", str(tmp_path / "m"))
    assert cli.exit_code == 1 and cli.stderr.count("\n") == 2, cli.stderr
    assert "0 source images" in cli.stdout
