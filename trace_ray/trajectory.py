"""The token-level record of one episode (token-in/token-out).

The record holds exactly the token ids the model saw and sampled: the first
prompt, then for every turn the sampled tokens (action mask 1, with their
behavior log-probs) followed by the tokens the chat template appends for the
environment's reply (mask 0). The next prompt is the record itself, so what
the model is trained on is what it sampled: nothing is re-tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenRecord:
    token_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # 0.0 where action_mask is 0

    def add_observation(self, token_ids: list[int]) -> None:
        self.token_ids.extend(token_ids)
        self.action_mask.extend([0] * len(token_ids))
        self.logprobs.extend([0.0] * len(token_ids))

    def add_action(self, token_ids: list[int], logprobs: list[float]) -> None:
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} sampled tokens but {len(logprobs)} log-probs")
        self.token_ids.extend(token_ids)
        self.action_mask.extend([1] * len(token_ids))
        self.logprobs.extend(logprobs)

    @property
    def action_tokens(self) -> int:
        return sum(self.action_mask)
