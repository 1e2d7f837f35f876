"""The sample-selection options that query, export, similar and features compute share."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from dlindex.query.spec import QuerySpec


class Excluded(StrEnum):
    skip = "skip"
    only = "only"
    include = "include"


EXCLUDED = {Excluded.skip: False, Excluded.only: True, Excluded.include: None}


class ClassList(StrEnum):
    selected = "selected"
    catalog = "catalog"


DEFAULT_STATUS = ("ok",)

LabelOption = Annotated[
    list[str] | None, typer.Option("--label", "-l", help="Only this label (repeatable).", show_default=False)
]
# Plain text, checked by QuerySpec: a value of the other status column gets one line naming both.
StatusOption = Annotated[
    list[str],
    typer.Option(
        "--status", metavar="ok|corrupt|missing", help="Only this scan status: the file's verdict (repeatable)."
    ),
]
ProcessedOption = Annotated[
    bool | None,
    typer.Option("--processed/--unprocessed", help="Only processed, or only unprocessed, samples.", show_default=False),
]
ProcessingStatusOption = Annotated[
    list[str] | None,
    typer.Option(
        "--processing-status",
        metavar="queued|completed|failed|none",
        help="Only this processing status, as mark sets it; none: never set (repeatable).",
        show_default=False,
    ),
]
ExcludedOption = Annotated[
    Excluded,
    typer.Option(
        "--excluded", help="Samples set aside by mark --exclude: skip them, select only them, or include them."
    ),
]
SinceOption = Annotated[
    str | None,
    typer.Option(
        "--since",
        help="Created at or after WHEN: ISO date-time (UTC unless given) or a duration back from now: 30m, 24h, 7d.",
        metavar="WHEN",
        show_default=False,
    ),
]
UntilOption = Annotated[
    str | None,
    typer.Option("--until", help="Created before WHEN (same forms as --since).", metavar="WHEN", show_default=False),
]
MinWidthOption = Annotated[
    int | None, typer.Option("--min-width", min=0, help="Only images at least this wide.", show_default=False)
]
MinHeightOption = Annotated[
    int | None, typer.Option("--min-height", min=0, help="Only images at least this tall.", show_default=False)
]
TextOption = Annotated[
    str | None,
    typer.Option(
        "--text",
        help='Only samples with a text (caption, description) that matches: words, "a phrase", OR, -word.',
        metavar="SEARCH",
        show_default=False,
    ),
]
ClassesOption = Annotated[
    ClassList,
    typer.Option(
        "--classes",
        help="Which class list label_id indexes: selected (the --label names, else all the catalog's classes) or catalog (always all).",
    ),
]
PerLabelOption = Annotated[
    int | None,
    typer.Option(
        "--per-label",
        min=1,
        help="Class balance: at most N random samples per label (deterministic for a --seed).",
        show_default=False,
    ),
]


@dataclass(frozen=True)
class Selection:
    """The selection options as a command received them; `spec` makes the library's QuerySpec."""

    label: Sequence[str] | None
    status: Sequence[str]
    processed: bool | None
    processing_status: Sequence[str] | None
    excluded: Excluded
    since: str | None
    until: str | None
    min_width: int | None
    min_height: int | None
    text: str | None

    def spec(self, **more: Any) -> QuerySpec:
        """The QuerySpec of these options plus ``more`` (limit, seed, per_label...)."""
        from dlindex.query.spec import QuerySpec  # on use: scan and stats never select

        return QuerySpec(
            labels=tuple(self.label or ()), status=tuple(self.status or DEFAULT_STATUS), processed=self.processed,
            processing_status=tuple(self.processing_status or ()), excluded=EXCLUDED[self.excluded],
            since=self.since, until=self.until, min_width=self.min_width, min_height=self.min_height, text=self.text,
            **more,
        )  # fmt: skip


# The typer parameters of Selection's fields, in its order: (name, annotation, default).
_OPTIONS = [
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
    for name, annotation, default in (
        ("label", LabelOption, None), ("status", StatusOption, DEFAULT_STATUS), ("processed", ProcessedOption, None),
        ("processing_status", ProcessingStatusOption, None), ("excluded", ExcludedOption, Excluded.skip),
        ("since", SinceOption, None),
        ("until", UntilOption, None), ("min_width", MinWidthOption, None), ("min_height", MinHeightOption, None),
        ("text", TextOption, None),
    )
]  # fmt: skip
assert [p.name for p in _OPTIONS] == [f.name for f in fields(Selection)]


def selection_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` the selection options where its ``select: Selection`` parameter stands.

    typer declares options one parameter each and has no option groups: this declares them once
    and hands the command one Selection instead of nine arguments.
    """
    signature = inspect.signature(command, eval_str=True)
    names = [f.name for f in fields(Selection)]
    params: list[inspect.Parameter] = []
    for param in signature.parameters.values():
        params.extend(_OPTIONS if param.name == "select" else [param.replace(kind=inspect.Parameter.KEYWORD_ONLY)])
    assert len(params) == len(signature.parameters) + len(names) - 1, f"{command.__name__} has no select parameter"

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        select = Selection(**{name: kwargs.pop(name) for name in names})
        command(select=select, **kwargs)

    wrapper.__dict__["__signature__"] = signature.replace(parameters=params)  # what typer reads
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
