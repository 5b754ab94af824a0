"""``python -m agentrl_ext.trainer.sft_main [verl SFT overrides]``: verl's SFT trainer
(``verl.trainer.sft_trainer``, its own ``main`` and Hydra config) whose train batches each hold
one task's episodes (``agentrl.sft.batch_by_task``; ``sft_dataset.TaskBatchSampler``).

``agentrl_ext.trainer.sft.sft_command`` runs it under ``torch.distributed.run`` in place of
``-m verl.trainer.sft_trainer`` when the option is on; everything else is verl's.
"""

from __future__ import annotations


def main() -> None:
    from agentrl_ext.trainer.sft_dataset import TaskBatchSampler
    from agentrl_ext.verl_compat import use_sft_train_sampler

    use_sft_train_sampler(TaskBatchSampler)
    from verl.trainer import sft_trainer

    sft_trainer.main()


if __name__ == "__main__":
    main()
