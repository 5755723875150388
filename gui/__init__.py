"""hfspec's desktop dashboard (PySide6 + pyqtgraph): `hfspec gui` or `hfspec-gui`.

Layout in `main_window`, widgets in `controls` and `plots`, the model work in `hfspec.session` run by
`worker.Worker` on a QThread (results cross threads only as signals), persistence in `settings`.
"""
