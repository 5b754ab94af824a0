"""Build the local Debian base image for per-session containers, without any registry.

No image can be pulled on our machines, so the base image is made from scratch:
``debootstrap --variant=minbase`` writes a Debian root filesystem from the Debian package
mirror, the tree is trimmed (apt lists, docs, man pages, locales), packed into a tar file and
imported into Docker with ``docker import``. Two caches make later runs cheap:

- the image itself, in the engine's data root: when ``tag`` exists nothing is done;
- the rootfs tar under ``cache_dir``: a fresh engine re-imports it in seconds instead of
  running debootstrap again (~2 minutes).

Command line: ``agentrl-build-base-image`` (or ``python -m agentrl_ext.env.providers.base_image``).
Needs root and the ``debootstrap`` package (``apt-get install -y debootstrap``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from agentrl_ext import cli

logger = logging.getLogger(__name__)

DEFAULT_TAG = "agentrl-base:bookworm"
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_INCLUDE = ("python3", "procps")
BASE_IMAGE_LABEL = "agentrl.base-image"

# Removed from the rootfs before packing: nothing a task needs at run time.
_TRIM_PATHS = (
    "var/lib/apt/lists",
    "var/cache/apt",
    "var/cache/debconf/templates.dat-old",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "var/log",
)


def default_cache_dir() -> Path:
    """``$AGENTRL_CACHE_DIR/base-image``, else ``$XDG_CACHE_HOME/agentrl_ext/base-image``."""
    if os.environ.get("AGENTRL_CACHE_DIR"):
        return Path(os.environ["AGENTRL_CACHE_DIR"]) / "base-image"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "agentrl_ext" / "base-image"


@dataclass(frozen=True)
class BaseImageSpec:
    """What to build: the image tag and the Debian rootfs it is made of."""

    tag: str = DEFAULT_TAG
    suite: str = DEFAULT_SUITE
    mirror: str = DEFAULT_MIRROR
    include: tuple[str, ...] = DEFAULT_INCLUDE
    cache_dir: Path = field(default_factory=default_cache_dir)

    def __post_init__(self) -> None:
        if ":" not in self.tag or self.tag.endswith(":"):
            raise ValueError(
                f"base image tag {self.tag!r} must look like 'name:version', e.g. {DEFAULT_TAG!r}"
            )
        for package in self.include:
            if not package or any(c in package for c in " ,;"):
                raise ValueError(
                    f"package name {package!r} in include={self.include!r} is not a single Debian package name"
                )

    @property
    def rootfs_tar(self) -> Path:
        """Cached rootfs tar, named after everything that changes its content."""
        key = hashlib.sha256(
            f"{self.suite}|{self.mirror}|{','.join(sorted(self.include))}".encode()
        ).hexdigest()
        return self.cache_dir / f"rootfs-{self.suite}-minbase-{key[:12]}.tar"


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    """True when the engine already holds an image named ``tag``."""
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_rootfs_tar(spec: BaseImageSpec) -> Path:
    """Run debootstrap into a temporary directory, trim it and pack it as ``spec.rootfs_tar``."""
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed; install it with: apt-get install -y debootstrap")
    if os.geteuid() != 0:
        raise RuntimeError("debootstrap needs root to build the base image rootfs; run this command as root")
    spec.cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrl-rootfs-", dir=spec.cache_dir) as tmp:
        rootfs = Path(tmp) / "rootfs"
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(spec.include)}" if spec.include else "--include=",
            spec.suite,
            str(rootfs),
            spec.mirror,
        ]
        logger.info("building rootfs: %s (about 2 minutes)", " ".join(command))
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"debootstrap failed with exit code {result.returncode} for suite {spec.suite!r} from mirror "
                f"{spec.mirror!r}; last output:\n{(result.stdout + result.stderr)[-2000:]}"
            )
        for relative in _TRIM_PATHS:
            target = rootfs / relative
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir(parents=True, exist_ok=True)
        partial = spec.rootfs_tar.with_suffix(".tar.partial")
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], check=True)
        partial.replace(spec.rootfs_tar)
    logger.info("rootfs cached at %s (%.0f MB)", spec.rootfs_tar, spec.rootfs_tar.stat().st_size / 1e6)
    return spec.rootfs_tar


def import_rootfs(client: docker.DockerClient, spec: BaseImageSpec) -> None:
    """``docker import`` the cached rootfs tar as ``spec.tag``."""
    repository, version = spec.tag.rsplit(":", 1)
    changes = [
        'CMD ["/bin/bash"]',
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        f"LABEL {BASE_IMAGE_LABEL}={spec.suite}-minbase",
    ]
    logger.info("importing %s as %s", spec.rootfs_tar, spec.tag)
    client.api.import_image_from_file(
        str(spec.rootfs_tar), repository=repository, tag=version, changes=changes
    )
    if not image_exists(client, spec.tag):
        raise RuntimeError(f"docker import of {spec.rootfs_tar} did not produce image {spec.tag!r}")


def ensure_base_image(
    spec: BaseImageSpec | None = None, client: docker.DockerClient | None = None, force: bool = False
) -> str:
    """Make sure the engine holds the base image; build or re-import it only when missing.

    Returns the image tag. ``client`` defaults to ``docker.from_env()`` (honours ``DOCKER_HOST``).
    """
    spec = spec or BaseImageSpec()
    client = client or docker.from_env()
    if not force and image_exists(client, spec.tag):
        logger.info("base image %s already present", spec.tag)
        return spec.tag
    if force or not spec.rootfs_tar.exists():
        build_rootfs_tar(spec)
    import_rootfs(client, spec)
    return spec.tag


def main(argv: list[str] | None = None) -> int:
    """Console entry point: ``agentrl-build-base-image [--tag T] [--include a,b] [--force]``."""
    parser = cli.parser(
        "agentrl-build-base-image",
        "Build the local Debian base image (debootstrap + docker import), cached between runs.",
    )
    parser.add_argument("--tag", default=DEFAULT_TAG, help="image tag")
    parser.add_argument("--suite", default=DEFAULT_SUITE, help="Debian suite")
    parser.add_argument("--mirror", default=DEFAULT_MIRROR, help="Debian mirror")
    parser.add_argument(
        "--include",
        default=",".join(DEFAULT_INCLUDE),
        help="comma-separated extra packages",
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help=f"rootfs cache (none: {default_cache_dir()})"
    )
    parser.add_argument("--docker-host", default=None, help="engine address (none: $DOCKER_HOST)")
    parser.add_argument(
        "--force", action="store_true", help="rebuild the rootfs and re-import even if cached"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = BaseImageSpec(
        tag=args.tag,
        suite=args.suite,
        mirror=args.mirror,
        include=tuple(p for p in args.include.split(",") if p),
        cache_dir=args.cache_dir or default_cache_dir(),
    )
    client = docker.DockerClient(base_url=args.docker_host) if args.docker_host else docker.from_env()
    try:
        tag = ensure_base_image(spec, client, force=args.force)
    except (RuntimeError, docker.errors.DockerException) as exc:
        logger.error("%s", exc)
        return 1
    logger.info("base image ready: %s", tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
