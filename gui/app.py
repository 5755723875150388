"""Entry point of the dashboard: `hfspec gui` or `hfspec-gui`."""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

# Qt's xcb platform plugin (the X11 window system) loads these system libraries; when one is missing Qt
# aborts with a long message that does not name the package. soname -> Debian / Ubuntu package.
XCB_LIBRARIES = {
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
}


def uses_xcb(environ=os.environ, platform: str = sys.platform) -> bool:
    """Whether Qt will pick its xcb platform: Linux, and QT_QPA_PLATFORM unset or xcb (on a Wayland session
    without it Qt picks wayland)."""
    if not platform.startswith("linux"):
        return False
    chosen = environ.get("QT_QPA_PLATFORM", "")
    if chosen:
        return chosen.split(":")[0].split(";")[0] == "xcb"
    return not environ.get("WAYLAND_DISPLAY")


def missing_xcb_packages(load=ctypes.CDLL) -> list[str]:
    """The packages of the xcb libraries that cannot be loaded."""
    missing = []
    for soname, package in XCB_LIBRARIES.items():
        try:
            load(soname)
        except OSError:
            missing.append(package)
    return missing


def xcb_advice(packages: list[str]) -> str:
    return ("hfspec gui: Qt's xcb platform needs system libraries that are missing. Install them with:\n"
            f"    sudo apt-get install {' '.join(packages)}\n"
            "(or run without a display: QT_QPA_PLATFORM=offscreen)")


def default_threads() -> int:
    """torch's CPU threads in the dashboard: torch's own default, as `hfspec run` and `hfspec sweep` use, so that
    the same settings measure the same speed-up in both, and a draft step compiled by either is found in the
    other's compile cache (inductor's cache key includes the thread count)."""
    import torch

    return torch.get_num_threads()


def quit_on_interrupt(app):
    """Ctrl+C in the terminal quits the application. Python runs its signal handlers only between bytecodes, so
    a timer wakes the interpreter regularly while Qt's event loop waits; returns that timer."""
    from PySide6.QtCore import QTimer

    # queued, so that a Ctrl+C before the event loop started still quits once it runs
    signal.signal(signal.SIGINT, lambda *_: QTimer.singleShot(0, app.quit))
    timer = QTimer(app)
    timer.setInterval(200)
    timer.timeout.connect(lambda: None)
    timer.start()
    return timer


def main(argv: list[str] | None = None) -> int:
    """Open the dashboard window; returns the application's exit code."""
    parser = argparse.ArgumentParser(prog="hfspec gui", description="hfspec's speculative decoding dashboard")
    parser.add_argument("--preset", help="start with this preset (name or .toml path)")
    parser.add_argument("--settings", help="settings .ini file (default: the user's; also $HFSPEC_GUI_SETTINGS)")
    parser.add_argument("--run", action="store_true", help="start a run at once")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's CPU threads (default: torch's own, as `hfspec run` uses)")
    args, qt_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.threads is not None and args.threads < 1:
        print(f"hfspec gui: error: --threads: got {args.threads}; allowed: an integer >= 1", file=sys.stderr)
        return 2
    try:
        from PySide6.QtCore import QTimer
        from PySide6.QtWidgets import QApplication
    except ImportError:
        print("hfspec gui needs PySide6 and pyqtgraph: pip install 'hfspec[gui]'", file=sys.stderr)
        return 2
    if uses_xcb():
        missing = missing_xcb_packages()
        if missing:
            print(xcb_advice(missing), file=sys.stderr)
            return 2

    import torch

    from gui.main_window import MainWindow
    from gui.settings import open_settings

    if args.threads is not None:
        torch.set_num_threads(args.threads)

    app = QApplication.instance() or QApplication([sys.argv[0], *qt_args])
    app.setApplicationName("hfspec dashboard")
    app.setOrganizationName("hfspec")
    window = MainWindow(settings_store=open_settings(args.settings))
    if args.preset and not window.controls.choose_preset(args.preset):
        window.show_error("preset", f"preset: unknown preset {args.preset!r}")
    app.aboutToQuit.connect(window.controller.shutdown)
    quit_on_interrupt(app)
    window.show()
    QTimer.singleShot(0, lambda: print(f"hfspec gui: {torch.get_num_threads()} torch threads; Ctrl+C here quits",
                                       file=sys.stderr, flush=True))
    if args.run:
        window.start_run()
    code = app.exec()
    window.controller.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
