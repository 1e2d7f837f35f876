"""One self-contained HTML page of duplicate groups as thumbnails: what it shows and how it is drawn.

The page carries everything inline (CSS, a few lines of script, thumbnails as data: URIs), so
it can be mailed or opened anywhere; it links to no file and no URL. Groups appear in the
order given (callers put the largest first), members in theirs, the kept one marked by a
badge, a border and ``data-kept="1"``. Every string from the catalog is escaped, with control
characters and undecodable bytes shown as escapes. Where the page is written, and when an
existing file may be replaced, is :mod:`dlindex.quality.report`.
"""

from __future__ import annotations

import contextlib
import html
import warnings
from collections.abc import Generator, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TextIO

from dlindex.engines.local import CStderrCapture
from dlindex.quality.thumbnails import Thumbnail, make_thumbnail

MARKER = b'<meta name="generator" content="dlindex'  # what makes an existing file ours to replace
_THREADS = 4  # Pillow decodes without the GIL; more threads only add memory


@dataclass(frozen=True)
class ReportMember:
    """One image of a group as the page shows it."""

    id: int
    path: str
    width: int | None
    height: int | None
    bytes: int | None
    kept: bool
    label: str | None
    orientation: int | None = None  # EXIF; the thumbnail shows the stored pixels


@dataclass(frozen=True)
class ReportGroup:
    """A group of duplicates: ``kind`` ("exact" or "near") and its members in display order."""

    kind: str
    members: tuple[ReportMember, ...]


def write_page(
    out: TextIO,
    groups: Sequence[ReportGroup],
    shown: list[tuple[ReportGroup, tuple[ReportMember, ...]]],
    *,
    title: str,
    thumb_px: int,
    left_out: tuple[int, int] = (0, 0),
) -> int:
    """Stream the page to ``out`` group by group; return how many previews failed. ``left_out``:
    groups and images not in ``groups`` at all, counted in the summary."""
    from dlindex.version import __version__

    images = sum(len(members) for _, members in shown)
    total_groups = len(groups) + left_out[0]
    total_images = sum(len(g.members) for g in groups) + left_out[1]
    out.write(_HEAD.format(version=__version__, title=text(title), thumb=thumb_px, groups=len(shown), images=images))
    summary = _summary(total_groups, shown, total_images)
    out.write(f'<header><h1>{text(title)}</h1>\n<p class="summary">{summary}</p>')
    out.write(_LEGEND)
    failed = 0
    with contextlib.closing(_thumbnails(shown, thumb_px)) as previews:  # fd 2 and warnings restored on error too
        for number, ((group, members), thumbs) in enumerate(zip(shown, previews, strict=True), 1):
            failed += sum(t.uri is None for t in thumbs)
            out.write(_group_html(number, group, members, thumbs, thumb_px))
    out.write(_FOOT)
    return failed


def _summary(groups: int, shown: list[tuple[ReportGroup, tuple[ReportMember, ...]]], total: int) -> str:
    images = sum(len(m) for _, m in shown)
    line = f"{groups} group{'s' * (groups != 1)} of duplicates, {total} images; largest groups first."
    left_groups = groups - len(shown)
    left_images = total - images
    if left_groups or left_images:
        line += (
            f" Shown: {len(shown)} groups, {images} images; left out: {left_groups} groups and "
            f"{left_images} images in all (the page is capped; the command's other formats list every group)."
        )
    return html.escape(line)


def _thumbnails(
    shown: list[tuple[ReportGroup, tuple[ReportMember, ...]]], px: int
) -> Generator[list[Thumbnail], None, None]:
    """Each group's previews, in order, decoded by a few threads one group ahead at most."""
    capture = CStderrCapture()  # libtiff prints its warnings straight to fd 2, one line per file
    capture.start()
    try:
        with warnings.catch_warnings(), ThreadPoolExecutor(_THREADS) as pool:
            warnings.filterwarnings("ignore", module=r"PIL\.")  # bombs are refused by us; damage shows as a placeholder
            pending = None
            for _, members in shown:
                batch = [pool.submit(make_thumbnail, m.path, px) for m in members]
                if pending is not None:
                    yield [f.result() for f in pending]
                pending = batch
            if pending is not None:
                yield [f.result() for f in pending]
    finally:
        capture.stop()


def _group_html(
    number: int, group: ReportGroup, members: Sequence[ReportMember], thumbs: Iterable[Thumbnail], thumb_px: int
) -> str:
    more = len(group.members) - len(members)
    extra = f' <span class="more">({more} more not shown)</span>' if more else ""
    cards = "\n".join(_card(m, t, thumb_px) for m, t in zip(members, thumbs, strict=True))
    return (
        f'<section class="group" id="g{number}" data-kind="{text(group.kind)}" data-size="{len(group.members)}">\n'
        f'<h2><a href="#g{number}">#{number}</a> <span class="kind">{text(group.kind)}</span> '
        f'{len(group.members)} images{extra}</h2>\n<div class="cards">\n{cards}\n</div></section>\n'
    )


def _card(member: ReportMember, thumb: Thumbnail, thumb_px: int) -> str:
    kept = ' data-kept="1"' if member.kept else ""
    badge = '<span class="badge">kept</span>' if member.kept else ""
    if thumb.uri is not None:
        # a sprite or icon of 16 px is drawn enlarged by a whole factor, its pixels kept sharp,
        # so a person can judge the pair; the data stays the small thumbnail
        scale = max(1, thumb_px // max(thumb.width, thumb.height, 1))
        width, height = thumb.width * scale, thumb.height * scale
        sharp = f' class="px" style="width: {width}px; height: {height}px"' if scale > 1 else ""
        picture = f'<img src="{thumb.uri}"{sharp} width="{width}" height="{height}" alt="image {member.id}">'
    else:
        reason = text(thumb.reason or "no preview")
        picture = f'<div class="placeholder" data-reason="{reason}">no preview<br>{reason}</div>'
    size = f"{member.width}\u00d7{member.height} px" if member.width and member.height else "size unknown"
    meta = f"{size} \u00b7 {_human_bytes(member.bytes)}"
    if member.orientation and member.orientation != 1:  # as stored, as training sees it by default
        meta += f" \u00b7 EXIF orientation {member.orientation} not applied"
    label = f'<span class="label">{text(member.label)}</span>' if member.label else ""
    return (
        f'<figure class="card{" kept" * member.kept}" data-id="{member.id}"{kept}>{badge}'
        f'<div class="frame">{picture}</div><figcaption><span class="id">{member.id}</span>{label}'
        f'<span class="path" title="{text(member.path)}">{text(member.path)}</span>'
        f'<span class="meta">{meta}</span></figcaption></figure>'
    )


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "bytes unknown"
    if n < 1000:
        return f"{n} B"
    scaled = float(n)
    for unit in ("kB", "MB", "GB"):
        scaled /= 1000
        if scaled < 1000:
            return f"{scaled:.1f} {unit}"
    return f"{scaled / 1000:.1f} TB"


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)} | {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def text(value: str) -> str:
    """``value`` safe inside HTML text and quoted attributes: escaped, control characters and
    undecodable bytes (surrogate escapes) written as visible escapes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        try:
            value = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a lone surrogate that is no escaped byte
            value = value.encode("utf-8", "backslashreplace").decode("utf-8")  # other characters stay themselves
    return html.escape(value.translate(_CONTROL), quote=True)


_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="generator" content="dlindex {version} duplicate report">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
:root {{ --thumb: {thumb}px; --kept: #1a7f37; --ink: #1f2328; --muted: #59636e; --line: #d1d9e0; }}
* {{ box-sizing: border-box; }}
body {{ margin: 0; padding: 24px 32px; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--ink); background: #f6f8fa; }}
h1 {{ margin: 0 0 4px; font-size: 22px; }}
.summary {{ margin: 0 0 8px; color: var(--muted); }}
.legend {{ margin: 0 0 20px; color: var(--muted); font-size: 13px; }}
.group {{ background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 12px 16px 16px;
  margin: 0 0 18px; }}
h2 {{ margin: 0 0 10px; font-size: 15px; font-weight: 600; }}
h2 a {{ color: var(--muted); text-decoration: none; }}
.kind {{ display: inline-block; padding: 1px 8px; border-radius: 10px; background: #ddf4ff; color: #0969da;
  font-size: 12px; margin: 0 4px; }}
.more {{ color: var(--muted); font-weight: 400; }}
.cards {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(calc(var(--thumb) + 24px), 1fr)); gap: 12px; }}
.card {{ position: relative; margin: 0; padding: 8px; border: 2px solid var(--line); border-radius: 8px;
  background: #fff; min-width: 0; }}
.card.kept {{ border-color: var(--kept); box-shadow: 0 0 0 2px rgba(26, 127, 55, .18); }}
.badge {{ position: absolute; top: 4px; left: 4px; z-index: 1; padding: 1px 8px; border-radius: 10px;
  background: var(--kept); color: #fff; font-size: 12px; font-weight: 600; }}
.frame {{ height: var(--thumb); display: flex; align-items: center; justify-content: center;
  background: repeating-conic-gradient(#eef1f4 0 25%, #fff 0 50%) 0 0 / 16px 16px; border-radius: 4px; }}
.frame img {{ max-width: 100%; max-height: 100%; width: auto; height: auto; }}
.frame img.px {{ image-rendering: pixelated; }}
.placeholder {{ padding: 8px; color: #cf222e; font-size: 12px; text-align: center; overflow-wrap: anywhere; }}
figcaption {{ margin-top: 6px; display: flex; flex-direction: column; gap: 2px; font-size: 12px; }}
.id {{ font-weight: 600; }} .id::before {{ content: "id "; color: var(--muted); font-weight: 400; }}
.label {{ color: #8250df; }}
.path {{ font-family: ui-monospace, SFMono-Regular, Menlo, monospace; overflow-wrap: anywhere; }}
.meta {{ color: var(--muted); }}
</style></head>
<body data-groups="{groups}" data-images="{images}">
"""
_LEGEND = (
    '<p class="legend">Each card is one catalog image; the one marked <b>kept</b> (green border) is the '
    "one the keep policy chose, the others are the copies to flag.</p></header>\n<main>\n"
)
_FOOT = """</main>
<script>
// Counts for a reader (and the tests): previews that decoded, and those that did not.
addEventListener("load", function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++;
  document.body.setAttribute("data-loaded", ok);
  document.body.setAttribute("data-broken", imgs.length - ok);
});
</script>
</body></html>
"""
