"""Open the review workspace in its own window (``hg-dagger review open``)."""

from __future__ import annotations

from typing import cast

from hg_dagger.errors import HgDaggerError


def ask_reviewer(parent=None) -> str | None:
    """Ask for the reviewer's pseudonym until one is given; None when the dialog is cancelled."""
    # Qt deferred: the app extra, optional
    from PyQt6.QtWidgets import QInputDialog

    while True:
        name, ok = QInputDialog.getText(parent, "Reviewer", "Your reviewer pseudonym (never a real name):")
        if not ok:
            return None
        if name.strip():
            return name.strip()


def run_review(stores: list[str], reviewer: str | None) -> int:
    """Open the workspace on ``stores`` and run until it is closed; 2 when no reviewer is given."""
    # Qt deferred: the app extra, optional; the CLI imports this module to list its commands, without Qt or zarr
    from PyQt6 import QtWidgets
    from PyQt6.QtGui import QKeySequence, QShortcut

    from hg_dagger.review.decisions import open_store
    from hg_dagger.ui.lifetime import close_on_signals, delete_now
    from hg_dagger.ui.review import ReviewWorkspace

    if not stores:
        raise HgDaggerError("review open: give at least one store")
    for url in stores:
        open_store(url)  # a missing or foreign store is one readable error before any window opens
    # the process's application is a QApplication (the review has widgets); instance() is typed as the core one
    app = cast(QtWidgets.QApplication,
               QtWidgets.QApplication.instance() or QtWidgets.QApplication(["hg-dagger review"]))
    app.setApplicationName("hg-dagger review")
    name = (reviewer or "").strip() or ask_reviewer()
    if not name:
        raise HgDaggerError("review open: a reviewer pseudonym is required (--reviewer, or the dialog)")
    window = ReviewWorkspace(list(stores), name)
    quit_keys = QShortcut(QKeySequence("Ctrl+Q"), window)  # as in the operator app: Ctrl+Q closes the window
    quit_keys.activated.connect(window.close)
    window.show()
    with close_on_signals(app):
        code = int(app.exec() or 0)
    delete_now(window)
    return code
