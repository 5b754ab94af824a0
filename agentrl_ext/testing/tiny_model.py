"""A cached tiny model directory for tests (see :func:`agentrl_ext.models.tiny.build_tiny_model`).

``tiny_model_path()`` builds the tiny model once per cache directory, seed and builder version, and
returns the same directory afterwards. The cache root is ``$AGENTRL_CACHE_DIR`` when set, else the
repository's git-ignored ``.cache/`` in a source checkout, else ``~/.cache/agentrl_ext``; the model
lives under ``<root>/tiny_model/<cache_key(seed)>``. The key holds the seed, ``BUILDER_VERSION`` and
a fingerprint of the builder's source files and of the transformers and tokenizers versions, so
editing the chat template or corpus never serves a stale build.

Parallel processes (pytest-xdist workers, Ray actors) may call it at once: each builds into its own
temporary directory and publishes it with one atomic ``rename``; a process that loses the race
discards its copy and uses the winner's. A directory under the final name is therefore complete.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import tokenizers
import transformers

from agentrl_ext.models import chat_template, tiny, tiny_corpus
from agentrl_ext.models.tiny import BUILDER_VERSION, build_tiny_model

__all__ = ["CACHE_DIR_ENV", "VLLM_CPU_SIZES", "cache_key", "default_cache_root", "tiny_model_path"]

logger = logging.getLogger(__name__)

#: Environment variable naming the root of agentrl_ext's on-disk caches.
CACHE_DIR_ENV = "AGENTRL_CACHE_DIR"


def default_cache_root() -> Path:
    """Return the root of agentrl_ext's caches: ``$AGENTRL_CACHE_DIR``, ``<repo>/.cache`` or ``~/.cache/agentrl_ext``."""
    from_env = os.environ.get(CACHE_DIR_ENV)
    if from_env:
        return Path(from_env).expanduser()
    repo = Path(__file__).resolve().parents[2]
    if (repo / "setup.cfg").is_file() and (repo / "agentrl_ext").is_dir():
        return repo / ".cache"
    return Path.home() / ".cache" / "agentrl_ext"


@functools.cache
def _builder_fingerprint() -> str:
    """Short hash of everything that shapes the saved files besides the seed."""
    digest = hashlib.sha256(f"{transformers.__version__} {tokenizers.__version__}".encode())
    for module in (tiny, chat_template, tiny_corpus):
        digest.update(Path(module.__file__ or "").read_bytes())
    return digest.hexdigest()[:10]


def cache_key(seed: int = 0, **sizes: int) -> str:
    """Name of the cached build for ``seed``: ``seed<N>-v<BUILDER_VERSION>-<fingerprint>``, with
    ``-<name><value>`` for each size given (``TinyModelSpec`` fields) in name order."""
    suffix = "".join(f"-{name}{value}" for name, value in sorted(sizes.items()))
    return f"seed{seed}-v{BUILDER_VERSION}-{_builder_fingerprint()}{suffix}"


#: sizes vLLM's CPU attention runs (head size 32, one of the sizes it supports) with an unpadded
#: embedding, so that vLLM's and the FSDP actor's log-probs are comparable token for token
VLLM_CPU_SIZES: dict[str, int] = {"num_heads": 2, "num_kv_heads": 1, "vocab_multiple": 1}


def tiny_model_path(cache_dir: str | Path | None = None, *, seed: int = 0, **sizes: int) -> Path:
    """Return a directory holding the tiny model for ``seed`` (default sizes, or ``sizes`` given as
    ``TinyModelSpec`` fields, e.g. :data:`VLLM_CPU_SIZES`), building it on first use.

    ``cache_dir`` is the directory that holds tiny model builds; it defaults to
    ``default_cache_root() / "tiny_model"``. The result loads with ``AutoTokenizer`` and
    ``AutoModelForCausalLM`` offline. Treat it as read-only: it is shared by every caller.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_root() / "tiny_model"
    final = root / cache_key(seed, **sizes)
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        build_tiny_model(staging, seed=seed, **sizes)  # type: ignore[arg-type]
        _publish(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final


def _publish(staging: Path, final: Path) -> None:
    """Atomically move ``staging`` to ``final``, unless another process already published it."""
    try:
        os.rename(staging, final)
    except OSError:
        # rename(2) onto an existing non-empty directory fails (ENOTEMPTY/EEXIST): someone won.
        if not final.is_dir():
            raise
        logger.debug("tiny model %s was published by another process; discarding %s", final, staging)
    else:
        logger.info("cached tiny model at %s", final)
