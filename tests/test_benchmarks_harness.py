"""The benchmark scripts keep no timing loop of their own: every clock read goes through benchmarks/common.py
(`timed_rounds` / `against_plain` / `time_operators` / `Stopwatch`, on hfspec.measure), each script's --help
runs, and benchmarks/run_all.sh runs every script with arguments its parser accepts."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import runpy
import shlex
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
NOT_YET: set[str] = set()
CLOCKS = {"perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns", "process_time",
          "process_time_ns"}
SCRIPTS = sorted(p.name for p in BENCH.glob("bench_*.py"))
CHECKED = [name for name in SCRIPTS if name not in NOT_YET]


def clock_reads(source: str) -> list[str]:
    """Where a script reads a clock itself: `time.<clock>` (under any alias of the time module), `from time
    import <clock>`, or timeit in any form."""
    tree = ast.parse(source)
    time_names = {"time"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "time":
                    time_names.add(alias.asname or "time")
                if alias.name == "timeit":
                    found.append(f"line {node.lineno}: import timeit")
        elif isinstance(node, ast.ImportFrom):
            if node.module == "timeit":
                found.append(f"line {node.lineno}: from timeit import …")
            if node.module == "time":
                found += [f"line {node.lineno}: from time import {a.name}" for a in node.names if a.name in CLOCKS]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in CLOCKS and isinstance(node.value, ast.Name)
                and node.value.id in time_names):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "timeit":
            found.append(f"line {node.lineno}: timeit.{node.attr}")
    return found


def test_the_scan_sees_clock_reads():
    assert clock_reads("import time\nt = time.perf_counter()\n")
    assert clock_reads("import time as t\nclock = t.time\n")
    assert clock_reads("from time import perf_counter\n")
    assert clock_reads("import timeit\ntimeit.timeit('1')\n")
    assert not clock_reads("import time\ntime.sleep(0)\nfrom common import Stopwatch\nStopwatch().seconds\n")


@pytest.mark.parametrize("name", CHECKED)
def test_no_script_reads_a_clock_itself(name):
    found = clock_reads((BENCH / name).read_text())
    assert not found, (f"{name} times things itself ({'; '.join(found)}): use common.timed_rounds / against_plain "
                       "(decodes), common.time_operators (operators) or common.Stopwatch (a one-shot duration)")


@pytest.fixture
def as_script(monkeypatch):
    """Run a benchmark script as `python benchmarks/<name> args…` does, in this process (the script's folder
    first on sys.path); the modules it imported are dropped afterwards."""
    before = set(sys.modules)
    monkeypatch.syspath_prepend(str(BENCH))

    def run(name: str, args: list[str]):
        monkeypatch.setattr(sys, "argv", [str(BENCH / name), *args])
        runpy.run_path(str(BENCH / name), run_name="__main__")

    yield run
    for module in set(sys.modules) - before:
        if getattr(sys.modules[module], "__file__", None) and str(BENCH) in str(sys.modules[module].__file__):
            del sys.modules[module]


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_runs(name, as_script):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        as_script(name, ["--help"])
    assert done.value.code in (0, None), out.getvalue()
    assert "usage:" in out.getvalue()


def run_all_commands() -> list[tuple[str, list[str]]]:
    """(script, arguments) of every benchmark script run_all.sh runs, its shell quoting undone."""
    text = (BENCH / "run_all.sh").read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0] not in ("run", "["):
            continue
        for i, word in enumerate(words[:-1]):
            if word == "python" and words[i + 1].startswith("bench_") and words[i + 1].endswith(".py"):
                end = next((j for j in range(i + 2, len(words)) if words[j] in ("&&", "||", ";", "|")), len(words))
                commands.append((words[i + 1], words[i + 2:end]))
    return commands


def test_run_all_runs_every_script():
    ran = {script for script, _ in run_all_commands()}
    assert ran == set(SCRIPTS), f"run_all.sh misses {sorted(set(SCRIPTS) - ran)}, runs unknown {sorted(ran - set(SCRIPTS))}"


class _Parsed(Exception):
    pass


@pytest.mark.parametrize("script,args", run_all_commands(), ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_run_all_arguments_parse(script, args, as_script, monkeypatch):
    """Each command of run_all.sh gets past its script's argument parser (the script stops right there)."""
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(real(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            as_script(script, args)
    except _Parsed:
        return
    except SystemExit as e:
        pytest.fail(f"run_all.sh: {script} {' '.join(args)} is refused (exit {e.code}): {err.getvalue()}")
    pytest.fail(f"{script} never parsed its arguments")
