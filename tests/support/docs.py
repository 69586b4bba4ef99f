"""The examples in the docs are run by tests: the fenced code blocks of one section of a page."""

from __future__ import annotations

import re
import subprocess
import sys
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


def install_documented_plugin(base: Path, heading: str, module: str) -> Path:
    """The package a section of docs/extending.md shows (its python block as ``module.py``, its toml block as
    pyproject.toml), installed with pip into a site folder of its own under ``base``; that folder, to put on
    PYTHONPATH."""
    blocks = section_blocks("extending.md", heading)
    pkg = base / f"pkg-{module}"
    pkg.mkdir()
    (pkg / f"{module}.py").write_text(blocks["python"])
    (pkg / "pyproject.toml").write_text(blocks["toml"])
    site = base / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(site), str(pkg)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return site
