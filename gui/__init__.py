"""hfspec's desktop dashboard (PySide6 + pyqtgraph): `hfspec gui` or `hfspec-gui`.

Layout in `main_window`, widgets in `controls` and `plots`, the model work in `hfspec.session` run by
`worker.Worker` on a QThread (results cross threads only as signals), persistence in `settings`.
"""

import ctypes
import sys

NONE_REFS = 1 << 40  # references to None the dashboard holds for its lifetime (Python < 3.12)


def _keep_none_alive() -> None:
    """PySide6 6.12 on Python 3.11 drops one reference to None on every call of a void C++ method (`setText`,
    `setVisible`, `QLayoutItem.setGeometry`, …: measured, −100 for 100 calls each), so a dashboard that runs long
    enough drains None's count to zero and the interpreter aborts ("Fatal Python error: none_dealloc"). Python
    3.12 made None immortal (PEP 683); here the dashboard gives None as many references as no session can use up.
    Nothing else changes: None is never deallocated in a healthy interpreter."""
    if sys.version_info < (3, 12):  # a module body runs once per process
        ctypes.c_ssize_t.from_address(id(None)).value += NONE_REFS


_keep_none_alive()
