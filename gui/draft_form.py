"""The draft part of the settings panel, built from the draft registry: one page of inputs per registered kind,
from that kind's fields (an int range, a choice, or a folder / hub id), so a new kind needs no GUI change."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSizePolicy,
    QSpinBox,
    QStackedWidget,
    QToolButton,
    QWidget,
)

from gui import theme
from hfspec.drafts import registry
from hfspec.errors import HfspecError
from hfspec.session import draft_spec, split_draft_spec

KIND_CHARS = 22  # the draft kind box's width in characters (longer kinds are elided in the box, whole in its list)
LABEL_CHARS = 14  # a longer field title goes on two lines: one long label ("head logits re-scored") widened the
                  # whole form, to 440 of the window's 1024 pixels


class DraftForm(QWidget):
    """Kind combo, the kind's inputs, and the resulting spec string. `changed` fires on every edit."""

    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        self.kind = QComboBox()
        self.stack = QStackedWidget()
        self.inputs: dict[str, dict[str, QWidget]] = {}
        for kind in registry.choices():
            self.kind.addItem(kind.title, kind.name)
            page = QWidget()
            fields = QFormLayout(page)
            fields.setContentsMargins(0, 0, 0, 0)
            self.inputs[kind.name] = {}
            for f in kind.fields:
                widget, row = _input_for(f, self)
                self.inputs[kind.name][f.name] = widget
                fields.addRow(label_text(f.title), row)
                _signal_of(widget).connect(self._edited)
            self.stack.addWidget(page)
        self.kind.setToolTip("\n".join(f"{k.title}: {k.allowed}" for k in registry.choices()))
        # as narrow as KIND_CHARS, not as its longest kind ("8-bit copy, one scale per output row (int8 kernel)"
        # made the form 440 of 1024 pixels wide); the list that drops down shows each kind whole
        self.kind.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.kind.setMinimumContentsLength(KIND_CHARS)
        widest = max(self.kind.fontMetrics().horizontalAdvance(self.kind.itemText(i)) for i in range(self.kind.count()))
        self.kind.view().setMinimumWidth(widest + 32)
        self.spec_label = QLabel()
        self.spec_label.setWordWrap(True)
        form.addRow("Draft", self.kind)
        form.addRow(self.stack)
        form.addRow("Draft spec", self.spec_label)
        self.kind.currentIndexChanged.connect(self.stack.setCurrentIndex)
        self.kind.currentIndexChanged.connect(self._fit_page)
        self.kind.currentIndexChanged.connect(self._edited)
        self._fit_page(self.kind.currentIndex())
        self._edited()

    def _fit_page(self, index: int) -> None:
        """The stack as tall as the shown kind's page (not the tallest kind's: a gap under short pages); as wide
        as the widest, so no kind is clipped when chosen later."""
        for i in range(self.stack.count()):
            vertical = QSizePolicy.Policy.Preferred if i == index else QSizePolicy.Policy.Ignored
            self.stack.widget(i).setSizePolicy(QSizePolicy.Policy.Preferred, vertical)
        self.stack.updateGeometry()

    def input(self, kind: str, name: str) -> QWidget:
        """The input widget of one field of one kind."""
        return self.inputs[kind][name]

    def kind_name(self) -> str:
        return self.kind.currentData()

    def values(self) -> dict:
        return {name: _read(widget) for name, widget in self.inputs[self.kind_name()].items()}

    def spec(self) -> str:
        """The spec string (HfspecError naming the field when an input is empty or out of range)."""
        return draft_spec(self.kind_name(), **self.values())

    def set_spec(self, spec: str) -> None:
        values = split_draft_spec(spec)
        index = self.kind.findData(values["kind"])
        self.kind.setCurrentIndex(max(index, 0))
        for name, widget in self.inputs.get(values["kind"], {}).items():
            if name in values:
                _write(widget, values[name])
        self._edited()

    def _edited(self, *_) -> None:
        self.restyle()
        self.changed.emit()

    def restyle(self) -> None:
        """The spec line in the current theme's colours (an error in its error colour)."""
        try:
            self.spec_label.setText(self.spec())
            colour = theme.current().spec
        except HfspecError as exc:
            self.spec_label.setText(str(exc).split(";")[0])
            colour = theme.current().error
        self.spec_label.setStyleSheet(f"font-family: monospace; color: {colour};")


def label_text(title: str) -> str:
    """A field's label: on two lines, split at the space nearest its middle, when longer than LABEL_CHARS."""
    words = title.split(" ")
    if len(title) <= LABEL_CHARS or len(words) < 2:
        return title
    cut = min(range(1, len(words)), key=lambda i: abs(len(" ".join(words[:i])) - len(" ".join(words[i:]))))
    return " ".join(words[:cut]) + "\n" + " ".join(words[cut:])


def _input_for(f, parent: QWidget) -> tuple[QWidget, QWidget]:
    """(the input, the row to place) for a registry Field."""
    if f.text:
        edit = QLineEdit(str(f.default or ""))
        edit.setPlaceholderText(f.title)
        browse = QToolButton(text="…")
        browse.setToolTip("Choose a folder")
        browse.clicked.connect(lambda: _browse_folder(parent, edit))
        row = QWidget()
        line = QHBoxLayout(row)
        line.setContentsMargins(0, 0, 0, 0)
        line.addWidget(edit, 1)
        line.addWidget(browse)
        return edit, row
    if f.choices:
        combo = QComboBox()
        for choice in f.choices:
            combo.addItem(str(choice), choice)
        _write(combo, f.default)
        return combo, combo
    if isinstance(f.default, int):
        spin = QSpinBox(minimum=f.low if f.low is not None else 0,
                        maximum=f.high if f.high is not None else 1_000_000, value=int(f.default))
        return spin, spin
    edit = QLineEdit(str(f.default or ""))
    return edit, edit


def _signal_of(widget: QWidget):
    if isinstance(widget, QLineEdit):
        return widget.textChanged
    if isinstance(widget, QComboBox):
        return widget.currentIndexChanged
    return widget.valueChanged


def _read(widget: QWidget):
    if isinstance(widget, QLineEdit):
        return widget.text()
    if isinstance(widget, QComboBox):
        return widget.currentData()
    return widget.value()


def _write(widget: QWidget, value) -> None:
    if isinstance(widget, QLineEdit):
        widget.setText("" if value is None else str(value))
    elif isinstance(widget, QComboBox):
        index = widget.findData(value)
        if index < 0:  # a value the registry allows but the list does not show (e.g. group 48)
            widget.addItem(str(value), value)
            index = widget.count() - 1
        widget.setCurrentIndex(index)
    elif value is not None:
        widget.setValue(int(value))


def _browse_folder(parent: QWidget, edit: QLineEdit) -> None:
    path = QFileDialog.getExistingDirectory(parent, "Draft model folder", edit.text())
    if path:
        edit.setText(path)
