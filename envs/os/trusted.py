"""The programs the task's own scripts run with: a read-only copy of the session image's ``/usr``.

The agent is root in its container and may replace any program there: with ``python3`` (and
``bash``, ``timeout``, ``cat`` ...) replaced by ``exit 0`` every check script would pass
(AgentBench's check scripts run ``python3`` and ``bash`` through the container's ``PATH``; the
same flaw is upstream's). So the init, check and example scripts run with programs the agent
cannot have touched: a named Docker volume holding a pristine copy of the image's ``/usr``
(Docker fills an empty named volume from the image at its first mount), mounted read-only at
:data:`TRUSTED_ROOT` in every session container. Without ``CAP_SYS_ADMIN`` (Docker drops it)
root in the container can neither remount nor unmount it. The interpreters come from that copy
by absolute path (``timeout``, ``bash``, ``python3``), each started by the copy's own dynamic
loader (:attr:`TrustedTools.launcher`), with its libraries on ``LD_LIBRARY_PATH``;
Python scripts run with ``-I -S`` and only ``site``'s builtins (``exit``) set up (no
``sitecustomize``, no ``site-packages``, no current directory on ``sys.path``: the checks import
only the standard library; :data:`.shell.ISOLATED_PYTHON`). ``PATH`` stays the container's:
scripts such as "count the executables on PATH" compute the expected answer from it.

The programs a script calls by name (``grep``, ``wc`` ... on the container's ``PATH``, loaded by
the container's loader) are not redirected: :mod:`.integrity` checks after each passing check
that none of them, nor the loader, nor a Python start-up hook, was changed (README).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

TRUSTED_ROOT = "/run/agentrl-trusted"
"""Where the pristine ``/usr`` is mounted in a session container (read-only)."""
VOLUME_PREFIX = "agentrl-os-trusted-"
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class TrustedTools:
    """A volume with a pristine ``/usr`` of one image, and the environment scripts run with."""

    volume: str
    library_dir: str
    """The image's multiarch library folder, e.g. ``/usr/lib/x86_64-linux-gnu``."""
    loader: str = "ld-linux-x86-64.so.2"
    """The dynamic loader's file name in :attr:`library_dir`."""

    @property
    def mounts(self) -> dict[str, str]:
        """For ``ResourceSpec.read_only_volumes``."""
        return {self.volume: f"{TRUSTED_ROOT}/usr"}

    @property
    def programs_dir(self) -> str:
        """Where the pristine ``timeout``, ``bash`` and ``python3`` are."""
        return f"{TRUSTED_ROOT}/usr/bin"

    @property
    def launcher(self) -> tuple[str, ...]:
        """What runs a trusted program: the pristine dynamic loader with the pristine libraries, so
        neither the container's loader (``PT_INTERP``, ``/lib64/...``) nor its libraries load it."""
        libraries = f"{TRUSTED_ROOT}{self.library_dir}"
        return (f"{libraries}/{self.loader}", "--library-path", libraries)

    @property
    def env(self) -> dict[str, str]:
        """``LD_LIBRARY_PATH`` of a script: the pristine libraries for the pristine programs."""
        return {"LD_LIBRARY_PATH": f"{TRUSTED_ROOT}{self.library_dir}"}


def prepare_trusted_tools(client: Any, image: str, labels: dict[str, str]) -> TrustedTools:
    """The trusted volume of ``image`` (created and filled once per image id; later calls reuse it).

    Args:
        client: a ``docker.DockerClient``.
        image: the session image.
        labels: labels of the volume and of the short-lived container that fills it.
    """
    image_id = str(client.images.get(image).id).split(":")[-1][:16]
    name = f"{VOLUME_PREFIX}{image_id}"
    client.volumes.create(name, labels=labels)
    # The first mount of an empty named volume copies the image's /usr into it; the same run
    # names the multiarch library folder (where the loader is).
    output = client.containers.run(
        image,
        [
            "sh",
            "-c",
            'for d in /usr/lib/*-linux-gnu; do [ -e "$d/libc.so.6" ] && echo "$d" && cd "$d" && ls ld-linux*.so.*; done',
        ],
        network_mode="none",
        remove=True,
        labels=labels,
        volumes={name: {"bind": "/usr", "mode": "rw"}},
    )
    found = output.decode().split()
    if len(found) < 2:
        raise RuntimeError(
            f"image {image!r} has no /usr/lib/*-linux-gnu/libc.so.6 with a dynamic loader "
            f"(ld-linux*.so.*) beside it (found {found}); cannot prepare trusted tools"
        )
    logger.info("os: trusted tools of %s in volume %s (%s, %s)", image, name, found[0], found[1])
    return TrustedTools(volume=name, library_dir=found[0], loader=found[1])
