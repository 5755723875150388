"""The README and the docs site say what is true: every ```python block of README.md and docs/*.md runs (offline,
on the embedded micro model), every `hfspec VERB --flag` they show exists, every page is in mkdocs.yml's nav, and
the README stays short. `mkdocs build --strict` itself runs in scripts/test.sh.

A python block that must not run is marked by `<!-- no-run: reason -->` on the line right above its fence and
counted in NO_RUN below, so that nothing is skipped silently."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300
NO_RUN: dict[str, int] = {}  # page (relative to the repository) -> number of python blocks marked no-run
LANGUAGES = {"python", "bash", "text", "toml"}

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
NO_RUN_MARK = re.compile(r"<!--\s*no-run:\s*\S.*?-->\s*$")
INLINE_COMMAND = re.compile(r"`(hfspec [^`]+)`")


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _blocks(page: Path) -> list[tuple[str, str, bool]]:
    """(language, code, marked no-run) of each fenced block, in order."""
    text = page.read_text()
    out = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        out.append((match.group(1).strip(), match.group(2), bool(NO_RUN_MARK.search(before))))
    return out


def _prose(page: Path) -> str:
    return FENCE.sub("", page.read_text())


def test_readme_is_short_and_names_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    for needed in ("bash scripts/demo.sh", "bash scripts/test.sh", 'pytest -m "not slow"', "## Results",
                   "docs/benchmarks.md#the-results-table"):
        assert needed in text, needed
    assert "<!-- results: filled by benchmarks/bench_results.py --docs -->" in (ROOT / "docs" / "benchmarks.md").read_text()


def test_every_fence_is_tagged_and_flush_left():
    """An untagged or indented block could hide Python from the runner below."""
    for page in PAGES:
        text = page.read_text()
        assert not re.search(r"^[ \t]+```", text, re.M), f"{_name(page)}: indented code fence"
        assert text.count("\n```") % 2 == 0, f"{_name(page)}: unbalanced code fences"
        for language, _, _ in _blocks(page):
            assert language in LANGUAGES, f"{_name(page)}: code block tagged {language!r}; allowed: {LANGUAGES}"


def test_no_run_marks_are_counted():
    found = {}
    for page in PAGES:
        marked = sum(no_run for language, _, no_run in _blocks(page) if language == "python")
        if marked:
            found[_name(page)] = marked
    assert found == NO_RUN


def test_every_page_is_in_the_nav():
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = []

    def walk(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            walk(value) if isinstance(value, list) else listed.append(value)

    walk(config["nav"])
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(listed) == pages
    assert config.get("strict") is True


def _verbs() -> dict[str, set[str]]:
    from hfspec.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {verb: set(parser._option_string_actions) for verb, parser in sub.choices.items()}


def _commands(page: Path) -> list[list[str]]:
    """Token lists of the `hfspec ...` commands a page shows: in bash blocks and in inline code."""
    commands = []
    for language, code, _ in _blocks(page):
        if language != "bash":
            continue
        for line in code.replace("\\\n", " ").splitlines():
            tokens = shlex.split(line, comments=True)
            segment: list[str] = []
            for token in [*tokens, ";"]:
                if token in (";", "|", "&&", "||"):
                    while segment and re.fullmatch(r"[A-Z_]+=.*", segment[0]):
                        segment.pop(0)
                    if segment[:1] == ["hfspec"]:
                        commands.append(segment)
                    segment = []
                else:
                    segment.append(token)
    for match in INLINE_COMMAND.finditer(_prose(page)):
        commands.append(match.group(1).replace("\\", " ").split())
    return commands


def test_cli_commands_in_the_docs_exist():
    verbs = _verbs()
    seen = 0
    for page in PAGES:
        for command in _commands(page):
            seen += 1
            assert len(command) > 1 and command[1] in verbs, f"{_name(page)}: {' '.join(command)}: no such verb"
            for token in command[2:]:
                flag = token.strip("[]").split("=", 1)[0]
                if flag.startswith("--"):
                    assert flag in verbs[command[1]], f"{_name(page)}: {' '.join(command)}: no flag {flag}"
    assert seen > 20  # the parser above found the commands


PYTHON_PAGES = [p for p in PAGES if any(lang == "python" and not skip for lang, _, skip in _blocks(p))]


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_name)
def test_python_examples_run(page, tmp_path, monkeypatch, capsys):
    """A page's python blocks run in order in one namespace, in an empty folder where `presets` is the
    repository's (examples write their outputs there)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "presets").symlink_to(ROOT / "presets")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for index, (language, code, skip) in enumerate(_blocks(page)):
        if language == "python" and not skip:
            exec(compile(code, f"{_name(page)}[python block {index}]", "exec"), namespace)
    assert capsys.readouterr().out, "the examples print what they show"
