"""What a query selects: ``QuerySpec``, its columns and choices, and checks of its values."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dlindex.catalog.sqlite.connect import INT64_MAX
from dlindex.errors import InputError, UsageError, did_you_mean

# Two columns, two vocabularies: scan's verdict on the file (status) and what mark records
# about its processing (processing_status; "none" selects rows mark never set).
STATUSES = ("ok", "corrupt", "missing")
PROCESSING_STATUSES = ("queued", "completed", "failed")
# How the `error` of a sample the training loader could not read starts: a rescan re-checks
# exactly those files (dlindex/scan/diff.py) and clears the mark of one that reads again.
LOADER_FAILURE = "loader: "
PROCESSING_FILTERS = (*PROCESSING_STATUSES, "none")
ORDERS = ("id", "random")
# Stored columns, selected by name; path, root, label and label_id are derived from them in
# Python. label_row is the internal labels.id: never a column users see (dlindex/catalog/classes.py).
STORED = {
    "id": "image_metadata.id",
    "root_id": "image_metadata.root_id",
    "file_path": "image_metadata.file_path",
    "file_path_bytes": "image_metadata.file_path_bytes",
    "label_row": "image_metadata.label_id",
    "split": "image_metadata.split",
    "width": "image_metadata.width",
    "height": "image_metadata.height",
    "orientation": "image_metadata.orientation",
    "format": "image_metadata.format",
    "mode": "image_metadata.mode",
    "bytes": "image_metadata.bytes",
    "mtime_ns": "image_metadata.mtime_ns",
    "xxh3_128": "image_metadata.xxh3_128",
    "status": "image_metadata.status",
    "error": "image_metadata.error",
    "warning": "image_metadata.warning",
    "processed": "image_metadata.processed",
    "processing_status": "image_metadata.processing_status",
    "excluded": "image_metadata.excluded",
    "created_at": "image_metadata.created_at",
    "updated_at": "image_metadata.updated_at",
    # The sample's texts (dlindex.catalog.texts): its first (by source, then seq), and all of them.
    "text": "(SELECT image_texts.text FROM image_texts WHERE image_texts.image_id = image_metadata.id "
    "ORDER BY image_texts.source, image_texts.seq LIMIT 1)",
    "texts_json": "(SELECT json_group_array(t.text) FROM (SELECT image_texts.text FROM image_texts "
    "WHERE image_texts.image_id = image_metadata.id ORDER BY image_texts.source, image_texts.seq) AS t)",
}
DERIVED = {
    "path": ("root_id", "file_path", "file_path_bytes"), "root": ("root_id",), "label": ("label_row",),
    "label_id": ("label_row",), "texts": ("texts_json",),
}  # fmt: skip
TEXT_COLUMNS = ("text", "texts")  # of the texts as they are now: no history (docs/text.md)
COLUMNS = ("id", "path", "root", "file_path", "label", "label_id", "split", *[c for c in STORED if c not in
           ("id", "root_id", "file_path", "file_path_bytes", "label_row", "split", "texts_json")], "texts")  # fmt: skip
DEFAULT_COLUMNS = ("id", "path", "label", "width", "height", "status", "processed", "processing_status", "created_at")
_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|secs|m|min|mins|h|hr|hrs|d|day|days|w|wk|wks)\s*$", re.I)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


# The catalog's id span: two primary-key seeks, no scan; ORDER BY ... LIMIT 1, not min()/max(),
# so that through a past state's view (dlindex.catalog.as_of) SQLite merges its two ordered parts
# instead of reading every row.
ID_SPAN = "SELECT (SELECT id FROM image_metadata ORDER BY id LIMIT 1), (SELECT id FROM image_metadata ORDER BY id DESC LIMIT 1)"


@dataclass(frozen=True)
class QuerySpec:
    """What to select: the options of ``dlindex query``, with the same names and defaults.

    ``split`` selects the tree's split folders (``"val"`` or ``"validation"``); ``classes``
    says which class list ``label_id`` indexes: ``"selected"`` (the ``labels`` named, else
    the catalog's) or ``"catalog"`` (always the catalog's); ``has_class`` keeps only files
    with (True) or without (False) a class. See dlindex/catalog/classes.py.
    Sequences may also be given as one string (``columns="id,path"``, ``labels="cat"``);
    ``since``/``until`` take an ISO date-time (UTC unless it says otherwise), a duration
    back from now (``30m``, ``24h``, ``7d``) or a ``datetime``. ``min_width``/``min_height``
    are on stored pixels, as ``width``/``height``; with ``exif_orient`` on the image turned as
    its EXIF orientation says (width and height swapped for orientations 5-8). ``status`` is scan's verdict
    (ok, corrupt, missing); ``processing_status`` is mark's (queued, completed, failed, or
    none: never set). ``text`` keeps the samples one of whose texts (captions, descriptions)
    matches a search (docs/text.md#search). ``excluded`` False leaves out the samples ``mark --exclude`` set aside
    (the default), True selects only them, None both.
    """

    labels: Sequence[str] | str = ()
    split: Sequence[str] | str = ()
    classes: str = "selected"
    has_class: bool | None = None
    status: Sequence[str] | str = ("ok",)
    processed: bool | None = None
    processing_status: Sequence[str] | str = ()
    excluded: bool | None = False
    since: str | datetime | None = None
    until: str | datetime | None = None
    min_width: int | None = None
    min_height: int | None = None
    exif_orient: bool = False
    per_label: int | None = None
    limit: int | None = None
    offset: int | None = None
    order: str = "id"
    seed: int = 0
    columns: Sequence[str] | str | None = DEFAULT_COLUMNS
    cache: bool = True
    text: str | None = None  # a full-text search of the samples' texts (dlindex.query.text_search)
    ids: Sequence[int] | None = None  # only these samples (export --append's rows that changed)

    def __post_init__(self) -> None:
        for name in ("labels", "split", "status", "processing_status"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value or ()))
        columns = DEFAULT_COLUMNS if self.columns is None else self.columns
        if isinstance(columns, str):
            columns = [c.strip() for c in columns.split(",")]
        object.__setattr__(self, "columns", tuple(columns or ()))
        check_statuses(self.status, self.processing_status)


def check_statuses(status: Sequence[str], processing_status: Sequence[str]) -> None:
    """Refuse a value given to the other status column's option, saying which takes which."""
    for value in status:
        if value not in STATUSES:
            raise UsageError(_status_mix("--status", value))
    for value in processing_status:
        if value not in PROCESSING_FILTERS:
            raise UsageError(_status_mix("--processing-status", value))


def _status_mix(option: str, value: object) -> str:
    both = (
        "--status takes scan's verdict: ok, corrupt or missing; "
        "--processing-status takes mark's: queued, completed, failed or none"
    )
    if option == "--status" and value in PROCESSING_FILTERS:
        return f"{value!r} is a processing status, not a scan status: use --processing-status {value} ({both})"
    if option == "--processing-status" and value in STATUSES:
        return f"{value!r} is a scan status, not a processing status: use --status {value} ({both})"
    choices = STATUSES if option == "--status" else PROCESSING_FILTERS
    return f"unknown {option} {str(value)[:40]!r}{did_you_mean(str(value), choices)}: {both}"


def check_columns(columns: Sequence[str]) -> tuple[str, ...]:
    if not columns:
        raise InputError(f"no columns asked for; choose from: {', '.join(COLUMNS)}")
    for column in columns:
        if column not in COLUMNS:
            raise InputError(
                f"unknown column {column!r}{did_you_mean(column, COLUMNS)}; choose from: {', '.join(COLUMNS)}"
            )
    return tuple(dict.fromkeys(columns))


def check_count(option: str, value: Any, minimum: int) -> int:
    """``value`` as a whole number from ``minimum`` to the 64-bit limit SQLite can bind."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"{option} must be a whole number, not {value!r}")
    if value < minimum:
        raise InputError(f"{option} must be {minimum} or more, not {value}")
    if value > INT64_MAX:
        raise InputError(f"{option} must be at most {INT64_MAX}, not {str(value)[:30]}")
    return value


def parse_when(value: str | datetime, option: str = "time") -> str:
    """A time as the catalog stores it ('YYYY-MM-DD HH:MM:SS', UTC), from ISO text or a duration."""
    try:
        return _when(value, option)
    except (OverflowError, ValueError):  # a duration reaching before year 1, a time zone past 9999
        raise InputError(f"{option} {str(value)[:40]!r} is outside the years 1 to 9999") from None


def _when(value: str | datetime, option: str) -> str:
    if isinstance(value, datetime):
        moment = value
    else:
        text = value.strip()
        match = _DURATION.match(text)
        if match:
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)[0].lower()]
            if seconds <= 0:
                raise InputError(f"{option} {value!r}: a duration must be more than 0")
            moment = datetime.now(UTC) - timedelta(seconds=seconds)
        else:
            try:
                moment = datetime.fromisoformat(text)
            except ValueError:
                raise InputError(
                    f"{option} {value!r} is neither an ISO date-time (2024-05-01, 2024-05-01T12:30:00Z) "
                    "nor a duration (30m, 24h, 7d)"
                ) from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment.strftime(_TIME_FORMAT)


def with_columns(spec: QuerySpec, columns: tuple[str, ...]) -> QuerySpec:
    return replace(spec, columns=columns)
