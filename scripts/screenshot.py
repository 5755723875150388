"""Take docs/screenshot.png: the real dashboard after a run of the micro-rtn4 preset.

    scripts/screenshot.sh                       # under Xvfb (xvfb-run), the X screen is grabbed
    QT_QPA_PLATFORM=offscreen python scripts/screenshot.py   # without X: the window renders itself

Settings go to a temporary .ini file, never the user's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"))
    parser.add_argument("--preset", default="micro-rtn4")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--size", default="1440x900")
    args = parser.parse_args()

    import torch
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from gui.main_window import MainWindow

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    app = QApplication([sys.argv[0]])
    tmp = tempfile.mkdtemp(prefix="hfspec-shot-")
    window = MainWindow(settings_store=QSettings(os.path.join(tmp, "gui.ini"), QSettings.Format.IniFormat))
    width, height = (int(v) for v in args.size.split("x"))
    window.resize(width, height)
    window.move(0, 0)
    if not window.controls.choose_preset(args.preset):
        print(f"preset {args.preset!r} not found", file=sys.stderr)
        return 2
    window.controls.seed.setValue(args.seed)
    window.controls.max_new_tokens.setValue(args.max_new_tokens)
    window.show()

    def wait():
        while window.controller.busy:
            app.processEvents()
            time.sleep(0.01)
        for _ in range(20):
            app.processEvents()
            time.sleep(0.01)

    window.start_run()
    wait()
    if window.last_error:
        print("run failed:", window.last_error, file=sys.stderr)
        return 1
    window.tabs.setCurrentWidget(window.live)
    wait()
    platform = app.platformName()
    if platform == "offscreen":
        image = window.grab()
    else:
        image = window.screen().grabWindow(0, 0, 0, window.frameGeometry().width(), window.frameGeometry().height())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    image.save(args.out)
    print(f"saved {args.out} ({image.width()}x{image.height()}, platform {platform}); "
          f"{window.statusBar().currentMessage()}")
    window.shutdown()
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
