"""ALFWorld games on TextWorld's PDDL engine, each in a process of its own.

A game is opened the way AgentBench's ALFWorld task opens it (``SingleAlfredTWEnv`` of
``alfworld`` 0.4.x for an evaluation split): TextWorld's PDDL environment with ALFWorld's
``AlfredDemangler`` (object names such as ``cabinet 1``, no shuffling) and ``AlfredInfos``,
asking for ``won`` and ``admissible_commands``.

Why a process per game: the engine is not made for many games in one process. Its planner
library keeps the loaded task in C globals (TextWorld loads a private copy of
``libdownward.so`` for every game and never unloads it), and the PDDL translation rewrites
``sys.argv``, swaps ``sys.stdout`` and flips module-level options while it runs. AgentBench runs
each game in a subprocess for the same reason (``asynchronous=True``).

Here a *zygote* process (started once per worker, single-threaded, the engine imported) forks one
child per game and hands it one end of a socket pair (``SCM_RIGHTS``); the worker talks to the
child over the other end (``multiprocessing.connection`` framing). Opening a game thus costs a
fork plus the game's own PDDL translation, the worker's event loop never blocks, games run on
several cores, and a game that crashes or hangs takes only its own session down (``task error``).
(``multiprocessing``'s forkserver would re-import the worker's ``__main__`` in every child.) The
zygote exits when the worker's end of its control socket closes (also when the worker is
killed); a game child exits when its socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ENGINE_PACKAGES = ("textworld", "fast_downward", "alfworld", "nltk")
INSTALL_HINT = "pip install 'agentrl_ext[alfworld]' (scripts/setup.sh installs it)"
_PRELOAD = ("textworld", "textworld.envs.pddl", "fast_downward", "alfworld.agents.environment.alfred_tw_env")
_PID = struct.Struct("!q")


class EngineError(RuntimeError):
    """The game process failed (its traceback is in the message) or died."""


def engine_missing() -> str | None:
    """None when the ALFWorld engine can be imported, else what is missing and how to install it."""
    import importlib.util

    missing = [name for name in ENGINE_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        return f"the ALFWorld engine is not installed (missing: {', '.join(missing)}); {INSTALL_HINT}"
    return None


@dataclass(frozen=True)
class GameState:
    """What the engine says after a reset or a step."""

    feedback: str
    admissible: list[str]
    won: bool
    done: bool


# ---------------------------------------------------------------------------------- the game process


def _open_game(gamefile: str) -> Any:
    """TextWorld's environment for ``gamefile``, wrapped as AgentBench's ALFWorld task does."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    argv = list(sys.argv)
    try:
        return textworld.start(gamefile, infos, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos])
    finally:
        sys.argv[:] = argv  # the PDDL translation rewrites sys.argv


def _state(state: Any) -> GameState:
    won = bool(state["won"])
    return GameState(
        str(state["feedback"]), list(state["admissible_commands"]), won, won or bool(state["lost"])
    )


def _plan(env: Any) -> list[str]:
    """The game's walkthrough when its file has one, else the PDDL planner's plan from the current state."""
    walkthrough = env.walkthrough
    if walkthrough:
        return [str(command) for command in walkthrough]
    argv = list(sys.argv)
    try:
        return [str(command) for command in env._pddl_state.replan(env._entity_infos)]
    finally:
        sys.argv[:] = argv


def _game_main(conn: Connection, gamefile: str) -> None:
    """The game process: open the game, then answer ``step``/``plan`` requests until ``close`` or EOF."""
    env = None
    try:
        env = _open_game(gamefile)
        conn.send(("ok", _state(env.reset())))
        while True:
            try:
                op, argument = conn.recv()
            except EOFError:  # the worker is gone
                return
            if op == "close":
                return
            try:
                if op == "step":
                    state, _, _ = env.step(argument)
                    conn.send(("ok", _state(state)))
                elif op == "plan":
                    conn.send(("ok", _plan(env)))
                else:
                    conn.send(("error", f"unknown request {op!r}"))
            except Exception:  # noqa: BLE001 - the traceback goes back to the worker
                conn.send(("error", traceback.format_exc()))
    except Exception:  # noqa: BLE001
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


# ---------------------------------------------------------------------------------- the zygote


def _zygote_main(control_fd: int) -> None:
    """The zygote: import the engine, then fork a game process for every (game file, socket) received."""
    import importlib

    for module in _PRELOAD:
        importlib.import_module(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # game processes are reaped automatically
    control = socket.socket(fileno=control_fd)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 65536, 1)
        except OSError:
            return
        if not message or not fds:  # the worker is gone
            return
        pid = os.fork()
        if pid == 0:  # the game process
            status = 0
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _game_main(Connection(fds[0]), message.decode())
            except BaseException:  # noqa: BLE001
                status = 1
            finally:
                os._exit(status)
        os.close(fds[0])
        control.sendall(_PID.pack(pid))


class _Zygote:
    """The worker's handle on its zygote process (started on first use, restarted if it died)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._lock = asyncio.Lock()

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        module = __name__
        code = f"from {module} import _zygote_main; _zygote_main({theirs.fileno()})"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._process = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL
        )
        theirs.close()
        ours.setblocking(False)
        self._control = ours

    @property
    def pid(self) -> int | None:
        """The zygote's process id (None before it started)."""
        return self._process.pid if self._process is not None else None

    async def fork(self, gamefile: str) -> tuple[int, Connection]:
        """A new game process for ``gamefile``: its pid and the worker's end of its socket."""
        async with self._lock:
            if self._process is None or self._process.poll() is not None:
                if self._control is not None:
                    self._control.close()
                self._start()
            assert self._control is not None
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                socket.send_fds(self._control, [gamefile.encode()], [theirs.fileno()])
            finally:
                theirs.close()
            loop = asyncio.get_running_loop()
            reply = b""
            while len(reply) < _PID.size:
                chunk = await loop.sock_recv(self._control, _PID.size - len(reply))
                if not chunk:
                    ours.close()
                    raise EngineError("the ALFWorld zygote process died (it forks the game processes)")
                reply += chunk
            (pid,) = _PID.unpack(reply)
            return pid, Connection(ours.detach())

    def close(self) -> None:
        """Stop the zygote (its game processes end when their sockets close)."""
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5.0)
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()
            self._process = None


_zygotes: dict[asyncio.AbstractEventLoop, _Zygote] = {}


def _zygote() -> _Zygote:
    """The zygote of the running event loop (a worker has one loop; tests may run several)."""
    loop = asyncio.get_running_loop()
    if loop not in _zygotes:
        shutdown()  # the zygote of a finished loop (tests)
        _zygotes[loop] = _Zygote()
    return _zygotes[loop]


def shutdown() -> None:
    """Stop the zygote of this process (the task's teardown)."""
    for zygote in _zygotes.values():
        zygote.close()
    _zygotes.clear()


# ---------------------------------------------------------------------------------- the worker side


class GameProcess:
    """One running game in its own process; every call is a coroutine that never blocks the loop."""

    def __init__(self, pid: int, conn: Connection, zygote_pid: int | None) -> None:
        self.pid = pid
        self._conn = conn
        self._zygote_pid = zygote_pid
        self._busy = asyncio.Lock()

    @classmethod
    async def open(cls, gamefile: str | os.PathLike[str]) -> tuple[GameProcess, GameState]:
        """Fork the process for ``gamefile``; returns it with the state after reset."""
        zygote = _zygote()
        pid, conn = await zygote.fork(str(Path(gamefile)))
        game = cls(pid, conn, zygote.pid)
        try:
            state = await game._answer()
        except BaseException:
            game.close()
            raise
        assert isinstance(state, GameState)
        return game, state

    async def step(self, command: str) -> GameState:
        """Send ``command`` to the game."""
        state = await self._request("step", command)
        assert isinstance(state, GameState)
        return state

    async def plan(self) -> list[str]:
        """The expert plan: the game's walkthrough, else the PDDL planner's plan from the current state."""
        plan = await self._request("plan", None)
        assert isinstance(plan, list)
        return plan

    async def _request(self, op: str, argument: Any) -> Any:
        async with self._busy:
            try:
                self._conn.send((op, argument))
            except OSError as exc:
                raise EngineError(f"the ALFWorld game process {self.pid} is gone ({exc})") from exc
            return await self._answer()

    async def _answer(self) -> Any:
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()
        fd = self._conn.fileno()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, ready)
        try:
            await readable
        finally:
            loop.remove_reader(fd)
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise EngineError(f"the ALFWorld game process {self.pid} died without answering") from exc
        if kind == "error":
            raise EngineError(f"the ALFWorld engine failed:\n{value}")
        return value

    def close(self) -> None:
        """End the game: its process exits when its socket closes; killed if still there after 2 s."""
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("close", None))
        with contextlib.suppress(OSError):
            self._conn.close()
        pid, parent = self.pid, self._zygote_pid

        def kill() -> None:  # only if that pid is still a child of our zygote (pids are reused)
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                    os.kill(pid, signal.SIGKILL)

        try:
            asyncio.get_running_loop().call_later(2.0, kill)
        except RuntimeError:  # no running loop
            kill()
