"""``synthesis=llm`` for one capability: ask the generation model for a module until the sandboxed self-checks admit
one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from environments.synthetic.sandbox import SandboxedEnvironment, SandboxLimits
from trace_ray.capabilities.llm_labeler import compact_trajectory
from trace_ray.capabilities.trajectories import read_trajectories
from trace_ray.config import TraceConfig
from trace_ray.llm_client import LLMClient
from trace_ray.synthesis.llm_synthesis import (
    GenerationRequest,
    default_protocol_text,
    sandbox_admission,
    synthesize_module,
)


def failed_examples(config: TraceConfig, entry: dict) -> list[str]:
    """The capability's example failed trajectories (from identification), compacted."""
    wanted = list(entry.get("example_failed_cases") or [])[: config.synthesis.examples]
    if not wanted:
        return []
    by_id = {trajectory.id: trajectory for trajectory in read_trajectories(config.run_dir)}
    return [compact_trajectory(by_id[i], config.synthesis.max_chars) for i in wanted if i in by_id]


def generate_module(config: TraceConfig, entry: dict, target: Any, folder: Path) -> dict[str, Any]:
    """Write and admit ``folder/module.py``; the spec fields of a generated environment."""
    synthesis = config.synthesis
    client = LLMClient(
        synthesis.base_url,
        synthesis.model,
        os.environ.get(synthesis.api_key_env or ""),
        config_key="synthesis",
        timeout_s=synthesis.timeout_s,
        max_retries=synthesis.max_retries,
        response_format="text",
        max_tokens=synthesis.max_tokens,
    )
    request = GenerationRequest(
        entry["name"],
        entry.get("description", ""),
        failed_examples(config, entry),
        target.tools,
        target.policy,
        target.name,
    )
    limits = SandboxLimits(
        call_timeout_s=synthesis.call_timeout_s, memory_mb=synthesis.memory_mb, mode=synthesis.sandbox
    )
    options = {
        "max_turns": config.env.max_turns,
        "max_tool_calls_per_turn": config.env.max_tool_calls_per_turn,
        "success_threshold": config.env.success_threshold,
    }
    admit = sandbox_admission(target.tools, list(range(synthesis.self_check_seeds)), limits, env_options=options)
    module = synthesize_module(
        client,
        request,
        folder,
        admit,
        synthesis.max_attempts,
        config.seed,
        synthesis.temperature,
        default_protocol_text(),
    )
    probe = SandboxedEnvironment(module, None, limits=limits, **options)
    try:
        levels, isolation = list(probe.difficulties()), probe.isolation
    finally:
        probe.close()
    return {
        "module": module.name,
        "difficulties": levels,
        "isolation": isolation,
        "sandbox": {"call_timeout_s": limits.call_timeout_s, "memory_mb": limits.memory_mb, "mode": limits.mode},
    }
