"""The store's reviewer roster: the pseudonyms whose training authorizations count (root attribute
``hg_dagger.reviewers``), as read back and as declared."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hg_dagger.contract.labels import pseudonym_key
from hg_dagger.errors import StoreError
from hg_dagger.store import layout


def parse_roster(meta: Any, url: str) -> tuple[str, ...] | None:
    """The roster in the store attribute ``meta`` (None: none declared); StoreError naming the store if malformed."""
    names = meta.get("reviewers") if isinstance(meta, dict) else None
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise StoreError(f"{url}: root attribute {layout.STORE_ATTR}.reviewers is not a list of reviewer "
                         f"pseudonyms (got {names!r:.80}); set it with `hg-dagger store reviewers`")
    return tuple(names)


def roster_names(reviewers: Iterable[str], url: str) -> list[str]:
    """Pseudonyms as a roster holds them: whitespace collapsed, duplicates by case and whitespace dropped; at least
    one (StoreError naming the store otherwise)."""
    names: list[str] = []
    seen: set[str] = set()
    for raw in reviewers:
        name = " ".join(str(raw).split())
        if not name:
            raise StoreError(f"{url}: an empty reviewer pseudonym cannot be on the roster")
        if pseudonym_key(name) not in seen:
            seen.add(pseudonym_key(name))
            names.append(name)
    if not names:
        raise StoreError(f"{url}: a reviewer roster needs at least one pseudonym (or remove the roster)")
    return names
