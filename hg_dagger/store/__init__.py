"""The episode store: crash-safe zarr v3 recording of raw steps, versioned label layers, readers and validation.

    store = EpisodeStore.create(path_or_url)
    with store.recorder(flush_interval_s=0.5) as rec:
        eid = rec.begin_episode(start, fields); rec.put(eid, step); ...; rec.end_episode(eid, end, windows)
        rec.put_rows([eid_a, eid_b], columns)   # one step of each episode as (2, ...) columns, as a vec env holds them
    td = store.load(eid)

On-disk layout: docs/data-format.md.
"""

from hg_dagger.store.labels import LabelLayer
from hg_dagger.store.recorder import Recorder, RecorderStats
from hg_dagger.store.store import EpisodeInfo, EpisodeStore
from hg_dagger.store.validate import Violation, validate_store

__all__ = ["EpisodeStore", "EpisodeInfo", "LabelLayer", "Recorder", "RecorderStats", "Violation", "validate_store"]
