"""Small widgets the views share: metric cards that wrap (a flow layout), and a wheel guard for inputs."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QAbstractSpinBox, QComboBox, QLabel, QLayout, QSizePolicy, QWidget

CARD_STYLE = "QLabel { background: #f4f6f8; border: 1px solid #d8dde3; border-radius: 4px; padding: 3px 6px; }"


class FlowLayout(QLayout):
    """Items left to right, wrapping to the next line when the width runs out (Qt's flow layout example)."""

    def __init__(self, parent=None, spacing: int = 4):
        super().__init__(parent)
        self._items = []
        self.setSpacing(spacing)
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item):  # noqa: N802 - Qt's name
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int):  # noqa: N802 - Qt's name
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int):  # noqa: N802 - Qt's name
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self):  # noqa: N802 - Qt's name
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt's name
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt's name
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 - Qt's name
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return self.minimumSize()

    def minimumSize(self) -> QSize:  # noqa: N802 - Qt's name
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        margins = self.contentsMargins()
        return size + QSize(margins.left() + margins.right(), margins.top() + margins.bottom())

    def _place(self, rect: QRect, move: bool) -> int:
        x, y, line = rect.x(), rect.y(), 0
        gap = self.spacing()
        for item in self._items:
            hint = item.sizeHint()
            if x + hint.width() > rect.right() + 1 and line > 0:
                x, y, line = rect.x(), y + line + gap, 0
            if move:
                item.setGeometry(QRect(QPoint(x, y), hint))
            x += hint.width() + gap
            line = max(line, hint.height())
        return y + line - rect.y()


class Metric(QLabel):
    """A number with a caption, wide enough for `template` (its widest expected value) so that new values
    never clip nor move the other cards."""

    def __init__(self, caption: str, tooltip: str = "", template: str = "00.00×"):
        super().__init__()
        self.caption = caption
        self.setToolTip(tooltip)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setStyleSheet(CARD_STYLE)
        self.set_value(template)
        self.setFixedSize(self.sizeHint())
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.set_value("—")

    def set_value(self, text: str) -> None:
        self.value_text = text
        self.setText(f"<div style='font-size:10px;color:#555'>{self.caption}</div>"
                     f"<div style='font-size:15px;font-weight:600'>{text}</div>")


class WheelGuard(QObject):
    """Spin boxes and combo boxes take the mouse wheel only when focused; otherwise the wheel scrolls the panel
    they sit in (the event is left unaccepted, so Qt passes it to the parent)."""

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt's name
        if event.type() == QEvent.Type.Wheel and isinstance(obj, QWidget) and not obj.hasFocus():
            event.ignore()
            return True
        return False


def guard_wheel(root: QWidget) -> WheelGuard:
    """Install one WheelGuard (owned by `root`) on every spin box and combo box under `root`."""
    guard = WheelGuard(root)
    for widget in root.findChildren(QAbstractSpinBox) + root.findChildren(QComboBox):
        widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # the wheel must not focus it either
        widget.installEventFilter(guard)
    return guard
