"""The Live tab's generated text: each token on the colour of how it was made (accepted, resampled, bonus,
plain), the prompt in grey, a legend, and Copy / Save."""

from __future__ import annotations

from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from gui import theme
from gui.widgets import FlowLayout

KIND_COLOURS = {  # background of a generated token, by how it was produced
    "accepted": "#b7e4b0",   # draft token the target accepted
    "resampled": "#f6c28b",  # draft rejected: sampled from the residual (target − draft)
    "bonus": "#a9c8f0",      # every draft token accepted: one more from the target
    "target": "#e0e0e0",     # plain decoding: a pass where the draft proposed nothing
}
KIND_LABELS = {"accepted": "accepted draft token", "resampled": "resampled (draft rejected)",
               "bonus": "bonus token (all accepted)", "target": "target only (plain pass, γ = 0)"}
KIND_SHORT = {"accepted": "accepted", "resampled": "resampled", "bonus": "bonus", "target": "target only"}


class GeneratedText:
    """Mixin of `LiveView`: builds the text box (`text`, `copy_button`, `save_button`) and writes into it."""

    def _text_box(self) -> QWidget:
        self.text = QTextEdit()
        self.text.setReadOnly(True)
        self.text.setMinimumHeight(60)
        legend_row = QWidget()
        legend = FlowLayout(legend_row, spacing=6)
        for kind, label in KIND_LABELS.items():
            swatch = QLabel(f"<span style='background:{KIND_COLOURS[kind]}; color:#000;'>&nbsp;{KIND_SHORT[kind]}"
                            "&nbsp;</span>")
            swatch.setToolTip(label)
            legend.addWidget(swatch)
        self.prompt_swatch = QLabel()
        legend.addWidget(self.prompt_swatch)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy prompt and generated text")
        self.copy_button.clicked.connect(self.copy_text)
        self.save_button = QPushButton("Save…")
        self.save_button.setToolTip("Save prompt and generated text as a .txt file")
        self.save_button.clicked.connect(lambda: self.save_text())
        row = QHBoxLayout()  # the buttons stay at the right, however narrow the window
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(legend_row, 1)
        row.addWidget(self.copy_button)
        row.addWidget(self.save_button)
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.text)
        self._style_prompt_swatch()
        return box

    def _style_prompt_swatch(self) -> None:
        self.prompt_swatch.setText(f"<span style='color:{theme.current().muted}'>prompt in grey text</span>")

    def plain_text(self) -> str:
        return self.text.toPlainText()

    def copy_text(self) -> None:
        QApplication.clipboard().setText(self.plain_text())

    def save_text(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save generated text", "hfspec-text.txt", "Text (*.txt)")
            if not path:
                return None
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.plain_text())
        return path

    def _append_pieces(self, pieces) -> None:
        """Append (text, kind) pieces, each on its kind's background (character formats: whitespace kept)."""
        cursor = self.text.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for text, kind in pieces:
            fmt_ = QTextCharFormat()
            if kind == "prompt":
                fmt_.setForeground(QColor("#808080"))
            elif kind in KIND_COLOURS:
                fmt_.setBackground(QColor(KIND_COLOURS[kind]))
                fmt_.setForeground(QColor("#000000"))  # dark text on the light token colours, in either theme
                fmt_.setToolTip(KIND_LABELS[kind])
            cursor.insertText(text, fmt_)
        self.text.setTextCursor(cursor)
        self.text.ensureCursorVisible()
