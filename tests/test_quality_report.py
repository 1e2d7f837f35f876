"""The HTML duplicate report: previews, escaping, the kept mark, caps, overwrite rules, a real browser."""

from __future__ import annotations

import base64
import html
import io
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from dlindex.errors import InputError, Interrupted
from dlindex.quality import page as page_module
from dlindex.quality import thumbnails
from dlindex.quality.page import ReportGroup, ReportMember, text
from dlindex.quality.report import ReportError, write_report

from .conftest import CORPUS, CORPUS_EXPECTED

HOSTILE = "<script>alert(1)</script> \"q\" 'x'\nname.png"  # a folder "<script>alert(1)<", then a file


@dataclass
class Page(HTMLParser):
    """What a browser's parser makes of the page: sections, cards, images, scripts, text."""

    sections: list[dict[str, str | None]] = field(default_factory=list)
    cards: list[dict[str, str | None]] = field(default_factory=list)
    images: list[dict[str, str | None]] = field(default_factory=list)
    placeholders: list[str] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    badges: int = 0
    body: dict[str, str | None] = field(default_factory=dict)
    tags: set[str] = field(default_factory=set)
    _in: str | None = None

    def __post_init__(self) -> None:
        super().__init__(convert_charrefs=True)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        found = dict(attrs)
        classes = (found.get("class") or "").split()
        if tag == "body":
            self.body = found
        elif tag == "section":
            self.sections.append(found)
        elif tag == "figure":
            self.cards.append({**found, "section": str(len(self.sections))})
        elif tag == "img":
            self.images.append(found)
            self.cards[-1]["preview"] = "img"
        elif "placeholder" in classes:
            self.placeholders.append(found.get("data-reason") or "")
            self.cards[-1]["preview"] = "placeholder"
        elif "badge" in classes:
            self.badges += 1
        self._in = tag if tag == "script" else next((c for c in ("path", "label") if c in classes), None)
        if self._in in ("path", "label"):
            (self.paths if self._in == "path" else self.labels).append("")  # an empty name has no data

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "script":
            self.scripts.append(data)
        elif self._in == "path":
            self.paths[-1] += data
        elif self._in == "label":
            self.labels[-1] += data


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def _photo(path: Path, size: tuple[int, int], hue: int) -> Path:
    image = Image.new("RGB", size)
    draw = ImageDraw.Draw(image)
    for y in range(size[1]):
        draw.line([(0, y), (size[0], y)], fill=(hue, y * 255 // size[1], 255 - y * 255 // size[1]))
    draw.ellipse([size[0] // 4, size[1] // 4, 3 * size[0] // 4, 3 * size[1] // 4], fill=(255, 220, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "images"
    found = {
        "jpeg": _photo(root / "photo.jpg", (800, 600), 40),
        "jpeg_small": _photo(root / "photo_small.jpg", (400, 300), 40),
        "png": _photo(root / "photo.png", (640, 480), 40),
        "hostile": _photo(root / HOSTILE, (120, 90), 160),
    }
    alpha = Image.new("RGBA", (200, 150), (255, 0, 0, 0))
    ImageDraw.Draw(alpha).ellipse([20, 20, 180, 130], fill=(0, 120, 255, 200))
    alpha.save(found.setdefault("alpha", root / "alpha.png"))
    palette = Image.open(found["jpeg"]).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    palette.save(found.setdefault("gif", root / "palette.gif"))
    deep = Image.new("I;16", (64, 48))
    deep.putdata([i * 8 for i in range(64 * 48)])  # 0..24,568 of 65,535: the preview stretches it
    deep.save(found.setdefault("deep", root / "deep16.png"))
    (root / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    found["corrupt"] = root / "corrupt.jpg"
    found["missing"] = root / "missing.jpg"
    return found


def _member(id_: int, path: Path | str, *, kept: bool = False, label: str | None = None) -> ReportMember:
    size = Path(path).stat().st_size if Path(path).is_file() else None
    return ReportMember(id_, str(path), 640, 480, size, kept, label)


def _groups(files: dict[str, Path]) -> list[ReportGroup]:
    return [
        ReportGroup(
            "near",
            (
                _member(1, files["jpeg"], kept=True, label="cat"),
                _member(2, files["jpeg_small"], label="cat"),
                _member(3, files["png"], label="dog"),
                _member(4, files["gif"]),
            ),
        ),
        ReportGroup("exact", (_member(5, files["alpha"]), _member(6, files["deep"], kept=True))),
        ReportGroup("near", (_member(7, files["corrupt"], kept=True), _member(8, files["missing"]))),
        ReportGroup("exact", (_member(9, files["hostile"], label='"><b onclick=x>bold</b>'), _member(10, files["png"], kept=True))),
    ]  # fmt: skip


def test_groups_appear_in_the_given_order_with_the_kept_image_marked(tmp_path: Path, files: dict[str, Path]) -> None:
    groups = _groups(files)
    summary = write_report(tmp_path / "report.html", groups, title="Duplicates")
    page = parse(summary.path)
    assert (summary.groups, summary.images, summary.thumbnails_failed) == (4, 10, 2)
    assert summary.bytes == summary.path.stat().st_size
    assert [s["data-size"] for s in page.sections] == ["4", "2", "2", "2"]
    assert [s["data-kind"] for s in page.sections] == ["near", "exact", "near", "exact"]
    assert [c["data-id"] for c in page.cards] == [str(i) for i in range(1, 11)]
    kept = [(c["section"], c["data-id"]) for c in page.cards if c.get("data-kept") == "1"]
    assert kept == [("1", "1"), ("2", "6"), ("3", "7"), ("4", "10")]
    assert all("kept" in (c["class"] or "").split() for c in page.cards if c.get("data-kept"))
    assert not any("kept" in (c["class"] or "").split() for c in page.cards if not c.get("data-kept"))
    assert page.badges == 4
    assert (page.body["data-groups"], page.body["data-images"]) == ("4", "10")


def test_previews_are_inline_images_no_bigger_than_asked(tmp_path: Path, files: dict[str, Path]) -> None:
    summary = write_report(tmp_path / "report.html", _groups(files), title="t", thumb_px=96)
    page = parse(summary.path)
    kinds = []
    for image in page.images:
        head, _, data = (image["src"] or "").partition(";base64,")
        kinds.append(head)
        decoded = Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
        scale = max(1, 96 // max(decoded.size))  # a small image is drawn enlarged by a whole factor
        shown = (decoded.size[0] * scale, decoded.size[1] * scale)
        assert max(decoded.size) <= 96 and shown == (int(image["width"] or 0), int(image["height"] or 0))
    # photo.jpg, photo_small.jpg: JPEG; photo.png is opaque RGB: JPEG; alpha and palette: WebP (a quarter of an
    # optimized PNG's bytes, 5x faster to write: 8.8k icons took 90 s and 43.5 MB); 16-bit grey: JPEG
    assert kinds == ["data:image/jpeg", "data:image/jpeg", "data:image/jpeg", "data:image/webp", "data:image/webp",
                     "data:image/jpeg", "data:image/jpeg", "data:image/jpeg"]  # fmt: skip
    raw = summary.path.read_text(encoding="utf-8")
    assert "file:" not in raw and "http://" not in raw and "https://" not in raw
    assert str(files["jpeg"].parent) not in " ".join(i["src"] or "" for i in page.images)


def test_a_sprite_is_drawn_enlarged_with_sharp_pixels(tmp_path: Path, files: dict[str, Path]) -> None:
    """A 16 px sprite fills the frame (10x at 160 px, pixels kept sharp) so a person can judge the
    pair; the data stays a 16 px thumbnail. A photo's thumbnail is drawn as it is."""
    sprite = tmp_path / "sprite.png"
    Image.new("RGBA", (16, 12), (200, 30, 30, 255)).save(sprite)
    group = ReportGroup("near", (_member(1, sprite, kept=True), _member(2, files["jpeg"])))
    summary = write_report(tmp_path / "report.html", [group], title="t")
    small, photo = parse(summary.path).images
    decoded = Image.open(io.BytesIO(base64.b64decode((small["src"] or "").partition(";base64,")[2])))
    assert decoded.size == (16, 12)
    assert (small["width"], small["height"], small["class"]) == ("160", "120", "px")
    assert small["style"] == "width: 160px; height: 120px"
    assert "px" not in (photo.get("class") or "") and photo.get("style") is None
    assert ".frame img.px { image-rendering: pixelated; }" in summary.path.read_text(encoding="utf-8")


def test_files_that_cannot_be_shown_get_a_placeholder_with_the_reason(tmp_path: Path, files: dict[str, Path]) -> None:
    fifo = tmp_path / "images" / "fifo.jpg"
    os.mkfifo(fifo)  # opened without blocking: a FIFO never hangs the report
    folder = tmp_path / "images"
    group = ReportGroup(
        "near",
        tuple(_member(i, p, kept=i == 0) for i, p in enumerate([files["jpeg"], files["corrupt"], files["missing"], fifo, folder])),
    )  # fmt: skip
    summary = write_report(tmp_path / "report.html", [group], title="t")
    page = parse(summary.path)
    assert summary.thumbnails_failed == 4 and len(page.images) == 1
    (files["corrupt"].parent / "text.jpg").write_text("just text")
    assert thumbnails.make_thumbnail(str(files["corrupt"].parent / "text.jpg"), 64).reason == (
        "not an image format Pillow knows (corrupt or not an image)"
    )
    assert page.placeholders == [
        "cannot decode: Truncated File Read",  # a JPEG header, then nothing
        "cannot open: No such file or directory",
        "not a regular file",
        "not a regular file",
    ]


def test_transparency_survives_as_webp_alpha(tmp_path: Path) -> None:
    keyed = Image.new("P", (40, 40), 1)
    keyed.putpalette(bytes([255, 0, 0, 0, 0, 0, 255, 255]), "RGBA")  # entry 1: opaque blue, entry 0: clear
    keyed.paste(0, (0, 0, 20, 40))
    keyed.save(tmp_path / "keyed.png")  # a palette with a tRNS chunk
    preview = thumbnails.make_thumbnail(str(tmp_path / "keyed.png"), 32)
    assert preview.uri is not None and preview.uri.startswith("data:image/webp;base64,")
    with Image.open(io.BytesIO(base64.b64decode(preview.uri.partition(",")[2]))) as image:
        clear, blue = image.getpixel((2, 2)), image.getpixel((30, 2))
        assert image.mode == "RGBA" and isinstance(clear, tuple) and isinstance(blue, tuple)
        assert clear[3] == 0 and max(abs(a - b) for a, b in zip(blue, (0, 0, 255, 255), strict=True)) <= 8


def test_size_and_pixel_limits_are_checked_before_decoding(
    tmp_path: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300_000)  # over it (Pillow only warns below twice it)
    with pytest.warns(Image.DecompressionBombWarning):
        reason = thumbnails.make_thumbnail(str(files["jpeg"]), 64).reason
    assert reason == "800x600 pixels is over the pixel limit (300000); not decoded"
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # over twice it: Pillow's open refuses
    assert thumbnails.make_thumbnail(str(files["jpeg"]), 64).reason == "over the pixel limit (1000); not decoded"
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    monkeypatch.setattr(thumbnails, "MAX_SOURCE_BYTES", 100)
    reason = thumbnails.make_thumbnail(str(files["jpeg"]), 64).reason
    assert reason is not None and reason.endswith("bytes is over the 100 byte limit")


def test_catalog_strings_are_escaped_never_markup(tmp_path: Path, files: dict[str, Path]) -> None:
    undecodable = os.fsdecode(b"/data/caf\xe9.jpg")  # a Latin-1 name, decoded with surrogateescape
    group = ReportGroup(
        '"><script>alert(2)</script>',
        (
            _member(1, files["hostile"], kept=True, label="<img src=x onerror=alert(3)>"),
            _member(2, undecodable, label="a\x00b"),
            _member(3, "/data/lone\ud800.jpg"),
        ),
    )
    summary = write_report(tmp_path / "report.html", [group], title="<script>alert(4)</script>")
    page = parse(summary.path)
    assert len(page.scripts) == 1 and "alert" not in page.scripts[0]  # only the page's own counter
    assert all((i["src"] or "").startswith("data:image/") for i in page.images) and len(page.images) == 1
    assert page.tags <= {"html", "head", "meta", "title", "style", "body", "header", "h1", "p", "b", "main",
                         "section", "h2", "a", "span", "div", "figure", "img", "figcaption", "br", "script"}  # fmt: skip
    assert page.paths == [str(files["hostile"]).replace("\n", "\\n"), "/data/caf\\xe9.jpg", "/data/lone\\ud800.jpg"]
    assert page.labels == ["<img src=x onerror=alert(3)>", "a\\x00b"]
    assert page.sections[0]["data-kind"] == '"><script>alert(2)</script>'


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.text(st.characters(codec=None, exclude_categories=())), min_size=2, max_size=3))
@example(names=["é\ud800", "x"])  # a lone surrogate beside a non-ASCII character: once a UnicodeDecodeError
def test_any_name_comes_back_as_the_same_text(tmp_path: Path, names: list[str]) -> None:
    members = tuple(ReportMember(i, name, None, None, None, i == 0, name or None) for i, name in enumerate(names))
    summary = write_report(tmp_path / "r.html", [ReportGroup("near", members)], title=names[0], overwrite=True)
    page = parse(summary.path)
    shown = [html.unescape(text(n)) for n in names]  # what the page means to show: visible escapes
    assert page.paths == shown
    assert page.labels == [s for s, n in zip(shown, names, strict=True) if n]
    assert len(page.scripts) == 1 and len(page.cards) == len(names) and len(page.placeholders) == len(names)


def test_an_existing_file_is_replaced_only_when_it_is_a_dlindex_report(tmp_path: Path, files: dict[str, Path]) -> None:
    groups = _groups(files)[:1]
    target = tmp_path / "report.html"
    write_report(target, groups, title="first")
    with pytest.raises(ReportError, match=r"report\.html exists; give --overwrite"):
        write_report(target, groups, title="second")
    assert "<title>first</title>" in target.read_text()
    write_report(target, groups, title="second", overwrite=True)
    assert "<title>second</title>" in target.read_text()

    foreign = tmp_path / "notes.html"
    foreign.write_text("<html><head><title>my notes</title></head></html>")
    with pytest.raises(ReportError, match="is not a dlindex report; not overwritten"):
        write_report(foreign, groups, title="t", overwrite=True)
    assert foreign.read_text() == "<html><head><title>my notes</title></head></html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "notes.html", "report.html"]  # no temp left


@pytest.mark.parametrize("kind", ["link to a report", "dangling link", "folder", "fifo", "no parent"])
def test_links_folders_and_special_files_are_refused(tmp_path: Path, files: dict[str, Path], kind: str) -> None:
    report = write_report(tmp_path / "real.html", _groups(files)[:1], title="t").path
    target = tmp_path / "target.html"
    if kind == "link to a report":
        target.symlink_to(report)
    elif kind == "dangling link":
        target.symlink_to(tmp_path / "nowhere.html")
    elif kind == "folder":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target = tmp_path / "absent" / "report.html"
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ReportError) as raised:
        write_report(target, _groups(files)[:1], title="t", overwrite=True)
    message = str(raised.value)
    assert "\n" not in message and str(target) in message
    assert isinstance(raised.value, InputError)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert kind not in ("link to a report", "dangling link") or target.is_symlink()


def test_an_interrupted_report_leaves_nothing_behind(
    tmp_path: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(path: str, px: int) -> thumbnails.Thumbnail:
        raise KeyboardInterrupt

    monkeypatch.setattr(page_module, "make_thumbnail", interrupted)
    with pytest.raises(Interrupted, match="was not written"):
        write_report(tmp_path / "report.html", _groups(files), title="t")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_the_page_is_capped_and_says_what_it_left_out(tmp_path: Path, files: dict[str, Path]) -> None:
    big = ReportGroup("near", tuple(_member(i, files["missing"], kept=i == 9) for i in range(10)))
    small = [ReportGroup("exact", (_member(100 + i, files["missing"], kept=True), _member(200 + i, files["missing"]))) for i in range(5)]  # fmt: skip
    summary = write_report(tmp_path / "r.html", [big, *small], title="t", max_groups=3, max_members=4)
    page = parse(summary.path)
    assert (summary.groups, summary.images) == (3, 8)
    assert [c["data-id"] for c in page.cards if c["section"] == "1"] == ["0", "1", "2", "9"]  # the kept one stays
    raw = summary.path.read_text()
    assert "(6 more not shown)" in raw
    assert "Shown: 3 groups, 8 images; left out: 3 groups and 12 images in all" in raw


@pytest.mark.parametrize(
    ("option", "value"), [("thumb_px", 8), ("thumb_px", 4096), ("max_groups", 0), ("max_members", 1)]
)
def test_bad_sizes_are_refused_in_one_line(tmp_path: Path, files: dict[str, Path], option: str, value: int) -> None:
    with pytest.raises(InputError, match=r"^[^\n]+$"):
        write_report(tmp_path / "r.html", _groups(files), title="t", **{option: value})  # type: ignore[arg-type]
    assert not (tmp_path / "r.html").exists()


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus is not present")
def test_every_image_pillow_decodes_gets_a_preview_and_no_file_breaks_the_page(tmp_path: Path) -> None:
    expected = json.loads(CORPUS_EXPECTED.read_text())
    names = sorted(expected)
    groups = [
        ReportGroup("near", tuple(ReportMember(i, str(CORPUS / n), None, None, None, i == start, n) for i, n in enumerate(names[start : start + 8], start)))
        for start in range(0, len(names), 8)
    ]  # fmt: skip
    summary = write_report(tmp_path / "corpus.html", groups, title="Pillow's test images", max_members=8)
    page = parse(summary.path)
    assert summary.images == len(names) == len(page.cards)
    assert len(page.images) + len(page.placeholders) == len(names) and summary.thumbnails_failed == len(
        page.placeholders
    )
    assert [c["data-id"] for c in page.cards] == [str(i) for i in range(len(names))]  # every file, in order
    preview = {name: card.get("preview") for name, card in zip(names, page.cards, strict=True)}
    missing = [n for n in names if expected[n]["status"] == "ok" and preview[n] != "img"]
    assert missing == [], "Pillow decodes these fully, yet the report shows no preview"
    assert summary.thumbnails_failed <= sum(e["status"] == "corrupt" for e in expected.values())


BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(f"no headless browser installed ({', '.join(BROWSERS)}); apt-get install chromium")


def _headless(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
               "--virtual-time-budget=10000", "--hide-scrollbars", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.timeout(300)
def test_a_real_browser_decodes_every_preview_and_draws_the_page(tmp_path: Path, files: dict[str, Path]) -> None:
    browser = _browser()
    summary = write_report(tmp_path / "report.html", _groups(files), title="Duplicates")
    url = summary.path.as_uri()
    dumped = _headless(browser, tmp_path / "profile", "--dump-dom", url)
    assert dumped.returncode == 0, dumped.stderr.decode(errors="replace")[-2000:]
    dom = Page()
    dom.feed(dumped.stdout.decode())
    assert len(dom.sections) == 4 and len(dom.cards) == 10
    # set by the page's own script after load: every <img> complete with a natural width
    assert (dom.body.get("data-loaded"), dom.body.get("data-broken")) == ("8", "0"), dom.body
    assert [c["data-id"] for c in dom.cards if c.get("data-kept") == "1"] == ["1", "6", "7", "10"]

    shot = tmp_path / "report.png"
    drawn = _headless(browser, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,1400", url)
    assert drawn.returncode == 0 and shot.is_file(), drawn.stderr.decode(errors="replace")[-2000:]
    with Image.open(shot) as image:
        assert image.size == (1280, 1400)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200  # text, previews and borders, not a blank page
    green = sum(count for count, (r, g, b) in colours if (r, g, b) == (0x1A, 0x7F, 0x37))
    assert green > 500  # the kept images' badges and borders


def test_page_groups_keep_the_first_and_count_the_rest() -> None:
    from dlindex.quality.duplicate_groups import DuplicateGroup
    from dlindex.quality.report import PageGroups

    page = PageGroups(3)
    stream = (DuplicateGroup((2 * i + 1, 2 * i + 2, 10**9 + i), 2 * i + 1, "exact") for i in range(100_000))
    assert sum(1 for _ in page.tee(stream)) == 100_000  # every group passes on
    assert [g.kept for g in page.first] == [1, 3, 5]  # only these are held
    assert (page.left_groups, page.left_images) == (99_997, 3 * 99_997)
