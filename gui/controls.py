"""The settings panel: preset, target, draft, device, γ, sampling, prompt (scrolling), and Run / Stop (always
in view below the scrolling part)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
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
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from gui.draft_form import DraftForm
from gui.widgets import guard_wheel
from hfspec.errors import HfspecError
from hfspec.session import GAMMA_MAX, RunSettings, context_length

CUSTOM = "custom"
MAX_TOKENS_UNKNOWN = 32768  # when the target's context length cannot be read
DTYPES = [("default", ""), ("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16"),
          ("auto (the checkpoint's)", "auto")]


def _available_presets() -> list[str]:
    try:
        from hfspec.presets import list_presets

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


class ControlPanel(QWidget):
    """Emits `run_requested` / `stop_requested`; `settings()` reads the form, `set_settings()` fills it. Any edit
    of a preset's values turns the preset box to "custom"; choosing a preset (again) resets the form to it."""

    run_requested = Signal()
    stop_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self._filling = False
        self._preset_name = ""
        body = QWidget()
        layout = QVBoxLayout(body)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self._models_box())
        layout.addWidget(self._decoding_box())
        layout.addWidget(self._prompt_box(), 1)
        self.scroll = QScrollArea()
        self.scroll.setWidget(body)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.wheel_guard = guard_wheel(body)

        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.run_button.setStyleSheet("font-weight: bold;")
        self.run_button.setToolTip("Generate with these settings (Ctrl+R)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.setToolTip("End the run within one target pass (Esc)")
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        footer = QVBoxLayout()
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button, 1)
        buttons.addWidget(self.stop_button, 1)
        footer.addLayout(buttons)
        footer.addWidget(self.progress)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 4)
        outer.addWidget(self.scroll, 1)
        outer.addLayout(footer)

        self.run_button.clicked.connect(self.run_requested)
        self.stop_button.clicked.connect(self.stop_requested)
        self.preset.activated.connect(lambda index: self._preset_chosen(self.preset.itemText(index)))
        for signal in (self.target.textChanged, self.draft.changed, self.gamma.valueChanged,
                       self.gamma_auto.toggled, self.temperature.valueChanged, self.top_k.valueChanged,
                       self.top_p.valueChanged, self.max_new_tokens.valueChanged, self.seed.valueChanged,
                       self.prompt.textChanged, self.chat.toggled, self.ignore_eos.toggled):
            signal.connect(self._edited)
        self.target.textChanged.connect(self._limit_tokens)
        self.gamma_auto.toggled.connect(self._show_gamma)
        self._show_gamma(False)
        self._show_preset_info()
        # never narrower than its content: nothing clipped on the right (it scrolls vertically only)
        self.scroll.setMinimumWidth(body.minimumSizeHint().width() + self.scroll.verticalScrollBar().sizeHint().width())

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
        self.preset_info.setStyleSheet("color: #555; font-size: 11px;")
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
        return box

    def _decoding_box(self) -> QGroupBox:
        box = QGroupBox("Decoding")
        form = QFormLayout(box)
        self.gamma = QSpinBox(minimum=1, maximum=GAMMA_MAX, value=4)
        self.gamma.setToolTip("Draft tokens proposed per target pass")
        self.gamma_auto = QCheckBox("auto")
        self.gamma_auto.setToolTip("Choose γ each pass from the running acceptance rate and measured cost")
        self.gamma_auto_note = QLabel("chosen each pass")
        self.gamma_auto_note.setStyleSheet("color: #555;")
        self.gamma_auto_note.setToolTip("The Live tab plots the γ chosen for every target pass")
        row = QHBoxLayout()
        row.addWidget(self.gamma, 1)
        row.addWidget(self.gamma_auto_note, 1)
        row.addWidget(self.gamma_auto)
        form.addRow("γ (draft length)", row)
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=5.0, singleStep=0.1, decimals=2, value=1.0)
        self.temperature.setToolTip("0 is greedy decoding")
        form.addRow("Temperature", self.temperature)
        self.top_k = QSpinBox(minimum=0, maximum=1_000_000, value=0)
        self.top_k.setSpecialValueText("off")
        form.addRow("Top-k", self.top_k)
        self.top_p = QDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2, value=1.0)
        self.top_p.setToolTip("1.00 is off")
        form.addRow("Top-p", self.top_p)
        self.max_new_tokens = QSpinBox(minimum=1, maximum=MAX_TOKENS_UNKNOWN, value=64)
        form.addRow("Max new tokens", self.max_new_tokens)
        self.seed = QSpinBox(minimum=0, maximum=2_147_483_647, value=1)
        form.addRow("Seed", self.seed)
        self.ignore_eos = QCheckBox("exactly max new tokens (ignore EOS)")
        self.ignore_eos.setToolTip("Suppress the end-of-text token until max new tokens are generated")
        form.addRow(self.ignore_eos)
        self.chat = QCheckBox("chat template")
        self.chat.setToolTip("Wrap the prompt as a user message in the tokenizer's chat template (models that have "
                             "one)")
        form.addRow(self.chat)
        self.baseline = QCheckBox("measure wall-clock speed-up")
        self.baseline.setToolTip("After each run, plain decoding of exactly as many tokens (same prompt and seed)")
        self.baseline.setChecked(True)
        form.addRow(self.baseline)
        return box

    def _prompt_box(self) -> QGroupBox:
        box = QGroupBox("Prompt")
        layout = QVBoxLayout(box)
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Text for the model to continue")
        self.prompt.setMinimumHeight(70)
        layout.addWidget(self.prompt)
        return box

    # ----------------------------------------------------------------- reading and filling
    def draft_spec(self) -> str:
        return self.draft.spec()

    def settings(self) -> RunSettings:
        """The form as RunSettings (HfspecError naming the field when something is missing)."""
        return RunSettings(
            target=self.target.text().strip(), draft=self.draft.spec(),
            gamma="auto" if self.gamma_auto.isChecked() else self.gamma.value(),
            temperature=self.temperature.value(), top_k=self.top_k.value(), top_p=self.top_p.value(),
            max_new_tokens=self.max_new_tokens.value(), seed=self.seed.value(),
            prompt=self.prompt.toPlainText(), preset=self._preset_name, chat=self.chat.isChecked(),
            measure_baseline=self.baseline.isChecked(), ignore_eos=self.ignore_eos.isChecked(),
            device=self.device.currentData(), dtype=self.dtype.currentData(),
        )

    def set_settings(self, s: RunSettings) -> None:
        self._filling = True
        try:
            self._preset_name = s.preset if self.preset.findText(s.preset) > 0 else ""
            self.preset.setCurrentIndex(max(self.preset.findText(self._preset_name or CUSTOM), 0))
            self.target.setText(s.target)
            self.draft.set_spec(s.draft)
            self.gamma_auto.setChecked(s.gamma == "auto")
            if s.gamma != "auto":
                self.gamma.setValue(int(s.gamma))
            self.temperature.setValue(float(s.temperature))
            self.top_k.setValue(int(s.top_k))
            self.top_p.setValue(float(s.top_p))
            self.max_new_tokens.setValue(int(s.max_new_tokens))
            self.seed.setValue(int(s.seed))
            self.prompt.setPlainText(s.prompt)
            self.chat.setChecked(bool(s.chat))
            self.ignore_eos.setChecked(bool(s.ignore_eos))
            self.baseline.setChecked(bool(s.measure_baseline))
            self.device.setCurrentIndex(max(self.device.findData(s.device or ""), 0))
            self.dtype.setCurrentIndex(max(self.dtype.findData(s.dtype or ""), 0))
        finally:
            self._filling = False
        self._show_preset_info()

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
        self.run_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        if busy and loading:
            self.progress.setRange(0, 0)  # indeterminate
            self.progress.setFormat("loading…")
        elif not busy and self.progress.maximum() == 0:
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
            self.progress.setFormat("")

    def set_progress(self, value: int, maximum: int) -> None:
        self.progress.setRange(0, max(1, maximum))
        self.progress.setValue(min(value, maximum))
        self.progress.setFormat("%v / %m tokens")

    def set_point(self, index: int, total: int) -> None:
        """Sweep / compare: point `index` (from 1) of `total` is being measured."""
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(index - 1)
        self.progress.setFormat(f"point {index} / {total}")

    # ----------------------------------------------------------------- internals
    def _preset_chosen(self, name: str) -> None:
        if name == CUSTOM:
            self._preset_name = ""
            self._show_preset_info()
            return
        try:
            s = RunSettings.from_preset(name, measure_baseline=self.baseline.isChecked(),
                                        device=self.device.currentData(), dtype=self.dtype.currentData())
        except HfspecError as exc:
            self.preset_info.setText(f"<span style='color:#a00'>{exc}</span>")
            return
        self.set_settings(s)

    def _edited(self, *_) -> None:
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
            from hfspec.presets import load_preset

            p = load_preset(name)
            note = " · downloads from the Hugging Face hub" if p.needs_download else " · runs offline"
            self.preset_info.setText(p.description + note)
        except (ImportError, HfspecError) as exc:
            self.preset_info.setText(str(exc))

    def _show_gamma(self, auto: bool) -> None:
        self.gamma.setVisible(not auto)
        self.gamma_auto_note.setVisible(auto)

    def _limit_tokens(self, source: str) -> None:
        """Max new tokens cannot exceed the target's context (read from a local folder's config.json)."""
        limit = context_length(source)
        self.max_new_tokens.setMaximum(max(1, limit - 1) if limit else MAX_TOKENS_UNKNOWN)
        self.max_new_tokens.setToolTip(f"At most {limit - 1}: the target has {limit} positions for prompt and "
                                       "new tokens" if limit else "The target's context length is not known here")

    def _browse_target_folder(self):
        path = QFileDialog.getExistingDirectory(self, "Target model folder", self.target.text())
        if path:
            self.target.setText(path)

    def _browse_target_gguf(self):
        path, _ = QFileDialog.getOpenFileName(self, "Target GGUF file", self.target.text(), "GGUF (*.gguf)")
        if path:
            self.target.setText(path)
