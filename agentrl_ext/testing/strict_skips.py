"""A pytest plugin: in strict mode a skipped test is a failed test, unless it is marked ``gpu``.

A missing Docker engine, database server, vendored data copy or package makes a fixture call
``pytest.skip``; outside strict mode that keeps a laptop run useful, but in CI it would turn a
broken set-up into a green run. Strict mode is on when ``$AGENTRL_STRICT_SKIPS`` is ``1`` (what
``scripts/test.sh`` and ``make test`` set) or ``$CI`` is true (what CI services set), and off
whenever ``$AGENTRL_ALLOW_SKIPS`` is ``1`` (the user's explicit opt-out). Only tests marked
``gpu`` may skip in strict mode: a CPU machine cannot run them.

Whatever the mode, the end of the run lists the skips grouped by reason, with their count, so the
summary says how many tests skipped and why. Enable with ``-p agentrl_ext.testing.strict_skips``
(``setup.cfg`` does, for this repository's tests).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field

import pytest

STRICT_ENV = "AGENTRL_STRICT_SKIPS"
ALLOW_ENV = "AGENTRL_ALLOW_SKIPS"
CI_ENV = "CI"
ALLOWED_MARKER = "gpu"
_TRUE = {"1", "true", "yes", "on"}


def strict_mode(environ: Mapping[str, str]) -> tuple[bool, str]:
    """Whether skips fail the run under ``environ``, and the variable that decided it."""
    if environ.get(ALLOW_ENV, "").strip().lower() in _TRUE:
        return False, f"{ALLOW_ENV}={environ[ALLOW_ENV]}"
    if environ.get(STRICT_ENV, "").strip().lower() in _TRUE:
        return True, f"{STRICT_ENV}={environ[STRICT_ENV]}"
    if environ.get(CI_ENV, "").strip().lower() in _TRUE:
        return True, f"{CI_ENV}={environ[CI_ENV]}"
    return False, f"neither {STRICT_ENV} nor {CI_ENV} is set"


def _skip_reason(longrepr: object) -> str:
    """The reason pytest recorded for a skip (``(path, line, 'Skipped: why')``)."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return reason.removeprefix("Skipped: ")


def _one_line(reason: str, limit: int = 200) -> str:
    """A reason on one summary line: its lines joined, cut at ``limit`` characters."""
    text = " / ".join(line.strip() for line in reason.splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class _Tally:
    """The skips seen so far: allowed ones by reason, refused ones by reason."""

    strict: bool
    why: str
    allowed: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)


_KEY = pytest.StashKey[_Tally]()


def _refusal(reason: str, why: str) -> str:
    return (
        f"skipped in strict mode ({why}): {reason}\n"
        f"Only tests marked '{ALLOWED_MARKER}' may skip when {STRICT_ENV}=1 or {CI_ENV}=true. Fix the "
        f"set-up named above (scripts/test.sh installs and starts what the tests need), or set "
        f"{ALLOW_ENV}=1 to let such tests skip."
    )


def pytest_configure(config: pytest.Config) -> None:
    strict, why = strict_mode(os.environ)
    config.stash[_KEY] = _Tally(strict=strict, why=why)


def pytest_report_header(config: pytest.Config) -> str:
    tally = config.stash[_KEY]
    state = "on: a skip not marked 'gpu' fails" if tally.strict else "off"
    return f"strict skips: {state} ({tally.why})"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not report.skipped or hasattr(report, "wasxfail"):
        return report
    tally = item.config.stash[_KEY]
    reason = _skip_reason(report.longrepr)
    if not tally.strict or item.get_closest_marker(ALLOWED_MARKER) is not None:
        tally.allowed[reason] += 1
        return report
    tally.refused[reason] += 1
    report.outcome = "failed"
    report.longrepr = _refusal(reason, tally.why)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A whole module or folder skipped at import (``pytest.importorskip``) counts the same way."""
    report = yield
    if report.skipped:
        tally = collector.config.stash[_KEY]
        reason = _skip_reason(report.longrepr)
        if tally.strict and collector.get_closest_marker(ALLOWED_MARKER) is None:
            tally.refused[f"{collector.nodeid} (skipped at collection): {reason}"] += 1
        else:
            tally.allowed[f"{collector.nodeid} (skipped at collection): {reason}"] += 1
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Collection-time skips are not test reports: they fail the session here instead."""
    tally = session.config.stash[_KEY]
    if tally.refused and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    tally = terminalreporter.config.stash[_KEY]
    if not tally.allowed and not tally.refused:
        return
    terminalreporter.section("skips by reason")
    for title, counts in (
        (f"failed in strict mode ({tally.why})", tally.refused),
        ("skipped" + (f" (marked '{ALLOWED_MARKER}')" if tally.strict else ""), tally.allowed),
    ):
        if counts:
            terminalreporter.write_line(f"{sum(counts.values())} {title}:")
            for reason, count in counts.most_common():
                terminalreporter.write_line(f"  {count:4d} x {_one_line(reason)}")
