"""The settings panel: preset, target, draft, γ, sampling, prompt, Run / Stop."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from hfspec.errors import HfspecError
from hfspec.session import BNB_TYPES, GAMMA_MAX, RunSettings, draft_spec, split_draft_spec

CUSTOM = "(custom)"


def _available_presets() -> list[str]:
    try:
        from hfspec.presets import list_presets
    except ImportError:
        return []
    try:
        return list_presets()
    except HfspecError:
        return []


class ControlPanel(QWidget):
    """Emits `run_requested` / `stop_requested`; `settings()` reads the form, `set_settings()` fills it."""

    run_requested = Signal()
    stop_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)

        # --- models
        models = QGroupBox("Models")
        form = QFormLayout(models)
        self.preset = QComboBox()
        self.preset.addItem(CUSTOM)
        self.preset.addItems(_available_presets())
        self.preset.setToolTip("A ready-made target/draft pair with its sampling settings (presets/*.toml)")
        self.preset_info = QLabel()
        self.preset_info.setWordWrap(True)
        self.preset_info.setStyleSheet("color: #555; font-size: 11px;")
        form.addRow("Preset", self.preset)
        form.addRow(self.preset_info)

        self.target = QLineEdit()
        self.target.setPlaceholderText("model folder, hub id (owner/name) or .gguf file")
        browse_dir = QToolButton(text="…")
        browse_dir.setToolTip("Choose a model folder")
        browse_dir.clicked.connect(self._browse_target_folder)
        browse_gguf = QToolButton(text="GGUF")
        browse_gguf.setToolTip("Choose a .gguf file")
        browse_gguf.clicked.connect(self._browse_target_gguf)
        row = QHBoxLayout()
        row.addWidget(self.target, 1)
        row.addWidget(browse_dir)
        row.addWidget(browse_gguf)
        form.addRow("Target", row)

        self.draft_kind = QComboBox()
        self.draft_kind.addItem("quantised copy (RTN)", "rtn")
        self.draft_kind.addItem("quantised copy (bitsandbytes)", "bnb")
        self.draft_kind.addItem("sibling model", "sibling")
        form.addRow("Draft", self.draft_kind)
        self.draft_stack = QStackedWidget()
        rtn = QWidget()
        rtn_row = QHBoxLayout(rtn)
        rtn_row.setContentsMargins(0, 0, 0, 0)
        self.bits = QSpinBox(minimum=2, maximum=8, value=4, suffix=" bit")
        self.group = QSpinBox(minimum=0, maximum=8192, value=0, singleStep=32)
        self.group.setSpecialValueText("group 32 (default)")
        self.group.setPrefix("group ")
        rtn_row.addWidget(self.bits)
        rtn_row.addWidget(self.group, 1)
        bnb = QWidget()
        bnb_row = QHBoxLayout(bnb)
        bnb_row.setContentsMargins(0, 0, 0, 0)
        self.bnb_type = QComboBox()
        self.bnb_type.addItems(list(BNB_TYPES))
        bnb_row.addWidget(self.bnb_type, 1)
        sib = QWidget()
        sib_row = QHBoxLayout(sib)
        sib_row.setContentsMargins(0, 0, 0, 0)
        self.sibling = QLineEdit()
        self.sibling.setPlaceholderText("draft folder or hub id (same tokenizer)")
        browse_sib = QToolButton(text="…")
        browse_sib.clicked.connect(self._browse_sibling)
        sib_row.addWidget(self.sibling, 1)
        sib_row.addWidget(browse_sib)
        for page in (rtn, bnb, sib):
            self.draft_stack.addWidget(page)
        form.addRow("", self.draft_stack)
        self.spec_label = QLabel()
        self.spec_label.setStyleSheet("font-family: monospace; color: #225;")
        form.addRow("Draft spec", self.spec_label)
        layout.addWidget(models)

        # --- decoding
        decoding = QGroupBox("Decoding")
        dform = QFormLayout(decoding)
        self.gamma = QSpinBox(minimum=1, maximum=GAMMA_MAX, value=4)
        self.gamma.setToolTip("Draft tokens proposed per target pass")
        self.gamma_auto = QCheckBox("auto")
        self.gamma_auto.setToolTip("Adapt γ from the running acceptance rate and cost")
        grow = QHBoxLayout()
        grow.addWidget(self.gamma, 1)
        grow.addWidget(self.gamma_auto)
        dform.addRow("γ (draft length)", grow)
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=5.0, singleStep=0.1, decimals=2, value=1.0)
        self.temperature.setToolTip("0 is greedy decoding")
        dform.addRow("Temperature", self.temperature)
        self.top_k = QSpinBox(minimum=0, maximum=1_000_000, value=0)
        self.top_k.setSpecialValueText("off")
        dform.addRow("Top-k", self.top_k)
        self.top_p = QDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2, value=1.0)
        self.top_p.setToolTip("1.00 is off")
        dform.addRow("Top-p", self.top_p)
        self.max_new_tokens = QSpinBox(minimum=1, maximum=32768, value=64)
        dform.addRow("Max new tokens", self.max_new_tokens)
        self.seed = QSpinBox(minimum=0, maximum=2_147_483_647, value=1)
        dform.addRow("Seed", self.seed)
        self.baseline = QCheckBox("measure wall-clock speed-up (plain run, cached)")
        self.baseline.setChecked(True)
        dform.addRow(self.baseline)
        layout.addWidget(decoding)

        # --- prompt
        prompt_box = QGroupBox("Prompt")
        pl = QVBoxLayout(prompt_box)
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Text for the model to continue")
        self.prompt.setMinimumHeight(60)
        pl.addWidget(self.prompt)
        layout.addWidget(prompt_box, 1)

        # --- run
        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.run_button.setStyleSheet("font-weight: bold;")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button, 1)
        buttons.addWidget(self.stop_button, 1)
        layout.addLayout(buttons)
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        layout.addWidget(self.progress)

        self.run_button.clicked.connect(self.run_requested)
        self.stop_button.clicked.connect(self.stop_requested)
        self.preset.currentTextChanged.connect(self._preset_chosen)
        self.draft_kind.currentIndexChanged.connect(self.draft_stack.setCurrentIndex)
        for signal in (self.draft_kind.currentIndexChanged, self.bits.valueChanged, self.group.valueChanged,
                       self.bnb_type.currentIndexChanged, self.sibling.textChanged):
            signal.connect(self._update_spec)
        self.gamma_auto.toggled.connect(lambda on: self.gamma.setEnabled(not on))
        self._update_spec()

    # ----------------------------------------------------------------- reading and filling
    def draft(self) -> str:
        return draft_spec(self.draft_kind.currentData(), self.bits.value(), self.group.value(),
                          self.bnb_type.currentText(), self.sibling.text())

    def settings(self) -> RunSettings:
        """The form as RunSettings (HfspecError naming the field when something is missing)."""
        preset = self.preset.currentText()
        return RunSettings(
            target=self.target.text().strip(), draft=self.draft(),
            gamma="auto" if self.gamma_auto.isChecked() else self.gamma.value(),
            temperature=self.temperature.value(), top_k=self.top_k.value(), top_p=self.top_p.value(),
            max_new_tokens=self.max_new_tokens.value(), seed=self.seed.value(),
            prompt=self.prompt.toPlainText(), preset="" if preset == CUSTOM else preset,
            chat=getattr(self, "_chat", False), measure_baseline=self.baseline.isChecked(),
        )

    def set_settings(self, s: RunSettings) -> None:
        index = self.preset.findText(s.preset) if s.preset else 0
        self.preset.blockSignals(True)
        self.preset.setCurrentIndex(max(index, 0))
        self.preset.blockSignals(False)
        self._show_preset_info(self.preset.currentText())
        self.target.setText(s.target)
        self.set_draft(s.draft)
        self.gamma_auto.setChecked(s.gamma == "auto")
        if s.gamma != "auto":
            self.gamma.setValue(int(s.gamma))
        self.temperature.setValue(float(s.temperature))
        self.top_k.setValue(int(s.top_k))
        self.top_p.setValue(float(s.top_p))
        self.max_new_tokens.setValue(int(s.max_new_tokens))
        self.seed.setValue(int(s.seed))
        self.prompt.setPlainText(s.prompt)
        self._chat = bool(s.chat)
        self.baseline.setChecked(bool(s.measure_baseline))

    def set_draft(self, spec: str) -> None:
        parts = split_draft_spec(spec)
        self.draft_kind.setCurrentIndex(self.draft_kind.findData(parts["kind"]))
        self.bits.setValue(parts["bits"])
        self.group.setValue(parts["group"])
        self.bnb_type.setCurrentText(parts["bnb_type"])
        self.sibling.setText(parts["source"])
        self._update_spec()

    def choose_preset(self, name: str) -> bool:
        """Select a preset by name (fills the form); False when it is not in the list."""
        index = self.preset.findText(name)
        if index < 0:
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

    # ----------------------------------------------------------------- internals
    def _preset_chosen(self, name: str) -> None:
        self._show_preset_info(name)
        if name == CUSTOM:
            return
        try:
            s = RunSettings.from_preset(name, measure_baseline=self.baseline.isChecked())
        except HfspecError as exc:
            self.preset_info.setText(f"<span style='color:#a00'>{exc}</span>")
            return
        self.set_settings(s)

    def _show_preset_info(self, name: str) -> None:
        if name == CUSTOM:
            self.preset_info.setText("Your own target and draft.")
            return
        try:
            from hfspec.presets import load_preset

            p = load_preset(name)
            note = " · downloads from the Hugging Face hub" if p.needs_download else " · runs offline"
            self.preset_info.setText(p.description + note)
        except (ImportError, HfspecError) as exc:
            self.preset_info.setText(str(exc))

    def _update_spec(self, *_):
        try:
            self.spec_label.setText(self.draft())
            self.spec_label.setStyleSheet("font-family: monospace; color: #225;")
        except HfspecError as exc:
            self.spec_label.setText(str(exc).split(";")[0])
            self.spec_label.setStyleSheet("font-family: monospace; color: #a00;")

    def _browse_target_folder(self):
        path = QFileDialog.getExistingDirectory(self, "Target model folder", self.target.text())
        if path:
            self.target.setText(path)
            self.preset.setCurrentIndex(0)

    def _browse_target_gguf(self):
        path, _ = QFileDialog.getOpenFileName(self, "Target GGUF file", self.target.text(), "GGUF (*.gguf)")
        if path:
            self.target.setText(path)
            self.preset.setCurrentIndex(0)

    def _browse_sibling(self):
        path = QFileDialog.getExistingDirectory(self, "Draft model folder", self.sibling.text())
        if path:
            self.sibling.setText(path)
