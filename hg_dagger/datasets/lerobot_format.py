"""How store episodes become LeRobot v3.0 columns: the format's paths and sizes, which observation keys make
observation.state and observation.environment_state, the features of meta/info.json, the parquet schema, and one
arrow table per group of episodes (camera frames as PNG image structs)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hg_dagger.datasets.parquet import encode_pngs
from hg_dagger.datasets.source import EpisodeData, ExportError, task_mapping

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000  # files per chunk folder (LeRobot's default)
DATA_FILE_MB = 100  # a data file is closed once it holds about this much (LeRobot's default)
ROW_GROUP_ROWS = 65536
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
STATE = "observation.state"
ENV_STATE = "observation.environment_state"


def obs_column(key: str, image: bool) -> str:
    """LeRobot column of an observation key: observation.state, observation.robot.qpos, observation.images.rgb."""
    dotted = key.replace("/", ".")
    return f"observation.images.{dotted}" if image else f"observation.{dotted}"


@dataclass
class ColumnLayout:
    """How the store's observation keys become LeRobot columns."""

    composed: dict[str, tuple[list[str], list[str]]]  # observation.state / environment_state -> (keys, dim names)
    obs_cols: dict[str, str]  # obs/<key> -> per-key column (non-camera keys)
    image_cols: dict[str, str]  # obs/<key> -> observation.images.<key>
    action_names: list[str]
    obs_names: set[str] = field(default_factory=set)  # every obs/<key> field of the export


def column_layout(ep: EpisodeData, specs) -> ColumnLayout:
    """observation.state = the state the policy sees (the task mapping's flattened keys, in flatten order; without
    a known mapping every non-camera key in field order), observation.environment_state = the mapping's goal keys;
    the per-key columns and cameras keep their names."""
    mapping = task_mapping(ep.info, specs)
    plain = [n[4:] for n, sp in specs.items() if not sp.image]
    if mapping is not None:
        state = mapping.state_keys()
        env = list(mapping.export.environment_state)
        names = {k: mapping.dim_names(k) for k in state}
        action_names = list(mapping.action.names)
    else:
        state, env = plain, []
        action_names = [f"a{i}" for i in range(ep.arrays["applied_action"].shape[1])]
        names = {k: [f"{k}_{i}" for i in range(int(np.prod(specs[f"obs/{k}"].shape, dtype=np.int64)))] for k in state}
    missing = [k for k in state + env if f"obs/{k}" not in specs]
    if missing:
        raise ExportError(f"episode {ep.info.episode_id}: task {ep.info.start.task.task_id} exports observation key "
                          f"{missing[0]!r} as its state, but the episode has no field obs/{missing[0]}")
    if not state:
        raise ExportError(f"episode {ep.info.episode_id}: no non-camera observation key to export as {STATE}")
    composed = {STATE: (state, [x for k in state for x in names[k]])}
    if env:  # goal keys come from a task mapping
        assert mapping is not None
        composed[ENV_STATE] = (env, [x for k in env for x in names.get(k) or mapping.dim_names(k)])
    obs_cols, image_cols = {}, {}
    for n, sp in specs.items():
        col = obs_column(n[4:], sp.image)
        if sp.image:
            image_cols[n] = col
        elif col in composed:  # a key named like a composed column: written once, if it is all of it
            if composed[col][0] != [n[4:]]:
                raise ExportError(f"episode {ep.info.episode_id}: observation key {n[4:]!r} would be exported as "
                                  f"{col}, which holds the keys {composed[col][0]}; rename the key")
        else:
            obs_cols[n] = col
    return ColumnLayout(composed, obs_cols, image_cols, action_names, set(specs))


def _feature(dtype: str, shape: tuple[int, ...], names=None) -> dict:
    return {"dtype": dtype, "shape": list(shape) if shape else [1], "names": names}


def lerobot_features(ep: EpisodeData, specs, layout: ColumnLayout, codec, fps: float) -> dict:
    a = ep.arrays["applied_action"].shape[1]
    feats: dict[str, dict] = {}
    for col, (_keys, names) in layout.composed.items():
        feats[col] = {"dtype": "float32", "shape": [len(names)], "names": names}
    for name, col in layout.image_cols.items():
        shape = list(specs[name].shape)
        feats[col] = {"dtype": "video" if codec else "image", "shape": shape, "names": ["height", "width", "channels"]}
        if codec and (shape[0] % 2 or shape[1] % 2):
            raise ExportError(f"{name}: camera frames are {shape[0]}x{shape[1]}; --video (yuv420p) needs an even "
                              "height and width; export without --video (PNG frames)")
        if codec:
            feats[col]["info"] = {"video.height": shape[0], "video.width": shape[1], "video.codec": codec[1],
                                  "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": fps,
                                  "video.channels": 3, "has_audio": False}
    for name, col in layout.obs_cols.items():
        feats[col] = _feature(specs[name].dtype, tuple(specs[name].shape))
    feats["action"] = _feature("float32", (a,), layout.action_names)
    feats["expert_action"] = _feature("float32", (a,), layout.action_names)
    for col, dtype in (("expert_valid", "bool"), ("action_source", "int64"), ("intervene_flag", "bool"),
                       ("trainable", "bool"), ("label_mask", "int64"), ("label_target", "int64"), ("segment_id", "int64"),
                       ("segment_accepted", "bool"), ("continuity_id", "int64"), ("reward", "float32"),
                       ("done", "bool"), ("is_success", "bool"), ("timestamp", "float32"), ("frame_index", "int64"),
                       ("episode_index", "int64"), ("index", "int64"), ("task_index", "int64")):
        feats[col] = _feature(dtype, ())
    return feats


def parquet_schema(pa, features: dict):
    fields = []
    for col, ft in features.items():
        if ft["dtype"] == "video":  # in the mp4 files, not in the parquet
            continue
        if ft["dtype"] == "image":
            typ = _image_type(pa)
        else:
            base = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
            typ = base if ft["shape"] == [1] else pa.list_(base, int(np.prod(ft["shape"])))
        fields.append(pa.field(col, typ))
    return pa.schema(fields)


def _image_type(pa):
    return pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def episode_columns(ep: EpisodeData, lo: int, hi: int, layout: ColumnLayout, features, index0: int, episode: int,
                     task_index: int, fps: float, continuity: np.ndarray, *, label_action: bool) -> dict[str, np.ndarray]:
    """Every non-camera column of steps [lo, hi) of one store episode (one LeRobot episode) as numpy, in the
    feature dtypes."""
    t = hi - lo
    sl = slice(lo, hi)
    frame = np.arange(t, dtype=np.int64)
    a = ep.arrays
    cols: dict[str, np.ndarray] = {}
    for col, (keys, _names) in layout.composed.items():
        cols[col] = np.concatenate([a[f"obs/{k}"][sl].reshape(t, -1).astype(np.float32) for k in keys], 1)
    for name, col in layout.obs_cols.items():
        cols[col] = a[name][sl]
    trainable = ep.trainable[sl]
    cols["action"] = ep.label_action(lo, hi) if label_action else a["applied_action"][sl]
    cols["expert_action"] = a["expert_action"][sl]
    cols["expert_valid"] = a["expert_valid"][sl]
    cols["action_source"] = a["action_source"][sl]
    cols["intervene_flag"] = ep.intervention[sl] & trainable
    cols["trainable"] = trainable
    cols["label_mask"] = ep.label_mask[sl]
    cols["label_target"] = ep.label_target[sl]
    cols["segment_id"] = ep.segments()[sl]
    cols["segment_accepted"] = trainable
    cols["continuity_id"] = continuity[sl]
    cols["reward"] = a["reward"][sl]
    cols["done"] = a["terminated"][sl].astype(bool) | a["truncated"][sl].astype(bool)
    cols["is_success"] = a["success"][sl]
    cols["timestamp"] = (frame / fps).astype(np.float32)
    cols["frame_index"] = frame
    cols["episode_index"] = np.full(t, episode, np.int64)
    cols["index"] = index0 + frame
    cols["task_index"] = np.full(t, task_index, np.int64)
    out = {}
    for col, v in cols.items():
        ft = features[col]
        v = np.asarray(v).astype(ft["dtype"], copy=False)
        out[col] = v.reshape(t) if ft["shape"] == [1] else v.reshape(t, -1)
    return out


def arrow_table(pa, cols: dict[str, np.ndarray], frames: dict[str, np.ndarray], image_cols, schema):
    """One arrow table of many episodes' rows; camera frames become PNG image structs."""
    by_col = {c: n for n, c in image_cols.items()}
    arrays = []
    for f in schema:
        if f.name in by_col:
            pngs = encode_pngs(frames[by_col[f.name]])
            arrays.append(pa.array([{"bytes": b, "path": None} for b in pngs], type=f.type))
            continue
        v = cols[f.name]
        if v.ndim == 1:
            arrays.append(pa.array(v, type=f.type))
        else:
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(v).reshape(-1)), v.shape[1]))
    return pa.Table.from_arrays(arrays, schema=schema)
