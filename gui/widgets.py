"""Small widgets the views share: metric cards that wrap (a flow layout), a wheel guard for inputs, spin boxes
that say when they refuse input."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QComboBox,
    QDoubleSpinBox,
    QLabel,
    QLayout,
    QSizePolicy,
    QSpinBox,
    QWidget,
)

from gui import theme


def card_style(flagged: bool = False) -> str:
    t = theme.current()
    border = f"2px solid {t.rough}" if flagged else f"1px solid {t.card_border}"
    return f"QLabel {{ background: {t.card_bg}; border: {border}; border-radius: 4px; padding: 3px 6px; }}"


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


PLACEHOLDERS = ("after run", "—")  # what a card shows before its value exists: it must fit too


class Metric(QLabel):
    """A number with a caption, wide enough for `template` (its widest expected value) and for the placeholders
    ("after run") so that new values never clip nor move the other cards."""

    def __init__(self, caption: str, tooltip: str = "", template: str = "00.00×"):
        super().__init__()
        self.caption = caption
        self.tip = tooltip
        self.flag = ""
        self.setToolTip(tooltip)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setStyleSheet(card_style())
        size = QSize()
        for text in (template, *PLACEHOLDERS):
            self.set_value(text)
            size = size.expandedTo(self.sizeHint())
        self.setFixedSize(size + QSize(4, 2))  # room for a flagged card's thicker border
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.set_value("—")

    def set_value(self, text: str) -> None:
        self.value_text = text
        t = theme.current()
        value_style = "font-size:15px;font-weight:600" + (f";color:{t.rough}" if self.flag else "")
        self.setText(f"<div style='font-size:10px;color:{t.muted}'>{self.caption}</div>"
                     f"<div style='{value_style}'>{text}</div>")

    def set_flag(self, why: str) -> None:
        """Mark the value as unreliable (`why` joins the tooltip); "" clears the mark."""
        self.flag = why
        self.setToolTip(f"{self.tip}\n\n{why}" if why else self.tip)
        self.restyle()

    def restyle(self) -> None:
        self.setStyleSheet(card_style(bool(self.flag)))
        self.set_value(self.value_text)


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


class _Checked:
    """Spin box part: input the box cannot take (out of range, a minus sign where none is allowed) is reported
    through `refused(text)` instead of being dropped silently."""

    def validate(self, text, pos):
        result = super().validate(text, pos)
        state = result[0] if isinstance(result, tuple) else result
        if state == QValidator.State.Invalid and text.strip():
            self.refused.emit(text.strip())
        return result

    def range_text(self) -> str:
        return f"{self.textFromValue(self.minimum())} to {self.textFromValue(self.maximum())}"


class CheckedSpinBox(_Checked, QSpinBox):
    refused = Signal(str)


class CheckedDoubleSpinBox(_Checked, QDoubleSpinBox):
    refused = Signal(str)
