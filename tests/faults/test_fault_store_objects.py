"""Store objects cut short (a data chunk, a label-layer JSON, array and segment metadata): a clear error naming the
episode and the object, the rest of the store readable, validate reporting it, the CLI without a traceback."""

from __future__ import annotations

import pytest
from support.store import check_steps, end, fields, record, start, step

from hg_dagger.cli import main
from hg_dagger.errors import StoreError
from hg_dagger.store import EpisodeStore, validate_store


def _two_segments(path) -> tuple[str, str]:
    """Episode a in one segment, episode b in another (two recorder sessions)."""
    with EpisodeStore.create(path).recorder() as rec:
        a = record(rec, 0, 12, window=(3, 6))
    with EpisodeStore.open(path, mode="a").recorder() as rec:
        b = record(rec, 1, 12, window=(3, 6))
    return a, b


def _segment_of(path, eid: str):
    return path / "segments" / EpisodeStore.open(path).info(eid).segment_id


def _cut(file, keep: float = 0.5) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])


def _no_traceback(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return captured.out + captured.err


def test_a_truncated_data_chunk_names_episode_and_field_and_the_rest_reads(tmp_path, capsys):
    path = tmp_path / "s"
    a, b = _two_segments(path)
    _cut(_segment_of(path, a) / "data" / "applied_action" / "c" / "0" / "0")
    store = EpisodeStore.open(path)
    with pytest.raises(StoreError, match=f"episode {a}: field 'applied_action' unreadable in segment") as err:
        store.read_steps(a)
    assert "\n" not in str(err.value)
    assert store.read_steps(a, ["t_obs"])["t_obs"].shape == (12,)  # its other fields still read
    check_steps(store.load(b), 1, 12)  # the other segment is untouched
    assert any(v.field == "applied_action" and "data unreadable" in v.message for v in validate_store(store))
    assert main(["validate", str(path)]) == 1
    assert "field 'applied_action'" in _no_traceback(capsys)


def test_a_label_layer_json_cut_short_names_episode_and_layer_and_the_rest_reads(tmp_path, capsys):
    path = tmp_path / "s"
    a, b = _two_segments(path)
    store = EpisodeStore.open(path, mode="a")
    for eid in (a, b):
        assert store.write_labels(eid, author="reviewer") == 2
    _cut(path / "labels" / a / "v2.json")
    store = EpisodeStore.open(path, mode="a")
    with pytest.raises(StoreError, match=f"episode {a}: label layer 2 is corrupt") as err:
        store.labels(a)
    assert "\n" not in str(err.value)
    assert store.labels(a, version=1).version == 1 and store.labels(b).version == 2
    check_steps(store.load(b), 1, 12)
    with pytest.raises(StoreError, match=f"episode {a}: label layer 2 is corrupt"):
        store.write_labels(a, author="reviewer")  # never builds on a layer it cannot read
    assert [str(v) for v in validate_store(store)] == [f"episode {a} field 'labels': label layer 2 is corrupt "
                                                       f"({str(err.value).split('corrupt (', 1)[1]}"]
    assert main(["validate", str(path)]) == 1
    assert f"episode {a} field 'labels': label layer 2 is corrupt" in _no_traceback(capsys)
    assert main(["store", "info", str(path), a]) == 2
    assert f"error: episode {a}: label layer 2 is corrupt" in _no_traceback(capsys)


def test_truncated_array_metadata_names_the_field(tmp_path, capsys):
    path = tmp_path / "s"
    a, b = _two_segments(path)
    _cut(_segment_of(path, a) / "data" / "obs" / "state" / "zarr.json")
    store = EpisodeStore.open(path)
    with pytest.raises(StoreError, match=f"episode {a}: field 'obs/state' unreadable"):
        store.read_steps(a)
    check_steps(store.load(b), 1, 12)
    assert any(v.field == "obs/state" for v in validate_store(store))
    assert main(["validate", str(path)]) == 1
    _no_traceback(capsys)


def test_truncated_segment_metadata_is_damage_named_by_segment_and_the_rest_reads(tmp_path, capsys):
    path = tmp_path / "s"
    a, b = _two_segments(path)
    seg = _segment_of(path, a)
    _cut(seg / "zarr.json")
    store = EpisodeStore.open(path)
    assert not store.has_episode(a) and store.warnings == []  # corrupt, not merely uncommitted
    check_steps(store.load(b), 1, 12)
    assert [str(v) for v in validate_store(store)] == [
        f"store: {msg}" for _, msg in store.damaged] and f"segment {seg.name}: unreadable segment metadata" in \
        store.damaged[0][1]
    assert main(["validate", str(path)]) == 1
    assert f"segment {seg.name}: unreadable segment metadata" in _no_traceback(capsys)


def test_a_truncated_root_metadata_is_one_line(tmp_path, capsys):
    path = tmp_path / "s"
    EpisodeStore.create(path)
    _cut(path / "zarr.json")
    assert main(["store", "ls", str(path)]) == 2
    out = _no_traceback(capsys)
    assert f"error: {path}: not a readable zarr v3 store" in out and len(out.strip().splitlines()) == 1


def test_steps_put_after_a_fault_never_mix_with_committed_ones(tmp_path):
    """A recorder on a store with a damaged segment still records into its own new segment."""
    path = tmp_path / "s"
    a, b = _two_segments(path)
    _cut(_segment_of(path, a) / "data" / "applied_action" / "c" / "0" / "0")
    with EpisodeStore.open(path, mode="a").recorder() as rec:
        eid = rec.begin_episode(start(), fields())
        for t in range(5):
            rec.put(eid, step(9, t))
        rec.end_episode(eid, end(5))
    store = EpisodeStore.open(path)
    check_steps(store.read_steps(eid), 9, 5)
    assert all(v.episode_id != eid for v in validate_store(store))
