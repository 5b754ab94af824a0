"""Has the agent tampered with the programs the check scripts run? Asked after every check.

The check scripts run from the trusted copy (:mod:`.trusted`), but a bash check calls other
programs by name (``grep``, ``wc``, ``awk``, ``find`` ...) through the container's ``PATH``, and
``xargs``, ``find -exec`` and Python's ``subprocess`` start programs the same way; every
dynamically linked program is loaded by the container's loader. Redirecting those names is not
possible without changing ``PATH``, which several checks read ("how many paths are in
``$PATH``?"), and bash's hash table is emptied by any assignment to ``PATH`` (checks that
``source ~/.bashrc``) and reaches neither ``xargs`` nor ``subprocess``. So instead of redirecting, the
worker checks, with the pristine Python run by the pristine loader, that nothing a check can run
was changed after the task's own set-up (the init and start scripts), using the change time
(``ctime``), which root in the container cannot set back:

- a file under ``/usr`` (programs, libraries, the loader, Python's standard library, perl
  modules ...) changed since then whose content, kind or link target differs from the pristine
  copy (``chmod u-s /usr/bin/find``, a task of the test split, changes the mode only: allowed);
- a new file in a directory of the checks' ``PATH`` named like a pristine program
  (``/usr/local/bin/grep`` shadows ``/usr/bin/grep``);
- a new Python start-up hook (``*.pth``, ``sitecustomize.py``, ``usercustomize.py``) under
  ``/usr`` or ``~/.local`` (a ``python3`` that a bash check starts imports ``site``);
- ``/bin``, ``/sbin``, ``/lib``, ``/lib64`` replaced (the loader's path ``/lib64/ld-linux...``
  goes through them), and ``/etc/ld.so.preload`` (a library loaded into every program).

The verdict must carry a random token the worker chose: a faked program that prints nothing and
exits 0 cannot produce it. A check whose container was tampered with scores 0 (the reasons go in
the result's ``tampered``). Left out, by design or as the limit of this approach (README): files
the agent changes and then restores before the check ends (a ``ctime`` later than the set-up but
the pristine content), what a check itself sources from the agent's files (``source ~/.bashrc``),
and programs the task's set-up added.
"""

from __future__ import annotations

import secrets
import shlex

from agentrl_ext.env.providers.base import SessionResource

from .trusted import TRUSTED_ROOT, TrustedTools

# Run as ``python3 -I -S -c GATE TOKEN SINCE_NS TRUSTED_ROOT``; prints ``TOKEN clean`` or one line
# per problem and then ``TOKEN tampered``.
GATE = r"""
import os, stat, sys
token, since, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
problems = []
def changed(path):
    try:
        return os.lstat(path).st_ctime_ns > since
    except OSError:
        return False
def same(path, pristine):
    a, b = os.lstat(path), os.lstat(pristine)
    if stat.S_IFMT(a.st_mode) != stat.S_IFMT(b.st_mode):
        return False
    if stat.S_ISLNK(a.st_mode):
        return os.readlink(path) == os.readlink(pristine)
    if stat.S_ISREG(a.st_mode):
        if a.st_size != b.st_size:
            return False
        with open(path, "rb") as x, open(pristine, "rb") as y:
            while True:
                u, v = x.read(1 << 20), y.read(1 << 20)
                if u != v:
                    return False
                if not u:
                    return True
    return True
search = [d for d in os.environ.get("PATH", "").split(":") if d]
programs = set()
for d in search:
    real = os.path.realpath(d)
    if real.startswith("/usr/") and os.path.isdir(root + real):
        programs.update(os.listdir(root + real))
search_real = {os.path.realpath(d) for d in search}
hooks = ("sitecustomize.py", "usercustomize.py")
for name in ("/bin", "/sbin", "/lib", "/lib64"):
    if changed(name):
        problems.append(f"{name} was replaced")
if os.path.lexists("/etc/ld.so.preload") and (changed("/etc/ld.so.preload") or os.path.getsize("/etc/ld.so.preload")):
    problems.append("/etc/ld.so.preload preloads a library into every program")
home = os.path.expanduser("~/.local")
for top in ("/usr", home):
    for folder, dirs, files in os.walk(top):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            if not changed(path):
                continue
            pristine = root + path
            if path.startswith("/usr/") and os.path.lexists(pristine):
                try:
                    if not same(path, pristine):
                        problems.append(f"{path} differs from the image's")
                except OSError as exc:
                    problems.append(f"{path} cannot be compared: {exc}")
            elif folder in search_real and name in programs:
                problems.append(f"{path} shadows the image's {name}")
            elif name in hooks or name.endswith(".pth"):
                problems.append(f"{path} is a Python start-up hook")
for line in problems[:20]:
    print(line)
print(token, "tampered" if problems else "clean")
"""


async def container_clock_ns(box: SessionResource, trusted: TrustedTools) -> int:
    """The container's clock now (what its files' ``ctime`` is compared with), read by the
    pristine bash (``$EPOCHREALTIME``, microseconds)."""
    result = await box.exec(
        'printf "%s" "$EPOCHREALTIME"',
        timeout_s=30.0,
        max_output_chars=64,
        env=trusted.env,
        programs_dir=trusted.programs_dir,
        launcher=trusted.launcher,
    )
    text = result.output.strip().replace(",", ".")
    seconds, _, fraction = text.partition(".")
    if result.exit_code != 0 or not seconds.isdigit():
        raise RuntimeError(
            f"cannot read the container's clock: exit {result.exit_code}, output {text[:200]!r}"
        )
    return int(seconds) * 10**9 + int((fraction + "000000")[:6]) * 1000


async def tampering(box: SessionResource, trusted: TrustedTools, since_ns: int) -> list[str]:
    """What the agent changed that a check could run (empty: nothing), since ``since_ns``."""
    token = secrets.token_hex(16)
    python = [*trusted.launcher, f"{trusted.programs_dir}/python3", "-I", "-S", "-c", GATE]
    command = "exec " + shlex.join([*python, token, str(since_ns), TRUSTED_ROOT])
    result = await box.exec(
        command,
        timeout_s=60.0,
        max_output_chars=1 << 16,
        env=trusted.env,
        programs_dir=trusted.programs_dir,
        launcher=trusted.launcher,
    )
    lines = result.output.splitlines()
    verdict = lines[-1].strip() if lines else ""
    if verdict == f"{token} clean":
        return []
    if verdict == f"{token} tampered":
        return lines[:-1]
    shown = result.output[-300:] if result.output.strip() else "no output"
    return [f"the integrity check gave no verdict (exit code {result.exit_code}, {shown})"]
