"""The assets stage: what a recipe asks ``agentrl-train`` to build before anything runs.

``agentrl.assets.build_tiny_model`` builds the tiny offline model (and its tokenizer, optionally
on the run's expert episodes) at ``actor_rollout_ref.model.path`` when it is missing or was built
from other settings; ``agentrl.assets.build_toy_data`` writes the toy dataset next to
``data.train_files``. Building is this stage only: the checks (:mod:`agentrl_ext.trainer.checks`)
never build anything, and verl's own ``main_ppo`` builds nothing (build the model with
``agentrl-tiny-model DIR`` first).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig

from agentrl_ext.run_spec import RunSpec

logger = logging.getLogger(__name__)


def prepare_assets(config: DictConfig, spec: RunSpec) -> None:
    """Build the tiny model / toy data where the recipe asks for them and they are missing."""
    agentrl = spec.agentrl
    model_path = Path(str(config.actor_rollout_ref.model.path))
    if agentrl.assets.build_tiny_model:
        _ensure_tiny_model(spec, model_path)
    if agentrl.assets.build_toy_data:
        from agentrl_ext.data.toy import build_toy_dataset

        train = Path(str(config.data.train_files))
        build_toy_dataset(train.parent)


def _ensure_tiny_model(spec: RunSpec, model_path: Path) -> None:
    """Build the tiny model at ``model_path`` unless a model is there: one built from the same
    settings (its build record says so) or one we did not build (no record, and outside
    ``agentrl.cache_dir``: the user's own)."""
    from dataclasses import fields

    from agentrl_ext.models.tiny import BUILD_RECORD, TinyModelSpec, build_record, build_tiny_model

    agentrl = spec.agentrl
    assets = agentrl.assets
    sizes = {f.name for f in fields(TinyModelSpec)}
    unknown = sorted(set(assets.tiny_model_spec) - sizes)
    if unknown:
        raise ValueError(
            f"agentrl.assets.tiny_model_spec has unknown keys {unknown}; known: {', '.join(sorted(sizes))}"
        )
    record_file = model_path / BUILD_RECORD
    in_cache = model_path.resolve().is_relative_to(Path(str(agentrl.cache_dir)).resolve())
    if (model_path / "config.json").exists() and not record_file.exists() and not in_cache:
        return  # a model we did not build (no record, outside our cache): never overwrite it
    corpus = _tokenizer_corpus(spec) if assets.tokenizer_expert_episodes else []
    wanted = build_record(
        TinyModelSpec(**assets.tiny_model_spec), assets.tiny_model_seed, corpus, assets.tiny_chat_template
    )
    if record_file.exists():
        if json.loads(record_file.read_text()) == wanted:
            return
        logger.info("the tiny model at %s was built from other settings; rebuilding it", model_path)
    logger.info("building the tiny offline model at %s", model_path)
    build_tiny_model(
        model_path,
        seed=assets.tiny_model_seed,
        extra_corpus=corpus,
        chat_template=assets.tiny_chat_template,
        **assets.tiny_model_spec,
    )


def _tokenizer_corpus(spec: RunSpec) -> list[str]:
    """The chat-rendered text of ``tokenizer_expert_episodes`` expert episodes of each of the
    run's tasks that has an expert, played through the controller."""
    from agentrl_ext.data.expert import experts
    from agentrl_ext.models.tiny import build_tokenizer
    from agentrl_ext.trainer.sft import expert_rows

    agentrl = spec.agentrl
    url = spec.controller_url or ""
    tasks = [t for t in agentrl.envs.tasks or [] if t in experts()]
    if not url or not tasks:
        raise ValueError(
            "agentrl.assets.tokenizer_expert_episodes needs expert episodes: a controller "
            f"(agentrl.agent_loop.controller_url={url!r}) and tasks with an expert in agentrl.envs.tasks "
            f"({list(agentrl.envs.tasks or [])}; experts: {', '.join(sorted(experts()))}); set it to 0 otherwise"
        )
    template = build_tokenizer(chat_template=agentrl.assets.tiny_chat_template)  # only its template renders
    lines: list[str] = []
    for task in tasks:
        for row in expert_rows(url, task, agentrl.assets.tokenizer_expert_episodes):
            lines.append(
                str(template.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False))
            )
    logger.info("tiny tokenizer: %d expert episodes of %s as extra corpus", len(lines), ", ".join(tasks))
    return lines
