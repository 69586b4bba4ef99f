"""The examples in the docs are run by tests: the fenced code blocks of one section of a page."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def section_blocks(page: str, heading: str) -> dict[str, str]:
    """The fenced blocks of the section ``## heading`` of ``docs/page``, by language (the last block of a language
    wins); the section ends at the next ``## `` heading."""
    text = (DOCS / page).read_text()
    section = text[text.index(f"## {heading}"):]
    nxt = re.search(r"^## ", section[3:], re.M)
    section = section[:nxt.start() + 3] if nxt else section
    return {lang: body for lang, body in re.findall(r"```(\w*)\n(.*?)```", section, re.S) if lang}
