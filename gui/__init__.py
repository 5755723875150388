"""hfspec's desktop dashboard (PySide6 + pyqtgraph): `hfspec gui` or `hfspec-gui`.

Layout in `main_window`, widgets in `controls` and `plots`, the model work in `hfspec.session` run by
`worker.Worker` on a QThread (results cross threads only as signals), persistence in `settings`.
"""

import ctypes
import sys

IMMORTAL_REFS = 1 << 40  # references to None, True and False the dashboard holds for its lifetime (Python < 3.12)
NONE_REFS = IMMORTAL_REFS  # (its name until True and False needed the same)


def _keep_singletons_alive() -> None:
    """PySide6 6.12 on Python 3.11 drops one reference to None on every call of a void C++ method (`setText`,
    `setVisible`, `QLayoutItem.setGeometry`, …: measured, −100 for 100 calls each), and one to True on every
    Python `Signal.emit` (it returns True without a new reference: −100 for 100 emits of any signal, connected or
    not, measured 3 December 2026; pyqtgraph emits on every redraw), so a dashboard that runs long enough drains
    their counts to zero and the interpreter aborts ("Fatal Python error: none_dealloc" / "bool_dealloc"; the
    dashboard's tests hit the second at exit). Python 3.12 made these singletons immortal (PEP 683); here the
    dashboard gives None, True and False as many references as no session can use up. Nothing else changes: they
    are never deallocated in a healthy interpreter."""
    if sys.version_info < (3, 12):  # a module body runs once per process
        for singleton in (None, True, False):
            ctypes.c_ssize_t.from_address(id(singleton)).value += IMMORTAL_REFS


_keep_singletons_alive()
