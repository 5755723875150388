"""Help → Glossary: what the dashboard's numbers mean, and why the predicted and the measured speed-up differ."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTextBrowser, QVBoxLayout

GLOSSARY = """
<h3>Speculative decoding</h3>
<p>A cheap <b>draft</b> proposes γ tokens; the <b>target</b> checks all of them in one forward pass. Each draft
token x is kept with probability min(1, p(x)/q(x)) (p: target, q: draft); the first rejected one is replaced
by a sample from normalise(max(0, p − q)); when all γ are kept the target adds one more (bonus) token. The text
is distributed exactly as the target's own samples (Leviathan et al., ICML 2023, Algorithm 1).</p>
<dl>
<dt><b>γ (gamma)</b></dt><dd>Draft tokens proposed per target pass. <i>auto</i> chooses it each pass from the
running α and c (the Live tab's grey step line shows the choice; γ = 0 is a plain pass).</dd>
<dt><b>α (acceptance rate)</b></dt><dd>Accepted / checked draft tokens. Tokens after a rejection, and after an
EOS, are discarded unchecked and not counted.</dd>
<dt><b>c (cost)</b></dt><dd>What one draft forward costs relative to one target forward. <b>c (time)</b> is
measured in the run: mean draft forward time / mean target forward time. <b>c (bytes)</b> is draft weight
bytes / target weight bytes: the cost on a machine where a forward is bound by reading the weights (large
models on a GPU). Small models on a CPU are not weight-bound, so there c (time) is far above c (bytes).</dd>
<dt><b>Formula</b></dt><dd>Expected tokens per target pass (1 − α<sup>γ+1</sup>) / (1 − α) (Eq. 1), averaged
over the γ each pass proposed.</dd>
<dt><b>Four speed-ups</b></dt><dd>
<b>predicted speed-up</b>: the cost model's prediction from the measured step costs (draft steps, the target's
verify pass over γ + 1 positions, time outside forwards) and the run's tokens per pass; predicted from the runs
timed after the run you watched (without the live display, which slows what it watches), never from that run;
"—" where none exists.<br>
<b>measured speed-up</b>: tokens/s over plain decoding, timed (below).<br>
<b>paper speed-up</b>: the paper's formula (1 − α<sup>γ+1</sup>) / ((1 − α)(1 + γc)) (Theorem 3.8) with
c (time); it counts model forwards only and prices the verify pass as one step.<br>
<b>ideal speed-up</b>: the paper's formula with c (bytes): the weight-bound figure of a machine where a forward
costs only reading its weights. It is not an upper bound: where c (time) is below c (bytes) the measured
speed-up can exceed it.</dd>
<dt><b>Rough</b></dt><dd>A measured speed-up from fewer than 3 timed (speculative, plain) pairs: one pair on a
busy machine can be off by tens of percent.</dd>
<dt><b>Measured with</b></dt><dd>torch's CPU threads and the machine's 1-minute load average while measuring.
The dashboard uses the same threads as <code>hfspec run</code>, so the same settings measure the same.</dd>
<dt><b>Live (with display)</b></dt><dd>The tokens/s of the run you watched, drawing included; the measured rates
come from the timed runs.</dd>
<dt><b>Measured speed-up</b></dt><dd>Tokens/s of the run over tokens/s of plain decoding of exactly as many
tokens, same prompt, seed and sampling, measured right after the run (never cached). Sweep and Compare repeat
every point with seeded runs, each beside its own baseline, and show ± 1 standard deviation.</dd>
<dt><b>Why predicted ≠ measured</b></dt><dd>The cost model prices the steps it measured; the wall clock of
the timed runs also varies: α varies along the text while the formula assumes one α for every position, short
runs are noisy and the machine's load changes from minute to minute. The paper's formula counts model forwards
only, so it leaves out sampling, cache rollback and Python bookkeeping too.</dd>
<dt><b>Token colours</b></dt><dd>Green: accepted draft token. Orange: resampled after a rejection. Blue: bonus
token. Grey: a plain pass (no draft tokens proposed). Prompt: grey text.</dd>
<dt><b>Ended by</b></dt><dd>EOS (the model's end-of-text token), max tokens, a stop string, or the Stop
button.</dd>
</dl>
"""


class GlossaryDialog(QDialog):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("hfspec — glossary")
        self.browser = QTextBrowser()
        self.browser.setHtml(GLOSSARY)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.browser)
        layout.addWidget(buttons)
        self.resize(640, 560)
