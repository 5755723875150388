"""The Decoding part of the settings panel: γ, how the draft proposes (chain, sibling leaves or a token tree) and
how draft and target are coupled, sampling, length, seed and the run's switches. The form holds values only:
RunSettings checks them (the panel shows its error text)."""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel

from gui import theme
from gui.widgets import CheckedDoubleSpinBox, CheckedSpinBox
from hfspec.decoding.coupling import COUPLINGS
from hfspec.session import GAMMA_MAX
from hfspec.validate import TREE_MAX

MAX_TOKENS_UNKNOWN = 32768  # when the target's context length cannot be read
TREES = [("chain", 0), *((f"siblings {n}", n) for n in range(2, TREE_MAX + 1)), ("auto (token tree)", "auto")]
COUPLING_TITLES = {"rejection": "rejection (default)", "gumbel": "gumbel (draft-invariant)"}
TREE_TIP = ("How the draft proposes each pass (RunSettings.tree, `hfspec run --tree`):\n"
            "chain: one token per draft position;\n"
            "siblings N: up to N candidate tokens at each unsure draft position, checked in the same target pass;\n"
            "auto: a token tree, grown level by level as far as the cost model says it pays; the Live tab draws "
            "the last pass's tree.")
COUPLING_TIP = ("How draft and target are coupled when sampling (RunSettings.coupling, `--coupling`):\n"
                "rejection: accept a draft token with probability min(1, p/q), else resample from the residual;\n"
                "gumbel: draft-invariant sampling, the text is fixed by the seed whatever the draft (a chain only: "
                "not with siblings or auto).")

PREPACK_TIP = ("fp32 targets on the CPU (RunSettings.prepack, `--prepack`): a oneDNN-prepacked copy of every linear "
               "weight, used by every call.\nFaster one-token steps (about 0.87× at SmolLM2-135M) and a 5-position "
               "verify pass at about one step's time, for a second fp32 copy of the weights in memory.\nA bfloat16 / "
               "float16 target or a GPU refuses it (bf16's multi-row matmul already costs about one row).")


def prepack_box() -> QCheckBox:
    """The Models box's switch under Precision (built here with the form's other switches)."""
    box = QCheckBox("fp32: prepack weights")
    box.setToolTip(PREPACK_TIP)
    return box


class DecodingFields:
    """Mixin of `ControlPanel`: builds the Decoding box onto the panel (its inputs become the panel's
    attributes) and shows or hides γ's box when γ is auto."""

    def _decoding_box(self) -> QGroupBox:
        box = QGroupBox("Decoding")
        form = QFormLayout(box)
        self.gamma = CheckedSpinBox(minimum=1, maximum=GAMMA_MAX, value=4)
        self.gamma.setToolTip("Draft tokens proposed per target pass")
        self.gamma.setObjectName("γ (draft length)")
        self.gamma_auto = QCheckBox("auto")
        self.gamma_auto.setToolTip("Choose γ each pass from the running acceptance rate and measured cost")
        self.gamma_auto_note = QLabel("chosen each pass")
        self.gamma_auto_note.setStyleSheet(f"color: {theme.current().muted};")
        self.gamma_auto_note.setToolTip("The Live tab plots the γ chosen for every target pass")
        row = QHBoxLayout()
        row.addWidget(self.gamma, 1)
        row.addWidget(self.gamma_auto_note, 1)
        row.addWidget(self.gamma_auto)
        form.addRow("γ (draft length)", row)
        self.tree = QComboBox()
        for text, value in TREES:
            self.tree.addItem(text, value)
        self.tree.setToolTip(TREE_TIP)
        form.addRow("Draft tree", self.tree)
        self.coupling = QComboBox()
        for value in COUPLINGS:
            self.coupling.addItem(COUPLING_TITLES.get(value, value), value)
        self.coupling.setToolTip(COUPLING_TIP)
        form.addRow("Coupling", self.coupling)
        self.temperature = CheckedDoubleSpinBox(minimum=0.0, maximum=5.0, singleStep=0.1, decimals=2, value=1.0)
        self.temperature.setToolTip("0 is greedy decoding")
        self.temperature.setObjectName("temperature")
        form.addRow("Temperature", self.temperature)
        self.top_k = CheckedSpinBox(minimum=0, maximum=1_000_000, value=0)
        self.top_k.setSpecialValueText("off")
        self.top_k.setToolTip("Keep the k most likely tokens; 0 is off")
        self.top_k.setObjectName("top-k")
        form.addRow("Top-k", self.top_k)
        self.top_p = CheckedDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2, value=1.0)
        self.top_p.setToolTip("Keep the most likely tokens up to this probability mass; 1.00 is off")
        self.top_p.setObjectName("top-p")
        form.addRow("Top-p", self.top_p)
        self.max_new_tokens = CheckedSpinBox(minimum=1, maximum=MAX_TOKENS_UNKNOWN, value=64)
        self.max_new_tokens.setObjectName("max new tokens")
        form.addRow("Max new tokens", self.max_new_tokens)
        self.seed = CheckedSpinBox(minimum=0, maximum=2_147_483_647, value=1)
        self.seed.setToolTip("Seed of the sampler (the same seed gives the same text)")
        self.seed.setObjectName("seed")
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

    def _show_gamma(self, auto: bool) -> None:
        self.gamma.setVisible(not auto)
        self.gamma_auto_note.setVisible(auto)


def write_choice(combo: QComboBox, value) -> None:
    """Select `value`'s item (the first item for a value the list does not show, e.g. tree 1: the chain)."""
    combo.setCurrentIndex(max(combo.findData(value), 0))
