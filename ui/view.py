"""The camera view of the watched env row: the newest frame, scaled to fit, aspect kept."""

from __future__ import annotations

import numpy as np
from PyQt6.QtCore import QRect, QSize, Qt
from PyQt6.QtGui import QColor, QFont, QImage, QPainter
from PyQt6.QtWidgets import QSizePolicy, QWidget

from hg_dagger.control.live import Snapshot

PLACEHOLDER = "no camera for this task"


class LiveView(QWidget):
    """Paints ``snap.frame`` (uint8 HxWx3) centred and letterboxed; a placeholder text when there is none."""

    MIN_SIDE = 256

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMinimumSize(self.MIN_SIDE, self.MIN_SIDE)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setAccessibleName("camera view")
        self._image: QImage | None = None
        self._frame: np.ndarray | None = None  # keeps the buffer the QImage points into alive
        self.message = PLACEHOLDER

    def sizeHint(self) -> QSize:
        return QSize(640, 480)

    @property
    def has_frame(self) -> bool:
        return self._image is not None

    @property
    def frame_size(self) -> tuple[int, int] | None:
        """(width, height) of the frame on show, or None."""
        return None if self._image is None else (self._image.width(), self._image.height())

    def show_snapshot(self, snap: Snapshot) -> None:
        self.set_frame(snap.frame)

    def set_frame(self, frame: np.ndarray | None) -> None:
        if frame is None:
            if self._image is not None or self.message != PLACEHOLDER:
                self._image, self._frame = None, None
                self.message = PLACEHOLDER
                self.update()
            return
        if frame is self._frame:
            return
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            self._image, self._frame = None, None
            self.message = f"cannot show frame: want uint8 [H, W, 3], got {frame.dtype} {list(frame.shape)}"
            self.update()
            return
        self.message = PLACEHOLDER
        data = np.ascontiguousarray(frame)
        h, w, _ = data.shape
        self._frame = frame
        self._data = data
        self._image = QImage(data.data, w, h, 3 * w, QImage.Format.Format_RGB888)
        self.update()

    def image_rect(self) -> QRect:
        """Where the frame is drawn: the largest rectangle of its aspect that fits, centred."""
        if self._image is None:
            return QRect()
        iw, ih = self._image.width(), self._image.height()
        scale = min(self.width() / iw, self.height() / ih)
        w, h = max(1, int(iw * scale)), max(1, int(ih * scale))
        return QRect((self.width() - w) // 2, (self.height() - h) // 2, w, h)

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        p = QPainter(self)
        p.fillRect(self.rect(), QColor("#15171a"))
        if self._image is None:
            p.setPen(QColor("#c8ccd2"))
            f = QFont(self.font())
            f.setPointSize(14)
            p.setFont(f)
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, self.message)
        else:
            p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
            p.drawImage(self.image_rect(), self._image)
        p.end()
