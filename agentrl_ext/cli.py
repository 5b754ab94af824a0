"""What every console script shares, so that they read alike.

- ``--tasks a,b`` (repeatable) names tasks, ``--controller-url URL`` the controller's API base;
  the old spellings (``--task``, ``--controller``) still work and are left out of the help;
- ``--out`` names the command's output: a file where there is one main file (``agentrl-build-dataset``:
  the parquet file; ``agentrl-eval-run``: the summary JSON, its episodes file written beside it), a
  folder where there are several of equal rank (``agentrl-plot``: the PNGs);
- help shows every default (:class:`HelpFormatter`) and no reST markup (:func:`plain`);
- a mistake is one line on stderr naming the value and the fix, never a traceback.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

#: the controller's port on 127.0.0.1: ``agentrl-controller``, ``agentrl-envs up``, ``agentrl.envs.port``
DEFAULT_CONTROLLER_PORT = 5020
#: where ``agentrl-envs up`` serves the controller
DEFAULT_CONTROLLER_URL = f"http://127.0.0.1:{DEFAULT_CONTROLLER_PORT}/api"

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def plain(text: str | None) -> str:
    """``text`` without reST markup: ``x`` and :func:`x` become x."""
    return _ROLE.sub(r"\1", text or "").replace("``", "")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown (not None / False ones), descriptions kept as written, and an option's old
    spellings (its long option strings after the first) left out."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        short = [s for s in action.option_strings if not s.startswith("--")]
        first_long = [s for s in action.option_strings if s.startswith("--")][:1]
        shown = [*short, *first_long]
        if action.nargs == 0:
            return ", ".join(shown)
        metavar = self._format_args(action, self._get_default_metavar_for_optional(action))
        return ", ".join(f"{s} {metavar}" for s in shown)


def parser(prog: str, doc: str | None, **kwargs: object) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` for ``prog`` with :class:`HelpFormatter`, described by ``doc`` (reST removed)."""
    return argparse.ArgumentParser(
        prog=prog,
        description=plain(doc).strip() or None,
        formatter_class=HelpFormatter,
        **kwargs,  # type: ignore[arg-type]
    )


def add_controller_url(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    default: str | None = DEFAULT_CONTROLLER_URL,
    help: str = "the controller's API base (agentrl-envs up serves it)",  # noqa: A002
) -> None:
    """``--controller-url`` (old spelling ``--controller``), into ``args.controller_url``."""
    p.add_argument("--controller-url", "--controller", dest="controller_url", default=default, help=help)


def add_tasks(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    required: bool = True,
    help: str = "task names, comma-separated (or --tasks repeated)",  # noqa: A002
) -> None:
    """``--tasks a,b`` (repeatable; old spelling ``--task``), into ``args.tasks``; read with :func:`tasks_of`."""
    p.add_argument("--tasks", "--task", dest="tasks", action="append", required=required, help=help)


def tasks_of(values: Sequence[str] | None) -> list[str]:
    """The task names of ``--tasks`` values, in order, each once."""
    return list(dict.fromkeys(t.strip() for v in values or [] for t in v.split(",") if t.strip()))
