"""Running the agent's bash and the task's scripts in a session's sandbox.

AgentBench-FC keeps one interactive ``bash --login`` per episode on a terminal and types each
``bash_action`` into it, so the working directory, variables, functions and aliases carry over
from one action to the next (and from the task's ``start`` script to the first action). Here
every action is one ``docker exec`` (``SessionResource.exec``: coreutils ``timeout``, output
capped) of a small bash wrapper that restores the shell state the previous action left, runs the
action with ``eval``, and saves the state again, so the agent sees the same carried-over shell
without a terminal to parse. Differences (documented in the README): no terminal (stdin is empty,
so a command waiting for input gets end-of-file instead of hanging; no prompt or colour codes in
the output), and a command that outlives the time limit is killed with its process group.

Scripts (``init``, ``check``, ``example``) run as AgentBench's ``execute_independent`` runs them:
``bash -c CODE -- ARGS`` or ``python3 -c CODE ARGS``, in a fresh process (no carried state); in a
container with the interpreters of :mod:`.trusted` (a read-only pristine ``/usr``, run by its own
dynamic loader) and Python as ``python3 -I -S``, so an agent that replaced ``python3``, ``bash`` or
the loader cannot pass a check; what the checks call by name is guarded by :mod:`.integrity`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from agentrl_ext.env.providers.base import ExecResult, SessionResource

from .data import Script
from .trusted import TrustedTools

SHELL_DIR = "/run/agentrl-shell"
"""Where the wrapper keeps the shell state and the running action's output in a container
(outside ``/root`` and ``/tmp``, which tasks list and count)."""
SCRIPT_OUTPUT_CHARS = 1 << 20
"""Output kept from init/check/example scripts (AgentBench keeps all of it)."""

# The wrapper; AGENTRL_CMD is the agent's code, AGENTRL_SHELL_DIR the state folder.
WRAPPER = r"""
__agentrl_dir="$AGENTRL_SHELL_DIR"; __agentrl_cmd="$AGENTRL_CMD"; unset AGENTRL_SHELL_DIR AGENTRL_CMD
mkdir -p "$__agentrl_dir" 2>/dev/null
__agentrl_out="$(mktemp "$__agentrl_dir/out.XXXXXX")" || exit 125
exec 3>&1 4>&2
__agentrl_exit() {
  __agentrl_rc=$?
  __agentrl_opts="$(set +o)"
  set +eu
  exec 1>&3 2>&4
  {
    for __agentrl_name in $(compgen -v); do
      case "$__agentrl_name" in
        __agentrl_*|BASH|BASH_*|BASHOPTS|BASHPID|COLUMNS|COMP_*|DIRSTACK|EPOCHREALTIME|EPOCHSECONDS|EUID|\
FUNCNAME|GROUPS|HISTCMD|HOSTNAME|HOSTTYPE|LINENO|LINES|MACHTYPE|OPTERR|OPTIND|OSTYPE|PIPESTATUS|PPID|\
PWD|RANDOM|SECONDS|SHELLOPTS|SHLVL|SRANDOM|UID|_) continue ;;
      esac
      declare -p "$__agentrl_name" 2>/dev/null
    done
    declare -f
    alias -p
    shopt -p
    printf '%s\n' "$__agentrl_opts"
    printf 'umask %s\n' "$(umask)"
    printf 'cd -- %q\n' "$PWD"
  } >"$__agentrl_dir/state.new" 2>/dev/null && mv -f "$__agentrl_dir/state.new" "$__agentrl_dir/state"
  head -c 1048576 "$__agentrl_out"
  rm -f "$__agentrl_out"
  exit "$__agentrl_rc"
}
trap __agentrl_exit EXIT
trap 'exit 124' TERM
if [ -f "$__agentrl_dir/state" ]; then . "$__agentrl_dir/state" >/dev/null 2>&1; fi
shopt -s expand_aliases
eval "$__agentrl_cmd" </dev/null >"$__agentrl_out" 2>&1 3>&- 4>&-
"""

# AgentBench cleans these terminal sequences out of every output; a command may print them too.
_TERMINAL_SEQUENCES = (
    re.compile(r"\x1b.+@.+[#|$] "),
    re.compile(r"\x1b\[[0-9;]*[a-zA-Z]"),
    re.compile(r"\x1b][0-9]*;[^\x07]*\x07"),
    re.compile(r"\x1b\[\?2004[hl]"),
    re.compile(r"\x07"),
)


def clean_output(text: str) -> str:
    """Remove prompt, colour and title sequences as AgentBench does."""
    for pattern in _TERMINAL_SEQUENCES:
        text = pattern.sub("", text)
    return text


@dataclass
class Shell:
    """The agent's carried-over shell in one session's sandbox.

    Args:
        box: the session's container (or local directory).
        state_dir: where the wrapper keeps its state inside the sandbox.
        timeout_s: limit of one action (AgentBench: 30 s).
        workdir: working directory of the first action (AgentBench: ``/root``); None: the sandbox's.
    """

    box: SessionResource
    state_dir: str = SHELL_DIR
    timeout_s: float = 30.0
    workdir: str | None = None

    async def run(self, code: str) -> ExecResult:
        """Run ``code`` in the carried-over shell; output is stdout and stderr together.

        ``max_output_chars`` keeps one character more than AgentBench shows, so the caller can
        tell an output of exactly 800 characters from a longer one.
        """
        result = await self.box.exec(
            WRAPPER,
            timeout_s=self.timeout_s,
            max_output_chars=4 * 800,
            workdir=self.workdir,
            env={"AGENTRL_CMD": code, "AGENTRL_SHELL_DIR": self.state_dir},
        )
        return ExecResult(
            result.exit_code,
            clean_output(result.output),
            result.truncated,
            result.timed_out,
            result.duration_s,
        )


ISOLATED_PYTHON = (
    "import sys, site; site.setquit(); site.setcopyright(); site.sethelper(); "
    "code = sys.argv.pop(1); exec(compile(code, '<string>', 'exec'), {'__name__': '__main__'})"
)
"""``python3 -I -S -c`` runs this with the script and its arguments: the builtins ``site`` adds
(``exit``, ``quit``: the checks call ``exit(0)``) without what ``site`` imports from outside the
trusted copy (``sitecustomize``, ``dist-packages``); the script then sees ``sys.argv`` as
``python3 -c CODE ARGS`` shows it."""


def script_command(
    script: Script, params: list[str], programs_dir: str | None = None, launcher: Sequence[str] = ()
) -> str:
    """The command line of an independent script with its arguments (stdout only; ``exec``, so no
    extra shell shows in the process list, as in AgentBench's direct exec).

    ``programs_dir``: take ``bash`` and ``python3`` from there (a folder the agent cannot
    change), Python as ``python3 -I -S`` with :data:`ISOLATED_PYTHON` (no ``site`` imports, no
    environment, no current directory on ``sys.path``); None: the sandbox's own, on ``PATH``.
    ``launcher``: put before them (the trusted dynamic loader, see :attr:`.trusted.TrustedTools.launcher`).
    """
    where = f"{programs_dir.rstrip('/')}/" if programs_dir else ""
    if script.language == "bash":
        argv = [*launcher, f"{where}bash", "-c", script.code] + (["--", *params] if params else [])
    elif script.language == "python" and programs_dir:
        argv = [*launcher, f"{where}python3", "-I", "-S", "-c", ISOLATED_PYTHON, script.code, *params]
    elif script.language == "python":
        argv = ["python3", "-c", script.code, *params]
    else:  # data.LANGUAGES admits nothing else
        raise ValueError(f"unsupported script language {script.language!r}")
    return "exec " + shlex.join(argv) + " 2>/dev/null"


async def run_script(
    box: SessionResource,
    script: Script,
    params: list[str],
    timeout_s: float,
    workdir: str | None,
    trusted: TrustedTools | None = None,
) -> ExecResult:
    """Run an init/check/example script in a fresh process; its stdout, kept whole.

    ``trusted``: run it with the interpreters of :class:`.trusted.TrustedTools` (which the agent
    cannot have replaced); None runs the sandbox's own.
    """
    return await box.exec(
        script_command(
            script, params, trusted.programs_dir if trusted else None, trusted.launcher if trusted else ()
        ),
        timeout_s=timeout_s,
        max_output_chars=SCRIPT_OUTPUT_CHARS,
        workdir=workdir,
        env=trusted.env if trusted else None,
        programs_dir=trusted.programs_dir if trusted else None,
        launcher=trusted.launcher if trusted else (),
    )
