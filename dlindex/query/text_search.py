"""``query --text``: a user's search words, parsed once and written for each backend's index.

The syntax is web-search style, the same on both backends (docs/text.md#search): words (all
must be there), ``"a phrase"`` (its words in this order), ``OR`` between two of them (either),
``-word`` or ``-"a phrase"`` (leave out the texts that have it). Nothing the user types reaches
either engine's query language as an operator: every word and phrase goes to FTS5 as a quoted
string, and to PostgreSQL as a JSON string that ``phraseto_tsquery`` reads as plain words
(dlindex.catalog.postgres.text_schema), with the operators dlindex puts around them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from dlindex.errors import InputError

MAX_SEARCH_CHARS = 1000
MAX_TERMS = 64
# A quoted phrase, or a run of anything else but spaces and quotes; with a leading '-' to exclude.
_TOKEN = re.compile(r'(-?)"([^"]*)"?|(-?)([^\s"]+)')
_WORDLIKE = re.compile(r"\w")  # a term with no letter or digit is no word to either index


@dataclass(frozen=True)
class TextSearch:
    """What to find: every group (one of its terms), and none of ``excluded``."""

    groups: tuple[tuple[str, ...], ...]
    excluded: tuple[str, ...] = ()

    def fts5(self) -> str:
        """An FTS5 MATCH expression: each term a quoted string, so FTS5 reads no operator in it."""
        found = " AND ".join("(" + " OR ".join(_fts5_string(t) for t in group) + ")" for group in self.groups)
        if not self.excluded:
            return found
        return f"({found}) NOT (" + " OR ".join(_fts5_string(t) for t in self.excluded) + ")"

    def server(self) -> str:
        """The same search for a server catalog, as JSON (``dlindex_tsquery`` builds the query
        from it: each term through ``phraseto_tsquery``, which reads no operator)."""
        return json.dumps({"all": [list(g) for g in self.groups], "none": list(self.excluded)}, ensure_ascii=False)


def _fts5_string(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def parse_search(text: str) -> TextSearch:
    """Parse ``query --text``'s value.

    Raises:
        InputError: too long, no word to find, an OR without a term on each side, or an
            excluded term on a side of OR (one line, naming what to change).
    """
    if not isinstance(text, str):
        raise InputError(f"--text takes a string, not {type(text).__name__}")
    if len(text) > MAX_SEARCH_CHARS:
        raise InputError(f"--text is {len(text):,} characters; a search takes at most {MAX_SEARCH_CHARS:,}")
    if "\0" in text:
        raise InputError("--text holds a NUL character; search for words")
    groups: list[list[str]] = []
    excluded: list[str] = []
    pending_or = False
    terms = 0
    for match in _TOKEN.finditer(text):
        minus, phrase, word_minus, word = match.groups()
        if phrase is None and word == "OR" and not word_minus:
            if not groups or pending_or:
                raise InputError('--text: OR needs a word or phrase on each side (to search for the word, write "or")')
            pending_or = True
            continue
        negative = bool(minus or word_minus)
        term = " ".join((phrase if phrase is not None else word).split())
        if not _WORDLIKE.search(term):
            if pending_or:
                raise InputError(f"--text: OR needs a word or phrase on each side, not {term!r}")
            continue
        terms += 1
        if terms > MAX_TERMS:
            raise InputError(f"--text has more than {MAX_TERMS} words and phrases")
        if negative:
            if pending_or:
                raise InputError("--text: a left-out term (-word) cannot be a side of OR; leave it out on its own")
            excluded.append(term)
        elif pending_or:
            groups[-1].append(term)
        else:
            groups.append([term])
        pending_or = False
    if pending_or:
        raise InputError('--text: OR needs a word or phrase on each side (to search for the word, write "or")')
    if not groups:
        what = "only words to leave out (-word)" if excluded else "no word to search for"
        raise InputError(f'--text {text[:40]!r} has {what}; give at least one word or "phrase" to find')
    return TextSearch(tuple(tuple(g) for g in groups), tuple(excluded))
