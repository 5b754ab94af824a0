"""The main job's held-out evaluation (``job.evaluate_policy``) writes every episode with its
transcript beside its summary, as ``agentrl-eval-run --out`` does; ``report.md`` links the file;
``agentrl-replay`` re-drives its episodes against the held-out workers and finds them the same."""

from __future__ import annotations

import json

from hydra import compose, initialize_config_dir

from agentrl_ext.env.launcher import EnvStack, free_port
from agentrl_ext.eval.report import read_episodes
from agentrl_ext.rollout.replay import main as replay_main
from agentrl_ext.testing.tiny_model import tiny_model_path
from agentrl_ext.trainer.job import _report, evaluate_policy
from agentrl_ext.trainer.main import recipes_dir
from agentrl_ext.trainer.prepare import pin_spec


def test_job_evaluation_writes_replayable_transcripts_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    with initialize_config_dir(config_dir=recipes_dir(), version_base=None):
        config = compose(
            config_name="cpu_multitask",
            overrides=[
                "agentrl.eval.num_samples=3",
                "agentrl.eval.runs_per_sample=2",
                # the default tiny model's tokenizer did not learn the tasks: longer prompts
                "data.max_prompt_length=512",
                f"trainer.default_local_dir={run}",
            ],
        )
    spec = pin_spec(config)
    model = tiny_model_path()
    with EnvStack(
        tasks=["guess", "calc"], port=free_port(), split="test", log_dir=tmp_path / "logs"
    ) as stack:
        report = evaluate_policy(config, spec, stack.api, ["guess", "calc"], model, "before_rl")
        episodes = run / "eval" / "before_rl.episodes.jsonl"
        records = read_episodes(episodes)
        # every episode of the summary, with its conversation and its turn-by-turn record
        assert sorted(records) == sorted(e.key for e in report.episodes)
        assert len(records) == 2 * 3 * 2
        for record in records.values():
            assert record.messages[-1]["role"] == "assistant", record.messages
            assert record.record is not None and record.record["turns"]
        summary = json.loads((run / "eval" / "before_rl.json").read_text())
        assert summary["settings"]["model_path"] == str(model)
        assert replay_main([str(episodes), "--controller-url", stack.api]) == 0
    _report(run, [report], {"total": 1.0})
    text = (run / "report.md").read_text()
    assert "- before_rl: [eval/before_rl.episodes.jsonl](eval/before_rl.episodes.jsonl)" in text
    assert "agentrl-replay FILE --launch --split test" in text
