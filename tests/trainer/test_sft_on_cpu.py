"""The SFT warm start's data and command: expert episodes through the real controller -> worker
path, in the layout verl's MultiTurnSFTDataset reads, and verl's SFT trainer's command line."""

from __future__ import annotations

import json
import os
import random
import re

import pandas as pd
import pytest

from agentrl_ext.config import SFTConfig
from agentrl_ext.testing.env_servers import env_servers
from agentrl_ext.testing.tiny_model import tiny_model_path
from agentrl_ext.trainer.sft import CPU_SFT_OVERRIDES, run_sft, sft_command, write_expert_dataset

WORKERS = [
    ("guess", "guess", "agentrl_ext.envs.guess.task:GuessTask"),
    ("calc", "calc", "agentrl_ext.envs.calc.task:CalcTask"),
]
FIRST_TRAIN_INDEX = 10_000  # envs/procedural.py: the train split starts there


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft")
    with env_servers(WORKERS, tmp / "logs") as servers:
        paths = write_expert_dataset(servers.controller_url, ["guess", "calc"], 4, tmp / "data")
    return {p.stem: p for p in paths}


def _binary_search(secret: int, low: int = 1, high: int = 16) -> list[tuple[int, str]]:
    """(guess, answer) pairs of plain binary search, written out independently of the expert."""
    steps = []
    while True:
        guess = (low + high) // 2
        answer = "correct" if guess == secret else "higher" if guess < secret else "lower"
        steps.append((guess, answer))
        if answer == "correct":
            return steps
        low, high = (guess + 1, high) if answer == "higher" else (low, guess - 1)


def _as_list(value):
    return [_as_list(v) for v in value] if hasattr(value, "tolist") and not isinstance(value, str) else value


def test_one_file_per_task_with_only_its_own_tools_on_cpu(sft_files):
    assert sorted(sft_files) == ["calc", "guess"]
    guess = pd.read_parquet(sft_files["guess"])
    calc = pd.read_parquet(sft_files["calc"])
    assert len(guess) == len(calc) == 4
    guess_tools = {t["function"]["name"]: t for t in guess.iloc[0]["tools"]}
    assert list(guess_tools) == ["guess"]
    # no parameter of another task leaks in as null (one parquet file, one struct schema)
    assert list(guess_tools["guess"]["function"]["parameters"]["properties"]) == ["number"]
    assert sorted(t["function"]["name"] for t in calc.iloc[0]["tools"]) == ["answer", "calculator"]


def test_guess_episode_is_binary_search_on_cpu(sft_files):
    row = pd.read_parquet(sft_files["guess"]).iloc[0]
    messages = [{k: v for k, v in m.items() if v is not None} for m in row["messages"]]
    secret = random.Random(FIRST_TRAIN_INDEX).randint(1, 16)  # envs/guess/README: Random(index)
    assert messages[0] == {
        "role": "user",
        "content": "Guess my number from 1 to 16. I answer higher, lower or correct. You have 6 guesses.",
    }
    steps = _binary_search(secret)
    assert len(messages) == 1 + 2 * len(steps)
    for turn, (number, answer) in enumerate(steps):
        call = messages[1 + 2 * turn]["tool_calls"][0]
        assert call["function"]["name"] == "guess"
        assert call["function"]["arguments"] == f'{{"number": {number}}}'
        assert messages[2 + 2 * turn]["content"] == answer


def test_verl_sft_dataset_trains_exactly_the_assistant_turns_on_cpu(sft_files):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    config = OmegaConf.create({"max_length": 1024, "truncation": "error", "pad_mode": "no_padding"})
    dataset = MultiTurnSFTDataset(str(sft_files["guess"]), tokenizer, config)  # checks the rendering itself
    item = dataset[0]
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
    trained = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    row = pd.read_parquet(sft_files["guess"]).iloc[0]
    secret = random.Random(FIRST_TRAIN_INDEX).randint(1, 16)
    expected = "".join(
        f'<tool_call>\n{{"name": "guess", "arguments": {{"number": {n}}}}}\n</tool_call><|im_end|>\n'
        for n, _ in _binary_search(secret)
    )
    assert len(row["messages"]) == 1 + 2 * len(_binary_search(secret))
    assert trained == expected


def test_calc_warm_start_renders_the_schemas_the_worker_advertises_on_cpu(sft_files):
    """calc's tools take different arguments, and parquet reads its ``tools`` column back as one
    merged struct (``calculator`` gains ``value: null``). The warm start must render the prompt
    RL and evaluation render: the task's own schemas."""
    from agentrl_ext.envs.calc.task import TOOLS  # what the calc worker advertises
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    from agentrl_ext.trainer.sft_dataset import ExpertSFTDataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    config = OmegaConf.create({"max_length": 1024, "truncation": "error", "pad_mode": "no_padding"})
    row = pd.read_parquet(sft_files["calc"]).iloc[0]
    opening = {"role": "user", "content": row["messages"][0]["content"]}
    expected = tokenizer.apply_chat_template(
        [opening], tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert '"value": null' not in expected

    def prompt_of(dataset) -> str:
        text = tokenizer.decode(dataset[0]["input_ids"].tolist())
        return text[: len(expected)]

    ours = ExpertSFTDataset(str(sft_files["calc"]), tokenizer, config)
    assert ours.tools[0] == TOOLS
    assert prompt_of(ours) == expected
    # what the class is for: verl's own dataset renders parquet's merged schema
    plain = MultiTurnSFTDataset(str(sft_files["calc"]), tokenizer, config)
    assert '"value": null' in prompt_of(plain)


def test_sft_command_on_cpu(tmp_path):
    sft = SFTConfig(steps=7, batch_size=4, micro_batch_size=2, lr=1e-3, overrides=["optim.weight_decay=0.0"])
    argv = sft_command(
        tmp_path / "model", [tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "out", sft, cpu=True
    )
    assert argv[argv.index("-m", 2) + 1] == "verl.trainer.sft_trainer"
    assert f"data.train_files=[{tmp_path / 'a.parquet'},{tmp_path / 'b.parquet'}]" in argv
    for expected in (
        "trainer.total_training_steps=7",
        "data.train_batch_size=4",
        "data.micro_batch_size_per_gpu=2",
    ):
        assert expected in argv
    assert set(CPU_SFT_OVERRIDES) <= set(argv)
    # verl loads our dataset class (the exact tool schemas) by module and name
    assert "data.custom_cls.path=pkg://agentrl_ext.trainer.sft_dataset" in argv
    assert "data.custom_cls.name=ExpertSFTDataset" in argv
    assert argv[-1] == "optim.weight_decay=0.0"  # the user's overrides win
    gpu = sft_command(tmp_path / "model", [tmp_path / "a.parquet"], tmp_path / "out", sft, cpu=False)
    assert not set(CPU_SFT_OVERRIDES) & set(gpu)


def test_sft_failure_names_the_log_on_cpu(tmp_path, sft_files):
    sft = SFTConfig(steps=1, batch_size=2, micro_batch_size=2, overrides=["data.no_such_key=1"])
    with pytest.raises(RuntimeError, match=r"exited with code .* the errors in .*sft\.log") as info:
        run_sft(tiny_model_path(), [sft_files["guess"]], tmp_path / "out", sft)
    assert "no_such_key" in str(info.value)


def test_expert_noise_must_be_a_probability_on_cpu():
    assert SFTConfig(expert_noise={"guess": 0.5}).expert_noise == {"guess": 0.5}
    # 1.0: the careless move only (e.g. the feasible demonstrator)
    assert SFTConfig(expert_noise={"guess": 1.0}).expert_noise == {"guess": 1.0}
    with pytest.raises(ValueError, match=r"agentrl.sft.expert_noise .*'guess': 1.1"):
        SFTConfig(expert_noise={"guess": 1.1})
    with pytest.raises(ValueError, match="expert_noise"):
        SFTConfig(expert_noise={"gridroom": -0.1})


def test_expert_noise_on_a_task_without_random_moves_is_refused_before_playing_on_cpu(tmp_path):
    from omegaconf import OmegaConf

    from agentrl_ext.config import AgentRLConfig
    from agentrl_ext.trainer.job import _warm_start

    agentrl = AgentRLConfig.from_config({"sft": {"enable": True, "expert_noise": {"calc": 0.3}}})
    config = OmegaConf.create({"actor_rollout_ref": {"model": {"path": str(tmp_path)}}})
    # no controller listens at this URL: the error must come before any episode is played
    with pytest.raises(
        ValueError, match=r"expert_noise names calc \(its expert module has no random_action\)"
    ):
        _warm_start(config, agentrl, "http://127.0.0.1:9/api", ["guess", "calc"], tmp_path)
    for sft, message in [
        # a careless move the task's expert module does not define
        (
            {"expert_noise": {"guess": 0.3}, "careless_move": {"guess": "lazy"}},
            r"expert_noise names guess \(its expert module has no lazy_action\)",
        ),
        # a careless move for a task without an epsilon would silently do nothing
        (
            {"expert_noise": {"guess": 0.3}, "careless_move": {"gridroom": "random"}},
            r"careless_move names \['gridroom'\] but agentrl.sft.expert_noise gives them no epsilon",
        ),
    ]:
        agentrl = AgentRLConfig.from_config({"sft": {"enable": True, **sft}})
        with pytest.raises(ValueError, match=message):
            _warm_start(config, agentrl, "http://127.0.0.1:9/api", ["guess", "gridroom"], tmp_path)


def test_keep_lost_keeps_the_demonstrations_lost_within_the_rules_on_cpu(tmp_path):
    from agentrl_ext.trainer.sft import expert_rows

    with env_servers(WORKERS, tmp_path / "logs") as servers:
        url = servers.controller_url
        won = expert_rows(url, "calc", 40, epsilon=1.0, move="feasible")
        every = expert_rows(url, "calc", 40, epsilon=1.0, move="feasible", keep_lost=True)
        # the same through write_expert_dataset, which the job calls: the option must reach the rows
        careless = {"noise": {"calc": 1.0}, "moves": {"calc": "feasible"}}
        [kept_file] = write_expert_dataset(url, ["calc"], 40, tmp_path / "kept", keep_lost=True, **careless)
        [won_file] = write_expert_dataset(url, ["calc"], 40, tmp_path / "won", **careless)
    assert len(pd.read_parquet(kept_file)) == 40
    assert len(pd.read_parquet(won_file)) == len(won)
    # the feasible calc demonstrator picks the wrong grouping half the time: some of 40 lose
    assert len(every) == 40 and 0 < len(won) < 40
    answers = [
        json.loads(
            [m for m in r["messages"] if m["role"] == "assistant"][-1]["tool_calls"][0]["function"][
                "arguments"
            ]
        )["value"]
        for r in every
    ]
    lost = 0
    for row, answer in zip(every, answers, strict=True):
        a, op1, b, op2, c = re.search(
            r"\((-?\d+) ([-+*]) (-?\d+)\) ([-+*]) (-?\d+)", row["messages"][0]["content"]
        ).groups()
        lost += answer != eval(f"({a} {op1} {b}) {op2} {c}")  # the problem's value, by Python
    assert lost == 40 - len(won)


@pytest.mark.parametrize("keep_lost", [True, False])
def test_the_job_passes_its_sft_options_to_the_expert_dataset_on_cpu(tmp_path, monkeypatch, keep_lost):
    """``agentrl.sft.*`` -> ``write_expert_dataset``'s arguments, each to its own (keep_lost both ways)."""
    from omegaconf import OmegaConf

    from agentrl_ext.config import AgentRLConfig
    from agentrl_ext.trainer import job, sft

    calls = []

    def write(url, tasks, episodes_per_task, out_dir, **options):
        calls.append({"url": url, "tasks": tasks, "episodes": episodes_per_task, "out": out_dir, **options})
        return [tmp_path / "calc.parquet"]

    monkeypatch.setattr(sft, "write_expert_dataset", write)
    monkeypatch.setattr(sft, "run_sft", lambda *args, **kwargs: tmp_path / "weights")
    agentrl = AgentRLConfig.from_config(
        {
            "sft": {
                "enable": True,
                "tasks": ["calc"],
                "episodes_per_task": 23,
                "seed": 7,
                "keep_lost": keep_lost,
                "expert_noise": {"calc": 0.4},
                "careless_move": {"calc": "feasible"},
            }
        }
    )
    config = OmegaConf.create({"actor_rollout_ref": {"model": {"path": str(tmp_path)}}})
    job._warm_start(config, agentrl, "http://127.0.0.1:9/api", ["calc", "guess"], tmp_path)
    [call] = calls
    assert call["keep_lost"] is keep_lost
    assert (call["url"], call["tasks"], call["episodes"], call["seed"]) == (
        "http://127.0.0.1:9/api",
        ["calc"],
        23,
        7,
    )
    assert (call["noise"], call["moves"]) == ({"calc": 0.4}, {"calc": "feasible"})
    assert config.actor_rollout_ref.model.path == str(tmp_path / "weights")


def test_sft_child_gets_every_core_on_the_cpu_platform_on_cpu(monkeypatch):
    from agentrl_ext.trainer.sft import sft_environment

    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    env = sft_environment({"PATH": "/bin"}, cpu=True)
    assert env["OMP_NUM_THREADS"] == "6"  # torchrun would set 1
    assert env["TOKENIZERS_PARALLELISM"] == "false" and env["PATH"] == "/bin"
    assert sft_environment({"OMP_NUM_THREADS": "3"}, cpu=True)["OMP_NUM_THREADS"] == "3"  # the user's value
    assert "OMP_NUM_THREADS" not in sft_environment({}, cpu=False)  # GPUs: torchrun's own rule


class _Rows:
    """A dataset as TaskBatchSampler sees it: each row's task and the global batch size."""

    def __init__(self, groups, batch, size=None):
        self.batch_groups, self.global_batch_size = groups, batch
        self.size = len(groups) if size is None else size

    def __len__(self):
        return self.size


def test_task_batches_hold_one_task_each_and_keep_every_tasks_share_on_cpu():
    from agentrl_ext.trainer.sft_dataset import TaskBatchSampler

    groups = ["guess"] * 40 + ["calc"] * 30 + ["gridroom"] * 21  # gridroom: 5 batches and 1 row left
    sampler = TaskBatchSampler(_Rows(groups, 4), shuffle=True, num_replicas=1, rank=0, drop_last=True, seed=3)
    order = list(sampler)
    batches = [order[i : i + 4] for i in range(0, len(order), 4)]
    assert len(order) == len(sampler) == 4 * (10 + 7 + 5)
    assert all(len({groups[i] for i in batch}) == 1 for batch in batches)
    assert sorted(groups[b[0]] for b in batches).count("guess") == 10
    assert len(set(order)) == len(order)  # no row twice in an epoch
    # the tasks are interleaved, not one after another
    assert {groups[b[0]] for b in batches[:6]} != {groups[batches[0][0]]}
    sampler.set_epoch(1)
    assert list(sampler) != order and len(list(sampler)) == len(order)
    # two replicas take alternate batches of half the global batch: disjoint, each one task
    ranks = [
        list(TaskBatchSampler(_Rows(groups, 8), shuffle=True, num_replicas=2, rank=r, drop_last=True, seed=3))
        for r in (0, 1)
    ]
    assert len(ranks[0]) == len(ranks[1]) and not set(ranks[0]) & set(ranks[1])
    for rank in ranks:
        assert all(len({groups[i] for i in rank[k : k + 4]}) == 1 for k in range(0, len(rank), 4))


def test_task_batches_fall_back_to_torchs_sampler_where_there_is_nothing_to_group_on_cpu():
    from torch.utils.data import DistributedSampler

    from agentrl_ext.trainer.sft_dataset import TaskBatchSampler

    for dataset, shuffle in ((_Rows(["a", "b"] * 5, 2), False), (_Rows(None, 2, size=10), True)):
        ours = TaskBatchSampler(dataset, shuffle=shuffle, num_replicas=1, rank=0, drop_last=True)
        torchs = DistributedSampler(dataset, shuffle=shuffle, num_replicas=1, rank=0, drop_last=True)
        assert list(ours) == list(torchs) and len(ours) == len(torchs)


def test_batch_by_task_runs_verls_trainer_through_our_entry_on_cpu(tmp_path):
    files = [tmp_path / "a.parquet"]
    plain = sft_command(tmp_path / "model", files, tmp_path / "out", SFTConfig(), cpu=True)
    by_task = sft_command(
        tmp_path / "model", files, tmp_path / "out", SFTConfig(batch_by_task=True), cpu=True
    )
    assert plain[plain.index("-m", 2) + 1] == "verl.trainer.sft_trainer"
    assert by_task[by_task.index("-m", 2) + 1] == "agentrl_ext.trainer.sft_main"
    assert plain[plain.index("-m", 2) + 2 :] == by_task[by_task.index("-m", 2) + 2 :]


def test_verls_sft_trainer_trains_one_task_per_batch_with_batch_by_task_on_cpu(tmp_path, sft_files):
    """The real trainer, 4 steps of 4 episodes over guess's 4 and calc's 4: with one task per batch
    every step's tokens (verl's own ``train/global_tokens``) are all of guess's rows or all of
    calc's; a shuffled batch of both would almost never sum to either (2 of the 70 ways)."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from agentrl_ext.trainer.sft_dataset import ExpertSFTDataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    config = OmegaConf.create({"max_length": 1024, "truncation": "error", "pad_mode": "no_padding"})
    whole = {
        task: sum(len(row["input_ids"]) for row in ExpertSFTDataset(str(sft_files[task]), tokenizer, config))
        for task in ("guess", "calc")
    }
    assert whole["guess"] != whole["calc"]
    sft = SFTConfig(steps=4, batch_size=4, micro_batch_size=4, lr=1e-3, batch_by_task=True)
    run_sft(tiny_model_path(), [sft_files["guess"], sft_files["calc"]], tmp_path / "out", sft)
    log = (tmp_path / "out" / "sft.log").read_text()
    tokens = [int(float(t)) for t in re.findall(r"train/global_tokens:([0-9.]+)", log)]
    assert len(tokens) == 4
    assert set(tokens) <= set(whole.values()) and tokens.count(whole["guess"]) == 2, (tokens, whole)
