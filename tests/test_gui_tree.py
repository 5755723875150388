# ruff: noqa: F811 - tests take test_gui's fixtures (imported below) as parameters of the same names
"""The dashboard's tree and coupling controls and its drawing of the last pass's token tree, driven for real
(pytest-qt, offscreen, waiting on the worker's signals): the choices reach RunSettings, persist and come from
presets; RunSettings' own error about gumbel with a tree shows and nothing runs; a real tree="auto" run of the
micro model draws a tree whose accepted path is what that pass committed."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

from test_gui import _has_preset, _run, session, window  # noqa: E402, F401 - test_gui's fixtures

from gui import settings as store  # noqa: E402
from gui.controls import ControlPanel  # noqa: E402
from gui.tree_view import TreeView, layout, short  # noqa: E402
from hfspec.decoding.round import RoundTree  # noqa: E402
from hfspec.errors import HfspecError  # noqa: E402

pytestmark = pytest.mark.skipif(not _has_preset("micro-rtn4"), reason="micro-rtn4 preset absent")


def _choose(combo, text: str) -> None:
    index = combo.findText(text)
    assert index >= 0, text
    combo.setCurrentIndex(index)


def test_tree_and_coupling_reach_run_settings_persist_and_come_from_presets(qtbot, window, tmp_path):
    c = window.controls
    assert (c.settings().tree, c.settings().coupling) == (0, "rejection")
    _choose(c.tree, "auto (token tree)")
    assert c.settings().tree == "auto" and c.settings().generate_kwargs()["tree"] == "auto"
    assert c.preset.currentText() == "custom"  # a preset's value edited
    _choose(c.tree, "siblings 3")
    assert c.settings().tree == 3
    _choose(c.tree, "chain")
    _choose(c.coupling, "gumbel (draft-invariant)")
    assert c.settings().coupling == "gumbel" and c.settings().generate_kwargs()["coupling"] == "gumbel"
    assert c.tree.toolTip() and c.coupling.toolTip()
    # kept in the dashboard's settings like every other field
    _choose(c.coupling, "rejection (default)")
    _choose(c.tree, "auto (token tree)")
    window.save_state()
    other = ControlPanel()
    qtbot.addWidget(other)
    other.set_settings(store.load_run_settings(window.store))
    assert (other.tree.currentText(), other.settings().tree) == ("auto (token tree)", "auto")
    # a preset sets them (and resets them when chosen again)
    assert c.choose_preset("micro-tree") and c.settings().tree == "auto" and c.settings().coupling == "rejection"
    _choose(c.coupling, "gumbel (draft-invariant)")
    _choose(c.tree, "chain")
    assert c.choose_preset("micro-tree") and (c.tree.currentText(), c.coupling.currentData()) == (
        "auto (token tree)", "rejection")


def test_gumbel_with_a_tree_shows_run_settings_error_and_runs_nothing(qtbot, window):
    c = window.controls
    _choose(c.tree, "siblings 4")
    _choose(c.coupling, "gumbel (draft-invariant)")
    with pytest.raises(HfspecError) as caught:
        c.settings().validated()
    expected = str(caught.value)
    assert expected.startswith("tree: ")
    assert c.input_note.isVisibleTo(c) and c.input_note.text() == expected  # said as soon as the pair is chosen
    started = []
    window.controller.busy_changed.connect(started.append)
    assert window.start_run() is False
    assert started == [] and not window.controller.busy
    assert window.errors and window.errors[-1][1] == expected and expected.splitlines()[0] in window.status_text
    _choose(c.tree, "chain")  # fixed: the stale error goes, from under the form and from the status bar
    assert not c.input_note.isVisibleTo(c) and window.status_text == "Ready"
    _choose(c.tree, "auto (token tree)")
    assert c.input_note.text() == str(_error(c))
    _choose(c.coupling, "rejection (default)")
    assert not c.input_note.isVisibleTo(c)


def _error(c) -> HfspecError:
    try:
        c.settings().validated()
    except HfspecError as exc:
        return exc
    raise AssertionError("no error")


def test_layout_puts_parents_before_children_and_branches_on_their_own_rows(qtbot):
    assert layout((-1, 0, -1, 1, 1, 2)) == [0, 0, 2, 0, 1, 2]
    view = TreeView()
    qtbot.addWidget(view)
    tree = RoundTree((5, 6, 7, 8), (-1, 0, 0, -1), (1, 2, 2, 1), (0, 2), 9, "resampled", (" a", "b", "c\n", "d"),
                     "long token")
    view.show_tree(tree)
    assert view.kinds == ["root", "accepted", "drafted", "accepted", "drafted", "resampled"]
    assert [label.textItem.toPlainText() for label in view.labels] == ["…", "␣a", "b", "c↵", "d", "long␣…"]
    assert sorted(view.path_edges.xData) == [0, 1, 1, 2] and list(view.final_edge.xData) == [2, 3]


def test_a_pass_that_tree_auto_ran_as_the_chain_is_titled_as_a_chain(qtbot):
    view = TreeView()
    qtbot.addWidget(view)
    view.show_tree(RoundTree((5, 6, 7), (-1, 0, 1), (1, 2, 3), (0,), 9, "resampled", chain=True), 4)
    assert view.plot.plot_title.startswith("Chain (tree \"auto\" fell back") and "pass 4" in view.plot.plot_title
    view.show_tree(RoundTree((5, 6), (-1, -1), (1, 1), (1,), 9, "bonus"), 5)
    assert view.plot.plot_title.startswith("Token tree of pass 5")


def test_a_tree_auto_run_draws_the_last_pass_tree_with_its_committed_path(qtbot, window):
    c = window.controls
    assert c.choose_preset("micro-tree")
    c.max_new_tokens.setValue(48)  # enough passes that some grow branches whatever the draft's rounding
    c.baseline.setChecked(False)
    seen = []
    window.controller.live.connect(lambda snapshots: seen.extend(snapshots))
    _run(qtbot, window)
    assert window.errors == []
    assert all(p.tree is not None for p in seen)
    # the last pass that grew a tree (the last passes may have had no room for one)
    view, last = window.live.tree_view, [p for p in seen if p.tree.tokens][-1]
    assert view.isVisible() and view.tree == last.tree and f"pass {last.round_index + 1}:" in view.plot.plot_title
    # the highlighted path is what the pass committed: its accepted draft tokens, then the target's own token
    assert view.kinds.count("accepted") == len(last.tree.path) == last.committed - 1
    assert view.kinds[-1] == last.tree.kind and view.kinds.count("drafted") == len(last.tree.tokens) - last.committed + 1
    bold = [label.textItem.toPlainText() for label, kind in zip(view.labels, view.kinds, strict=True)
            if kind == "accepted"]
    assert bold == [short(last.tree.texts[k]) for k in last.tree.path]
    assert sum(1 for p in seen if p.tree is not None and len(p.tree.tokens) > len(p.tree.path)) > 0  # branches
    assert "tree auto" in window.live.origin.text()  # the Shown line names the tree, and says when the form differs
    _choose(c.tree, "chain")
    assert "(draft tree)" in window.live.origin.text()
    window.live.clear()
    assert not view.isVisibleTo(window.live) and view.kinds == []
