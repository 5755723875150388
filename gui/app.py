"""Entry point of the dashboard: `hfspec gui` or `hfspec-gui`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Open the dashboard window; returns the application's exit code."""
    parser = argparse.ArgumentParser(prog="hfspec gui", description="hfspec's speculative decoding dashboard")
    parser.add_argument("--preset", help="start with this preset (name or .toml path)")
    parser.add_argument("--settings", help="settings .ini file (default: the user's; also $HFSPEC_GUI_SETTINGS)")
    parser.add_argument("--run", action="store_true", help="start a run at once")
    args, qt_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        from PySide6.QtWidgets import QApplication
    except ImportError:
        print("hfspec gui needs PySide6 and pyqtgraph: pip install 'hfspec[gui]'", file=sys.stderr)
        return 2

    from gui.main_window import MainWindow
    from gui.settings import open_settings

    app = QApplication.instance() or QApplication([sys.argv[0], *qt_args])
    app.setApplicationName("hfspec dashboard")
    app.setOrganizationName("hfspec")
    window = MainWindow(settings_store=open_settings(args.settings))
    if args.preset and not window.controls.choose_preset(args.preset):
        window.show_error("preset", f"preset: unknown preset {args.preset!r}")
    app.aboutToQuit.connect(window.controller.shutdown)
    window.show()
    if args.run:
        window.start_run()
    code = app.exec()
    window.controller.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
