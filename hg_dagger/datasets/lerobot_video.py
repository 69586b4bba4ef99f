"""Camera frames of a LeRobot export as mp4 (``--video``): the codecs, checked before anything is written, and one
file per camera and episode."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np

from hg_dagger.datasets.lerobot_format import CHUNKS_SIZE, VIDEO_PATH
from hg_dagger.datasets.source import ExportError

# --video NAME -> (PyAV encoder, LeRobot's video.codec name, encoder options)
VIDEO_CODECS = {"h264": ("libx264", "h264", {"crf": "18", "preset": "veryfast"}),
                "av1": ("libsvtav1", "av1", {"crf": "30", "preset": "8"})}


def video_codec(name: str) -> tuple[str, str, dict]:
    """(PyAV encoder, LeRobot codec name, options) of ``--video NAME``; one line when PyAV or its encoder is
    missing, before anything is written."""
    if name not in VIDEO_CODECS:
        raise ExportError(f"--video {name}: unknown codec; choose {' or '.join(VIDEO_CODECS)}")
    encoder, lerobot_name, options = VIDEO_CODECS[name]
    try:
        import av
    except ImportError:
        raise ExportError(f"--video {name} needs PyAV: pip install 'hg-dagger[export]'") from None
    try:
        av.codec.Codec(encoder, "w")
    except Exception:  # av.codec.codec.UnknownCodecError, whose import path differs across PyAV versions
        raise ExportError(f"--video {name}: this machine's PyAV (av {av.__version__}) has no {encoder} encoder; "
                          "export without --video (PNG frames) or install a PyAV build with it") from None
    return encoder, lerobot_name, options


class VideoWriter:
    """One mp4 per camera and LeRobot episode (videos/<camera>/chunk-CCC/file-FFF.mp4, FFF the episode's index
    within its chunk), frame i at pts i with time base 1 / fps, so frame times equal the rows' timestamps."""

    def __init__(self, root: Path, codec, fps: float):
        self.root = root
        self.encoder, self.name, self.options = codec
        self.fps = fps

    def write(self, col: str, episode: int, frames: np.ndarray, meta: dict[str, list]) -> None:
        # av deferred: the export extra, optional
        import av

        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its whole configuration at info level
        chunk, file = divmod(episode, CHUNKS_SIZE)
        path = self.root / VIDEO_PATH.format(video_key=col, chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        rate = Fraction(self.fps).limit_denominator(1_000_000)
        with av.open(str(path), "w") as container:
            stream = container.add_stream(self.encoder, rate=rate, options=dict(self.options))
            stream.height, stream.width = int(frames.shape[1]), int(frames.shape[2])
            stream.pix_fmt = "yuv420p"
            stream.time_base = 1 / rate
            for i, f in enumerate(frames):
                rgb = f if f.shape[-1] == 3 else np.repeat(f[..., :1], 3, -1)
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
                frame.pts = i
                container.mux(stream.encode(frame))
            container.mux(stream.encode())
        for k, v in ((f"videos/{col}/chunk_index", chunk), (f"videos/{col}/file_index", file),
                     (f"videos/{col}/from_timestamp", 0.0), (f"videos/{col}/to_timestamp", len(frames) / self.fps)):
            meta.setdefault(k, []).append(v)
