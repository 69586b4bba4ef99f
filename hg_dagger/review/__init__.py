"""The reviewer's side: automated QC, replay verification and review decisions over a store.

Each writes a new, versioned label layer beside the immutable raw data (never edits it); the label
rules themselves stay in hg_dagger.contract.labels.
"""
