"""The options the `features` subcommands share: a type's name and a new type's dtype."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer


class Dtype(StrEnum):
    float32 = "float32"
    float16 = "float16"


TypeOption = Annotated[
    str,
    typer.Option("--type", "-t", metavar="NAME", help="Feature type name (letters, digits, _).", show_default=False),
]
DtypeOption = Annotated[
    Dtype | None,
    typer.Option(
        "--dtype",
        help="Storage of a new type: float32, or float16 (half the size).",
        show_default="float32",
    ),
]
