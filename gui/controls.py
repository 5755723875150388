"""The settings panel: preset, target, draft, device, precision and prepack (here), γ, tree, coupling and
sampling (`decoding_fields`), scrolling; then the prompt, Run / Stop and the progress bar (`run_progress`), always in
view below the scrolling part."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from gui import theme
from gui.decoding_fields import MAX_TOKENS_UNKNOWN, DecodingFields, prepack_box, write_choice
from gui.draft_form import DraftForm
from gui.run_progress import ProgressReport
from gui.widgets import guard_wheel
from hfspec.errors import HfspecError
from hfspec.session import RunSettings, context_length

CUSTOM = "custom"
DTYPES = [("default", ""), ("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16"),
          ("auto (the checkpoint's)", "auto")]


def _available_presets() -> list[str]:
    try:
        from hfspec.io.presets import list_presets

        return list_presets()
    except (ImportError, HfspecError):
        return []


def _devices() -> list[tuple[str, str]]:
    import torch

    out = [("default", ""), ("cpu", "cpu")]
    if torch.cuda.is_available():
        out += [("cuda", "cuda")] + [(f"cuda:{i}", f"cuda:{i}") for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        out.append(("mps", "mps"))
    return out + [("auto", "auto")]


@dataclass
class Binding:
    """One RunSettings field on the form: how to read it, fill it, and the signals an edit fires."""

    read: Callable[[], object]
    write: Callable[[object], None]
    signals: tuple = ()
    preset_value: bool = True  # a preset sets it: editing it turns the preset box to "custom"


class ControlPanel(DecodingFields, ProgressReport, QWidget):
    """Emits `run_requested` / `stop_requested`; `settings()` reads the form, `set_settings()` fills it. Any edit
    of a preset's values turns the preset box to "custom"; choosing a preset (again) resets the form to it.
    Enter in any field (Ctrl+Enter in the prompt) runs; Tab leaves the prompt."""

    run_requested = Signal()
    stop_requested = Signal()
    edited = Signal()               # any field changed

    def __init__(self, parent=None):
        super().__init__(parent)
        self._filling = False
        self._preset_name = ""
        self.body = QWidget()
        layout = QVBoxLayout(self.body)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self._models_box())
        layout.addWidget(self._decoding_box())
        layout.addStretch(1)
        self.scroll = QScrollArea()
        self.scroll.setWidget(self.body)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.wheel_guard = guard_wheel(self.body)
        self.prompt_box = self._prompt_box()  # outside the scrolling part: always in view above Run

        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.run_button.setStyleSheet("font-weight: bold;")
        self.run_button.setToolTip("Generate with these settings (Enter, or Ctrl+R)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.setToolTip("End the run within one target pass (Esc)")
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.input_note = QLabel()
        self.input_note.setWordWrap(True)
        self.input_note.hide()
        footer = QVBoxLayout()
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button, 1)
        buttons.addWidget(self.stop_button, 1)
        footer.addWidget(self.input_note)
        footer.addLayout(buttons)
        footer.addWidget(self.progress)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 4)
        outer.addWidget(self.scroll, 1)
        outer.addWidget(self.prompt_box)
        outer.addLayout(footer)

        self.bindings = self._bindings()
        self.run_button.clicked.connect(self.run_requested)
        self.stop_button.clicked.connect(self.stop_requested)
        self.preset.activated.connect(lambda index: self._preset_chosen(self.preset.itemText(index)))
        for binding in self.bindings.values():
            for signal in binding.signals:
                signal.connect(self._edited if binding.preset_value else self.edited)
        self.target.textChanged.connect(self._limit_tokens)
        self.gamma_auto.toggled.connect(self._show_gamma)
        for combo in (self.tree, self.coupling):
            combo.currentIndexChanged.connect(self._check_tree_and_coupling)
        for spin in self.body.findChildren(QAbstractSpinBox):
            if hasattr(spin, "refused"):
                spin.refused.connect(lambda text, s=spin: self._refused(s, text))
                spin.valueChanged.connect(lambda _=None: self.show_input_note(""))
                spin.base_tip = spin.toolTip()
                _range_tip(spin)
        self._show_gamma(False)
        self._show_preset_info()
        # never narrower than its content: nothing clipped on the right (it scrolls vertically only)
        self.scroll.setMinimumWidth(self.body.minimumSizeHint().width()
                                    + self.scroll.verticalScrollBar().sizeHint().width())

    def _bindings(self) -> dict[str, Binding]:
        """Every RunSettings field but `preset` (the form's preset box says that), once."""
        def text(edit):
            return Binding(lambda: edit.text().strip(), lambda v: edit.setText(str(v)), (edit.textChanged,))

        def number(spin, kind):
            return Binding(spin.value, lambda v: spin.setValue(kind(v)), (spin.valueChanged,))

        def check(box, preset_value=True):
            return Binding(box.isChecked, lambda v: box.setChecked(bool(v)), (box.toggled,), preset_value)

        def choice(combo):
            return Binding(combo.currentData, lambda v: combo.setCurrentIndex(max(combo.findData(v or ""), 0)),
                           (combo.currentIndexChanged,), False)

        def write_gamma(value):
            self.gamma_auto.setChecked(value == "auto")
            if value != "auto":
                self.gamma.setValue(int(value))

        return {
            "target": text(self.target),
            "draft": Binding(self.draft.spec, self.draft.set_spec, (self.draft.changed,)),
            "gamma": Binding(lambda: "auto" if self.gamma_auto.isChecked() else self.gamma.value(), write_gamma,
                             (self.gamma.valueChanged, self.gamma_auto.toggled)),
            "temperature": number(self.temperature, float),
            "top_k": number(self.top_k, int),
            "top_p": number(self.top_p, float),
            "max_new_tokens": number(self.max_new_tokens, int),
            "seed": number(self.seed, int),
            "tree": Binding(self.tree.currentData, lambda v: write_choice(self.tree, v), (self.tree.currentIndexChanged,)),
            "coupling": Binding(self.coupling.currentData, lambda v: write_choice(self.coupling, v),
                                (self.coupling.currentIndexChanged,)),
            "prompt": Binding(self.prompt.toPlainText, self.prompt.setPlainText, (self.prompt.textChanged,)),
            "chat": check(self.chat),
            "measure_baseline": check(self.baseline, preset_value=False),
            "ignore_eos": check(self.ignore_eos),
            "device": choice(self.device),
            "dtype": choice(self.dtype),
            "prepack": check(self.prepack, preset_value=False),
        }

    # ----------------------------------------------------------------- building
    def _models_box(self) -> QGroupBox:
        box = QGroupBox("Models")
        form = QFormLayout(box)
        self.preset = QComboBox()
        self.preset.addItem(CUSTOM)
        self.preset.addItems(_available_presets())
        self.preset.setToolTip("A ready-made target/draft pair with its sampling settings (presets/*.toml); "
                               "choosing one again resets the form to it")
        self.preset_info = QLabel()
        self.preset_info.setWordWrap(True)
        self.preset_info.setStyleSheet(f"color: {theme.current().muted}; font-size: 11px;")
        form.addRow("Preset", self.preset)
        form.addRow(self.preset_info)
        self.target = QLineEdit()
        self.target.setPlaceholderText("model folder, hub id or .gguf")
        browse_dir = QToolButton(text="…")
        browse_dir.setToolTip("Choose a model folder")
        browse_dir.clicked.connect(self._browse_target_folder)
        self.browse_gguf = QToolButton(text="GGUF")
        self.browse_gguf.setToolTip("Choose a .gguf file")
        self.browse_gguf.clicked.connect(self._browse_target_gguf)
        row = QHBoxLayout()
        row.addWidget(self.target, 1)
        row.addWidget(browse_dir)
        row.addWidget(self.browse_gguf)
        form.addRow("Target", row)
        self.draft = DraftForm()
        form.addRow(self.draft)
        self.device = QComboBox()
        for text, value in _devices():
            self.device.addItem(text, value)
        self.device.setToolTip("Where the models run (default: the library's choice)")
        self.dtype = QComboBox()
        for text, value in DTYPES:
            self.dtype.addItem(text, value)
        self.dtype.setToolTip("Precision of the target (default: the library's choice)")
        form.addRow("Device", self.device)
        form.addRow("Precision", self.dtype)
        self.prepack = prepack_box()
        form.addRow("", self.prepack)
        return box

    def _prompt_box(self) -> QGroupBox:
        box = QGroupBox("Prompt")
        layout = QVBoxLayout(box)
        layout.setContentsMargins(4, 2, 4, 2)
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Text for the model to continue (Ctrl+Enter runs)")
        self.prompt.setTabChangesFocus(True)  # Tab moves on to Run, as in every other field
        self.prompt.setFixedHeight(84)
        self.prompt.installEventFilter(self)
        layout.addWidget(self.prompt)
        return box

    # ----------------------------------------------------------------- reading and filling
    def draft_spec(self) -> str:
        return self.draft.spec()

    def settings(self) -> RunSettings:
        """The form as RunSettings (HfspecError naming the field when something is missing)."""
        return RunSettings(preset=self._preset_name, **{name: b.read() for name, b in self.bindings.items()})

    def set_settings(self, s: RunSettings) -> None:
        self._filling = True
        try:
            self._preset_name = s.preset if self.preset.findText(s.preset) > 0 else ""
            self.preset.setCurrentIndex(max(self.preset.findText(self._preset_name or CUSTOM), 0))
            for name, binding in self.bindings.items():
                binding.write(getattr(s, name))
        finally:
            self._filling = False
        self._show_preset_info()
        self._check_tree_and_coupling()
        self.edited.emit()

    def set_draft(self, spec: str) -> None:
        self.draft.set_spec(spec)

    def choose_preset(self, name: str) -> bool:
        """Select a preset by name and fill the form from it; False when it is not in the list."""
        index = self.preset.findText(name)
        if index <= 0:
            return False
        self.preset.setCurrentIndex(index)
        self._preset_chosen(name)
        return True

    def set_busy(self, busy: bool, loading: bool = False) -> None:
        """While a job runs the form is read-only (the results will be of the settings it started with)."""
        self.run_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self.body.setEnabled(not busy)
        self.prompt.setReadOnly(busy)
        if busy and loading:
            self.progress.setRange(0, 0)  # indeterminate
            self.progress.setFormat("loading…")
        elif not busy and self.progress.maximum() == 0:
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
            self.progress.setFormat("")

    # ----------------------------------------------------------------- keys and refused input
    def keyPressEvent(self, event):  # noqa: N802 - Qt's name
        """Enter in a field (fields pass it on: line edits, spin boxes, boxes) runs."""
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and self.run_button.isEnabled():
            self.run_requested.emit()
            event.accept()
            return
        super().keyPressEvent(event)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt's name
        """Ctrl+Enter in the prompt runs (Enter alone is a new line of the prompt)."""
        if (obj is self.prompt and event.type() == QEvent.Type.KeyPress
                and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
                and event.modifiers() & Qt.KeyboardModifier.ControlModifier):
            if self.run_button.isEnabled():
                self.run_requested.emit()
            return True
        return super().eventFilter(obj, event)

    def _refused(self, spin, text: str) -> None:
        self.show_input_note(f"{spin.objectName()}: got {text!r}; allowed: {spin.range_text()} "
                             f"(kept {spin.textFromValue(spin.value())})")

    def _check_tree_and_coupling(self, *_) -> None:
        """Tree and coupling are checked by RunSettings as the user picks them: its error about either shows under
        the form (and goes once they agree); Run says it again and runs nothing."""
        try:
            self.settings().validated()
            message = ""
        except HfspecError as exc:
            message = str(exc) if str(exc).startswith(("tree:", "coupling:")) else ""
        if message or self.input_note.text().startswith(("tree:", "coupling:")):
            self.show_input_note(message)

    def show_input_note(self, message: str) -> None:
        """A message under the form about input it could not take ("" hides it)."""
        self.input_note.setText(message)
        self.input_note.setStyleSheet(f"color: {theme.current().error};")
        self.input_note.setVisible(bool(message))

    # ----------------------------------------------------------------- internals
    def _preset_chosen(self, name: str) -> None:
        if name == CUSTOM:
            self._preset_name = ""
            self._show_preset_info()
            return
        try:
            kept = {n: b.read() for n, b in self.bindings.items() if not b.preset_value}  # not a preset's values
            s = RunSettings.from_preset(name, **kept)
        except HfspecError as exc:
            self.preset_info.setText(f"<span style='color:{theme.current().error}'>{exc}</span>")
            return
        self.set_settings(s)

    def _edited(self, *_) -> None:
        self.edited.emit()
        if self._filling or not self._preset_name:
            return
        self.preset_info.setText(f"Custom: edited from {self._preset_name} (choose a preset to reset the form).")
        self._preset_name = ""
        self.preset.setCurrentIndex(0)

    def _show_preset_info(self) -> None:
        name = self._preset_name
        if not name:
            if not self.preset_info.text().startswith("Custom"):
                self.preset_info.setText("Custom: your own target, draft and settings.")
            return
        try:
            from hfspec.settings import load_preset

            p = load_preset(name)
            note = " · downloads from the Hugging Face hub" if p.needs_download else " · runs offline"
            self.preset_info.setText(p.description + note)
        except (ImportError, HfspecError) as exc:
            self.preset_info.setText(str(exc))

    def retheme(self) -> None:
        muted = f"color: {theme.current().muted};"
        self.preset_info.setStyleSheet(muted + " font-size: 11px;")
        self.gamma_auto_note.setStyleSheet(muted)
        self.input_note.setStyleSheet(f"color: {theme.current().error};")
        self.draft.restyle()

    def _limit_tokens(self, source: str) -> None:
        """Max new tokens cannot exceed the target's context (read from a local folder's config.json)."""
        limit = context_length(source)
        self.max_new_tokens.setMaximum(max(1, limit - 1) if limit else MAX_TOKENS_UNKNOWN)
        self.max_new_tokens.base_tip = (f"The target has {limit} positions for prompt and new tokens" if limit
                                        else "The target's context length is not known here")
        _range_tip(self.max_new_tokens)

    def _browse_target_folder(self):
        path = QFileDialog.getExistingDirectory(self, "Target model folder", self.target.text())
        if path:
            self.target.setText(path)

    def _browse_target_gguf(self):
        path, _ = QFileDialog.getOpenFileName(self, "Target GGUF file", self.target.text(), "GGUF (*.gguf)")
        if path:
            self.target.setText(path)


def _range_tip(spin) -> None:
    """The spin box's tooltip, with its allowed range."""
    base = getattr(spin, "base_tip", "")
    spin.setToolTip(f"{base}\nAllowed: {spin.range_text()}" if base else f"Allowed: {spin.range_text()}")
