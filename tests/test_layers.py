"""The layer rules of docs/architecture.md hold: import-linter's contracts in pyproject.toml, checked over an
installed copy of the package (where ui/, devices/ and configs/ sit inside hg_dagger, as in a wheel)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _lint(site: Path) -> subprocess.CompletedProcess:
    linter = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(linter), "--config", str(site / "pyproject.toml")], capture_output=True, text=True,
                          cwd=site, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=300)


def test_import_contracts_hold_and_catch_an_upward_import(tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(REPO)], check=True, capture_output=True, timeout=300)
    shutil.copy(REPO / "pyproject.toml", site / "pyproject.toml")
    kept = _lint(site)
    assert kept.returncode == 0, kept.stdout[-4000:] + kept.stderr[-2000:]
    assert "3 kept, 0 broken" in kept.stdout

    # the same check on a copy where the store reaches up into the session: it must fail and name the import
    low = site / "hg_dagger" / "store" / "trainable.py"
    low.write_text(low.read_text() + "\nfrom hg_dagger.control import session as _upward  # noqa\n")
    broken = _lint(site)
    assert broken.returncode != 0
    assert "hg_dagger.store.trainable -> hg_dagger.control.session" in broken.stdout
