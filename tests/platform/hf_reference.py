"""The reference the HF rollout server's tests compare against: one plain forward pass over the
whole sequence, with no KV cache, no padding and no batching."""

from __future__ import annotations

import torch


def plain_log_probs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each response token from one plain forward pass over prompt+response."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
    return logp.gather(1, torch.tensor(response)[:, None])[:, 0]
