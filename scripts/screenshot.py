"""Take the README's pictures of the real dashboard: the Live, Sweep and Compare tabs at 1366×768 and the Live
tab at 1024×700 (docs/screenshot*.png), after real runs of the micro-rtn4 preset; then the Live tab drawing the
last pass's token tree after a run of the micro-tree preset (docs/screenshot-tree.png; `--tree-only`: just that).

    scripts/screenshot.sh                       # under Xvfb (xvfb-run), the X screen is grabbed
    QT_QPA_PLATFORM=offscreen python scripts/screenshot.py   # without X: the window renders itself

Settings go to a temporary .ini file, never the user's. A script, not a test: it waits by processing events.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LARGE, SMALL = (1366, 768), (1024, 700)  # a common laptop screen, and a small one
sys.path.insert(0, str(ROOT))
NANO = ROOT / "presets" / "models" / "nano"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs"), help="folder for the screenshots")
    parser.add_argument("--preset", default="micro-rtn4")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tree-only", action="store_true", help="only the token tree's picture")
    parser.add_argument("--tree-seed", type=int, default=12)
    args = parser.parse_args()

    from PySide6.QtCore import QEventLoop, QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from gui.main_window import MainWindow

    app = QApplication([sys.argv[0]])  # torch keeps its default threads, as `hfspec gui` does
    tmp = tempfile.mkdtemp(prefix="hfspec-shot-")
    window = MainWindow(settings_store=QSettings(os.path.join(tmp, "gui.ini"), QSettings.Format.IniFormat))
    window.move(0, 0)
    if not window.controls.choose_preset(args.preset):
        print(f"preset {args.preset!r} not found", file=sys.stderr)
        return 2
    window.controls.seed.setValue(args.seed)
    window.controls.max_new_tokens.setValue(args.max_new_tokens)
    window.resize(*LARGE)
    window.show()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def settle(seconds: float = 0.3):
        """Wait for the job on Qt's event loop (a polling loop here would take CPU from the runs being timed)."""
        if window.controller.busy:
            loop = QEventLoop()
            window.controller.done.connect(loop.quit)
            loop.exec()
            window.controller.done.disconnect(loop.quit)
        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        loop.exec()

    def shot(name: str):
        settle()
        if app.platformName() == "offscreen":
            image = window.grab()
        else:
            frame = window.frameGeometry()
            image = window.screen().grabWindow(0, frame.x(), frame.y(), frame.width(), frame.height())
        image.save(str(out / name))
        print(f"saved {out / name} ({image.width()}x{image.height()}, platform {app.platformName()}); "
              f"{window.statusBar().currentMessage()}")

    window.sweep.drafts.setText("rtn4, rtn3")
    window.sweep.gamma_to.setValue(6)
    window.sweep.repeats.setValue(args.repeats)
    window.compare.items.setPlainText(f"rtn4\nrtn3\nrtn8\n{NANO.relative_to(ROOT)}")
    window.compare.repeats.setValue(args.repeats)
    def run(*starts) -> bool:
        for start in starts:
            start()
            settle()
            if window.last_error:
                print("failed:", window.last_error, file=sys.stderr)
                return False
        return True

    if not args.tree_only:
        if not run(window.start_sweep, window.start_compare, window.start_run):
            return 1
        window.tabs.setCurrentWidget(window.sweep)
        shot("screenshot-sweep.png")
        window.tabs.setCurrentWidget(window.compare)
        shot("screenshot-compare.png")
        window.tabs.setCurrentWidget(window.live)
        shot("screenshot.png")
        window.resize(*SMALL)
        shot("screenshot-1024x700.png")
    window.resize(*LARGE)
    window.controls.choose_preset("micro-tree")
    window.controls.seed.setValue(args.tree_seed)  # a text that meets </s> after 86 tokens: its last pass has room
    window.controls.ignore_eos.setChecked(False)   # for a tree with branches (the passes before the length limit
    window.controls.max_new_tokens.setValue(128)   # have no room for one)
    if not run(window.start_run):
        return 1
    shot("screenshot-tree.png")
    window.shutdown()
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
