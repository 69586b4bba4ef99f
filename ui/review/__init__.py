"""The review workspace: browse correction windows, scrub their episodes, approve or reject them."""

from hg_dagger.ui.review.workspace import ReviewWorkspace

__all__ = ["ReviewWorkspace"]
