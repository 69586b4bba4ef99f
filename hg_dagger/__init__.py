"""hg-dagger: human-gated DAgger - live correction of robot policies, review, and versioned training data."""

__version__ = "0.1.0"
