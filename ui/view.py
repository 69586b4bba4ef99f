"""The camera view of the watched env row: the newest frame, scaled to fit, aspect kept.

Each frame is converted once to Qt's native 32-bit format and drawn with nearest-neighbour scaling:
smooth scaling of a 24-bit image costs several milliseconds of CPU per frame at window size, time the
control loop shares; a 32-bit nearest-neighbour blit costs a fraction of one.
"""

from __future__ import annotations

import numpy as np
from PyQt6.QtCore import QRect, QSize, Qt
from PyQt6.QtGui import QColor, QFont, QImage, QPainter
from PyQt6.QtWidgets import QSizePolicy, QWidget

from hg_dagger.control.live import Snapshot

PLACEHOLDER = "no camera for this task"
LOADING = "loading the session..."  # until the control loop has built its env
BACKGROUND = QColor("#15171a")


class LiveView(QWidget):
    """Paints ``snap.frame`` (uint8 HxWx3) centred and letterboxed; a placeholder text when there is none."""

    MIN_SIDE = 256
    MESSAGE_PT = 14  # the placeholder's text

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMinimumSize(self.MIN_SIDE, self.MIN_SIDE)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setAccessibleName("camera view")
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)  # paintEvent fills every pixel
        self._image: QImage | None = None
        self._frame: np.ndarray | None = None  # the array on show (a new snapshot's frame is a new array)
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
        self.set_frame(snap.frame, loading=snap.loading or snap.phase == "loading")

    def set_frame(self, frame: np.ndarray | None, *, loading: bool = False) -> None:
        if frame is None:
            placeholder = LOADING if loading else PLACEHOLDER
            if self._image is not None or self.message != placeholder:
                self._image, self._frame = None, None
                self.message = placeholder
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
        # convertToFormat copies, so the QImage no longer points into the numpy buffer (PyQt takes any buffer;
        # its stubs say bytes)
        self._image = QImage(data.data, w, h, 3 * w,  # type: ignore[call-overload]
                             QImage.Format.Format_RGB888).convertToFormat(QImage.Format.Format_RGB32)
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
        if self._image is None:
            p.fillRect(self.rect(), BACKGROUND)
            p.setPen(QColor("#c8ccd2"))
            f = QFont(self.font())
            f.setPointSize(self.MESSAGE_PT)
            p.setFont(f)
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, self.message)
        else:
            r = self.image_rect()  # fill only the letterbox bars: the frame covers the rest
            w, h = self.width(), self.height()
            for bar in (QRect(0, 0, w, r.top()), QRect(0, r.top() + r.height(), w, h - r.top() - r.height()),
                        QRect(0, r.top(), r.left(), r.height()),
                        QRect(r.left() + r.width(), r.top(), w - r.left() - r.width(), r.height())):
                if bar.width() > 0 and bar.height() > 0:
                    p.fillRect(bar, BACKGROUND)
            p.drawImage(r, self._image)
        p.end()
