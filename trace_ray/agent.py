"""The agent: the agent prompt plus an engine and sampling settings.

It generates one reply per prompt (token ids) in one batch and parses each
reply into an OpenAI assistant message.
"""

from __future__ import annotations

from dataclasses import dataclass

from environments.protocol import Message
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.config import ModelConfig
from trace_ray.engines import Engine, Generation, SamplingParams
from trace_ray.engines.hf import HFEngine
from trace_ray.models import load_model


@dataclass
class AgentTurn:
    message: Message
    prompt_ids: list[int]
    generation: Generation


class Agent:
    def __init__(self, engine: Engine, prompt: AgentPrompt, max_context_tokens: int):
        self.engine = engine
        self.prompt = prompt
        self.max_context_tokens = max_context_tokens

    def fits(self, prompt_ids: list[int], params: SamplingParams) -> bool:
        return len(prompt_ids) + params.max_new_tokens <= self.max_context_tokens

    def act(self, prompts: list[list[int]], turns: list[int], params: SamplingParams) -> list[AgentTurn]:
        """One reply per rendered prompt, generated in one batch; ``turns`` numbers the tool-call ids."""
        generations = self.engine.generate(prompts, params)
        return [
            AgentTurn(self.prompt.parse(generation.token_ids, turn=turn), prompt, generation)
            for prompt, turn, generation in zip(prompts, turns, generations)
        ]


def stop_token_ids(network, tokenizer) -> list[int]:
    """End-of-turn tokens: the tokenizer's eos plus the generation config's."""
    configured = network.generation_config.eos_token_id
    configured = configured if isinstance(configured, list) else [configured]
    return sorted({tokenizer.eos_token_id, *[token for token in configured if token is not None]})


def build_agent(model: ModelConfig) -> Agent:
    """The in-process agent on the transformers engine."""
    network, tokenizer = load_model(model)
    engine = HFEngine(network, tokenizer, stop_token_ids(network, tokenizer))
    prompt = AgentPrompt(tokenizer, tool_format=model.prompt.tool_format, show_example=model.prompt.show_example)
    return Agent(engine, prompt, model.max_context_tokens)
