"""Datasets built from episode stores, and their exports: LeRobot v3.0, ODS-compatible TensorDicts and RLinf
online-DAgger shards (LeRobot v2.1 layout, training labels only), each a record of the exporter registry
(``EXPORTERS``; other packages add formats through the entry point group ``hg_dagger.exporters``).

    items = select(EpisodeStore.open(path), task_id="fetch_push")     # or ExportItem(store, eid, trainable=...)
    export("lerobot", items, "out/lerobot", labels="trainable")       # any registered format, with its options
    export_ods(items, "out/ods")

Every format writes one training mask (``EpisodeData.trainable``, source.training_mask). Formats and columns:
docs/datasets.md, "Exports"; a new format: docs/extending.md, "An export format".
"""

from hg_dagger.datasets.export_lerobot import export_lerobot
from hg_dagger.datasets.export_ods import export_ods, load_ods
from hg_dagger.datasets.export_rlinf import export_rlinf
from hg_dagger.datasets.exporters import (
    EXPORTERS,
    Exporter,
    ExportError,
    ExportOption,
    ExportSummary,
    Training,
    export,
    format_names,
)
from hg_dagger.datasets.source import (
    EpisodeData,
    ExportItem,
    nothing_trainable,
    output_folder,
    read_episodes,
    select,
)

__all__ = ["EXPORTERS", "EpisodeData", "ExportError", "ExportItem", "ExportOption", "ExportSummary", "Exporter",
           "Training", "export", "export_lerobot", "export_ods", "export_rlinf", "format_names", "load_ods",
           "nothing_trainable", "output_folder", "read_episodes", "select"]
