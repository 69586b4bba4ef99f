"""Datasets built from episode stores: exports to LeRobot v3.0, to ODS-compatible TensorDicts, and to an RLinf
online-DAgger shard (LeRobot v2.1 layout, trainable labels only).

    items = select(EpisodeStore.open(path), task_id="fetch_push")     # or ExportItem(store, eid, trainable=...)
    export_lerobot(items, "out/lerobot")
    export_ods(items, "out/ods")

Formats and columns: docs/datasets.md, "Exports".
"""

from hg_dagger.datasets.export_lerobot import export_lerobot
from hg_dagger.datasets.export_ods import export_ods, load_ods
from hg_dagger.datasets.export_rlinf import export_rlinf
from hg_dagger.datasets.source import ExportError, ExportItem, ExportSummary, select

__all__ = ["ExportError", "ExportItem", "ExportSummary", "export_lerobot", "export_ods", "export_rlinf", "load_ods",
           "select"]
