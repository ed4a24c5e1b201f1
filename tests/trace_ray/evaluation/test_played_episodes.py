"""Greedy option episodes kept by route and reused by evaluate: the rows' round trip and what a context depends on."""

import dataclasses

from trace_ray.config_compose import compose_config
from trace_ray.evaluation.played_episodes import load_played, option_context, option_contexts, save_played
from trace_ray.rollout_loop import EpisodeResult
from trace_ray.trajectory import TokenRecord

RUN = {"split": None, "env": "device", "model": "tiny_random"}


def episode(option: str, seed: int, reward: float) -> EpisodeResult:
    adapter = None if option == "base" else (option, 1)
    return EpisodeResult(
        key=f"{option}-{seed}",
        task_id=f"task-{seed}",
        family="alarm",
        seed=seed,
        sample_index=0,
        adapter=adapter,
        reward=reward,
        success=reward == 1.0,
        turns=2,
        termination="agent_reply",
        messages=[{"role": "user", "content": "wake me at 7"}, {"role": "assistant", "content": "Done."}],
        tools=[{"type": "function", "function": {"name": "set_alarm", "parameters": {}}}],
        record=TokenRecord([5, 6, 7], [0, 1, 1], [0.0, -0.5, -0.25]),
        info={"milestones": ["alarm set"], "success": reward == 1.0},
        seconds=1.5,
    )


def test_saved_episodes_load_back_whole_under_their_context_only(tmp_path):
    path = tmp_path / "router" / "episodes.parquet"
    contexts = {"base": "c-base", "skill": "c-skill"}
    played = {
        3: {"base": episode("base", 3, 0.0), "skill": episode("skill", 3, 1.0)},
        4: {"base": episode("base", 4, 0.5)},
    }
    save_played(path, contexts, played, RUN)
    assert load_played(path, contexts, [3, 4]) == played  # every field, the token record and the info included
    assert load_played(path, contexts, [4]) == {4: {"base": played[4]["base"]}}
    # an option whose context changed (e.g. its adapter trained again) is not reused; the others are
    assert load_played(path, {"base": "c-base", "skill": "c-skill-v2"}, [3]) == {3: {"base": played[3]["base"]}}
    assert load_played(tmp_path / "missing.parquet", contexts, [3]) == {}


def test_saving_again_replaces_the_rows_of_the_same_context_and_seed_and_keeps_the_rest(tmp_path):
    path = tmp_path / "episodes.parquet"
    save_played(path, {"base": "c1"}, {3: {"base": episode("base", 3, 0.0)}, 4: {"base": episode("base", 4, 0.0)}}, RUN)
    save_played(path, {"base": "c1"}, {3: {"base": episode("base", 3, 1.0)}}, RUN)
    save_played(path, {"base": "c2"}, {3: {"base": episode("base", 3, 0.25)}}, RUN)
    assert {seed: r["base"].reward for seed, r in load_played(path, {"base": "c1"}, [3, 4]).items()} == {3: 1.0, 4: 0.0}
    assert load_played(path, {"base": "c2"}, [3, 4])[3]["base"].reward == 0.25


def test_a_context_follows_the_adapters_weights_the_environment_and_the_model(tmp_path):
    config = compose_config("evaluate", ["model=tiny_random"])
    folder = tmp_path / "skill"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"weights v1")
    first = option_context(config, config.env, "skill", folder)
    assert option_context(config, config.env, "skill", folder) == first
    assert option_contexts(config, config.env, {"skill": folder}) == {
        "base": option_context(config, config.env, "base", None),
        "skill": first,
    }
    (folder / "adapter_model.safetensors").write_bytes(b"weights v2")
    assert option_context(config, config.env, "skill", folder) != first
    other_env = dataclasses.replace(config.env, name="tau2_airline")
    assert option_context(config, other_env, "base", None) != option_context(config, config.env, "base", None)
    other_model = compose_config("evaluate", ["model=smollm2_135m"])
    assert option_context(other_model, other_model.env, "base", None) != option_context(
        config, config.env, "base", None
    )
    longer = compose_config("evaluate", ["model=tiny_random", "model.sampling.max_new_tokens=7"])
    assert option_context(longer, longer.env, "base", None) != option_context(config, config.env, "base", None)
