"""The batched rollout loop, driven by a scripted engine so every step is deterministic."""

import json
from concurrent.futures import Future
from dataclasses import replace

import pytest
import torch

from environments.device.environment import DeviceEnvironment
from environments.self_checks import play_recorded
from tests.trace_ray.test_agent_prompt import THINKING_TEMPLATE, with_template
from trace_ray.agent_prompt import AgentPrompt, assistant_text, render_tool_call
from trace_ray.engines import Generation, SamplingParams
from trace_ray.engines.hf import HFEngine
from trace_ray.metrics import summarize
from trace_ray.rollout_loop import EpisodeTask, LocalBackend, run_rollouts

GREEDY = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=64)


def run_episodes(seeds, engine, tokenizer, params=GREEDY, batch_size=1, max_context_tokens=8192, on_done=None):
    tasks = [EpisodeTask(f"device-{seed}", seed) for seed in seeds]
    backend = LocalBackend(DeviceEnvironment, engine)
    return run_rollouts(tasks, backend, AgentPrompt(tokenizer), params, batch_size, max_context_tokens, on_done)


class ScriptedEngine:
    """Replies at once with a fixed text per request, chosen by what the prompt contains."""

    def __init__(self, tokenizer, reply_for):
        self.tokenizer = tokenizer
        self.reply_for = reply_for
        self.requests = []  # the sampling settings of each request
        self.adapters = []  # the adapter of each request

    def submit(self, prompt, params, adapter=None):
        self.requests.append(params)
        self.adapters.append(adapter)
        ids = self.tokenizer.encode(self.reply_for(self.tokenizer.decode(prompt))) + [self.tokenizer.eos_token_id]
        future = Future()
        future.set_result(Generation(ids[: params.max_new_tokens], [-0.5] * len(ids[: params.max_new_tokens]), "stop"))
        return future


def oracle_text(seed):
    """What the oracle would say next, given how many assistant turns the prompt already holds."""

    def reply(prompt_text):
        env = DeviceEnvironment()
        env.reset(seed)
        turns = prompt_text.split("<|im_start|>user\n", 2)[-1].count("<|im_start|>assistant\n") - 1
        for _ in range(turns):
            env.step(env.oracle_message())
        message = env.oracle_message()
        parts = [message["content"]] if message.get("content") else []
        parts += [
            render_tool_call(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls") or []
        ]
        return "\n".join(parts)

    return reply


def test_oracle_replies_through_the_whole_stack_score_one(tiny_model):
    _, tokenizer = tiny_model
    seeds = [1, 2, 6]  # blocked settings, message to contact, ambiguous contact (asks the user)
    results = []
    for seed in seeds:
        results += run_episodes([seed], ScriptedEngine(tokenizer, oracle_text(seed)), tokenizer)
    assert [result.reward for result in results] == [1.0, 1.0, 1.0]
    assert all(result.success and result.termination == "agent_reply" for result in results)
    assert results[0].turns >= 3  # hit the permission error, fix the blocker, retry, reply


class LiveCountingBackend(LocalBackend):
    """Records how many episodes are live right after each reset."""

    def __init__(self, engine):
        super().__init__(DeviceEnvironment, engine)
        self.live_after_reset = []
        self.reset_sizes = []

    def reset(self, tasks):
        results = super().reset(tasks)
        self.reset_sizes.append(len(tasks))
        self.live_after_reset.append(len(self.envs))
        return results


def wifi_reply(prompt_text):
    """Tasks whose request mentions "wifi" get one tool call first; others are answered at once."""
    asked = prompt_text.rsplit("<|im_start|>user\n", 1)[-1]
    if "wifi" in asked.lower() and "get_wifi_status" not in asked:
        return render_tool_call("get_wifi_status", {})
    return "All done."


def test_batches_stay_full_and_results_keep_seed_order(tiny_model):
    _, tokenizer = tiny_model
    engine = ScriptedEngine(tokenizer, wifi_reply)
    backend = LiveCountingBackend(engine)
    seeds = list(range(10))
    finished = []
    tasks = [EpisodeTask(f"device-{seed}", seed) for seed in seeds]
    results = run_rollouts(tasks, backend, AgentPrompt(tokenizer), GREEDY, 4, 8192, finished.append)
    assert [result.seed for result in results] == seeds
    assert sorted(result.seed for result in finished) == seeds
    # 4 live from the start; finished episodes' slots are refilled at once, until the queue runs dry
    assert backend.live_after_reset[0] == 4 and set(backend.live_after_reset[:-1]) == {4}
    assert sum(backend.reset_sizes) == 10 and len(backend.reset_sizes) > 2
    assert len(engine.requests) == sum(r.turns for r in results) > 10  # the wifi tasks took two turns
    assert not any(result.success or result.reward == 1.0 for result in results)  # "All done." does no task
    for result in results:  # each episode, replayed alone in a fresh environment, scores what the batched loop recorded
        replies = iter([message for message in result.messages if message["role"] == "assistant"])
        _, _, last = play_recorded(DeviceEnvironment(), result.seed, lambda _, replies=replies: next(replies))
        assert (result.reward, result.success) == (last.reward, last.info["success"])
    rows = summarize([(r.family, r.reward, r.success) for r in results])
    assert rows[-1].group == "overall" and rows[-1].episodes == 10
    assert sum(row.episodes for row in rows[:-1]) == 10


def test_each_turn_acts_with_the_adapter_named_as_it_starts_and_records_it(tiny_model):
    _, tokenizer = tiny_model
    tasks = [EpisodeTask(f"device-{seed}", seed, adapter=("cap", 4)) for seed in range(10)]
    engine = ScriptedEngine(tokenizer, wifi_reply)
    kept = run_rollouts(tasks, LocalBackend(DeviceEnvironment, engine), AgentPrompt(tokenizer), GREEDY, 1, 8192)
    assert all(r.turn_adapters == [("cap", 4)] * r.turns and r.adapter == ("cap", 4) for r in kept)

    engine = ScriptedEngine(tokenizer, wifi_reply)
    published = iter(range(5, 100))  # a newer version at every turn, as if one were published between any two
    switched = run_rollouts(
        tasks,
        LocalBackend(DeviceEnvironment, engine),
        AgentPrompt(tokenizer),
        GREEDY,
        1,
        8192,
        adapter_at_turn=lambda adapter: (adapter[0], next(published)),
    )
    assert engine.adapters == [("cap", version) for version in range(5, 5 + len(engine.adapters))]
    assert [adapter for r in switched for adapter in r.turn_adapters] == engine.adapters  # one episode at a time
    assert any(r.turns == 2 for r in switched)  # the wifi tasks: two turns, two versions
    for result in switched:
        assert len(result.turn_adapters) == result.turns and result.adapter == result.turn_adapters[0]  # the oldest
    assert [r.reward for r in switched] == [r.reward for r in kept]  # the scripted replies ignore the adapter


def test_prompt_over_the_context_limit_ends_the_episode(tiny_model):
    _, tokenizer = tiny_model
    engine = ScriptedEngine(tokenizer, lambda _: "never called")
    [result] = run_episodes([0], engine, tokenizer, batch_size=2, max_context_tokens=100)
    assert result.termination == "context_limit" and result.reward == 0.0 and engine.requests == []


def test_episode_token_budget_ends_the_episode_and_cuts_its_last_turn(tiny_model):
    _, tokenizer = tiny_model
    engine = ScriptedEngine(tokenizer, lambda _: render_tool_call("get_wifi_status", {}))  # never replies to the user
    tasks = [EpisodeTask("device-0", 0)]
    [result] = run_rollouts(
        tasks, LocalBackend(DeviceEnvironment, engine), AgentPrompt(tokenizer), GREEDY, 1, 8192, max_episode_tokens=50
    )
    call_tokens = len(tokenizer.encode(render_tool_call("get_wifi_status", {}))) + 1  # with its end-of-turn token
    assert result.termination == "token_limit" and result.reward == 0.0 and not result.success
    assert result.record.action_tokens == 50 and result.turns == -(-50 // call_tokens)
    assert [p.max_new_tokens for p in engine.requests][-1] == 50 - (result.turns - 1) * call_tokens


def test_sampling_seeds_depend_on_episode_and_turn_not_on_scheduling(tiny_model):
    _, tokenizer = tiny_model
    seeded = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=64, seed=7)

    def reply(prompt_text):
        return (
            render_tool_call("get_wifi_status", {})
            if "get_wifi_status" not in prompt_text.rsplit("<|im_start|>user\n", 1)[-1]
            else "Done."
        )

    seeds_by_batch = {}
    for batch_size in (1, 3):
        engine = ScriptedEngine(tokenizer, reply)
        run_episodes([0, 1, 2], engine, tokenizer, seeded, batch_size=batch_size)
        seeds_by_batch[batch_size] = sorted(p.seed for p in engine.requests)
    assert seeds_by_batch[1] == seeds_by_batch[3]
    assert len(set(seeds_by_batch[1])) == len(seeds_by_batch[1]) == 6  # 3 episodes x 2 turns, all different


def test_malformed_model_output_is_an_error_observation(tiny_model):
    _, tokenizer = tiny_model

    def reply(prompt_text):
        return (
            "<tool_call>{not json</tool_call>"
            if "Error:" not in prompt_text.rsplit("<|im_start|>user\n", 1)[-1]
            else "Sorry."
        )

    [result] = run_episodes([0], ScriptedEngine(tokenizer, reply), tokenizer)
    tool_messages = [m for m in result.messages if m["role"] == "tool"]
    assert tool_messages[0]["content"].startswith("Error: malformed tool call")
    assert result.turns == 2 and result.termination == "agent_reply"


def render(prompt, messages, tools, example, add_generation_prompt):
    """A whole conversation as the chat template renders it, in one piece."""
    text = prompt.tokenizer.apply_chat_template(
        prompt.chat(messages, tools, example), add_generation_prompt=add_generation_prompt, tokenize=False
    )
    return prompt.tokenizer.encode(text, add_special_tokens=False)


def test_record_is_the_template_rendering_with_exact_masks_and_logprobs(tiny_model):
    _, tokenizer = tiny_model
    prompt = AgentPrompt(tokenizer)
    example = DeviceEnvironment().example_exchange()
    eos = tokenizer.eos_token_id
    for seed in (1, 6):  # a blocked setting (tool errors, several turns) and an ambiguous contact (user reply)
        engine = ScriptedEngine(tokenizer, oracle_text(seed))
        [result] = run_episodes([seed], engine, tokenizer)
        record, messages = result.record, result.messages
        assert len(record.token_ids) == len(record.action_mask) == len(record.logprobs)
        rendered = render(prompt, messages, result.tools, example, add_generation_prompt=False)
        closing = prompt.assistant_closing_ids
        assert record.token_ids == rendered[: len(record.token_ids)]
        assert rendered[len(record.token_ids) :] == closing[1:]
        # SmolLM2's template is append-only, so each turn's continuation is exactly what re-rendering the whole
        # conversation appended (how continuations were computed before they rendered only the new messages)
        replies = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
        assert len(replies) == result.turns >= 3
        for reply, next_reply in zip(replies, replies[1:]):
            through_reply = render(prompt, messages[: reply + 1], result.tools, example, add_generation_prompt=False)
            extended = render(prompt, messages[:next_reply], result.tools, example, add_generation_prompt=True)
            assert extended[: len(through_reply)] == through_reply
            continuation = prompt.continuation_ids(messages[reply + 1 : next_reply], result.tools, [eos])
            assert continuation == closing[1:] + extended[len(through_reply) :]
        # every sampled token, each turn's end-of-turn token included, is an action; nothing else is
        sampled = [i for i, m in enumerate(record.action_mask) if m]
        assert sum(1 for i in sampled if record.token_ids[i] == eos) == result.turns
        assert all(record.logprobs[i] == -0.5 for i in sampled)
        assert all(lp == 0.0 for lp, m in zip(record.logprobs, record.action_mask) if not m)
        assistant_texts = [m["raw_text"] for m in messages if m["role"] == "assistant"]
        assert [tokenizer.decode(s[:-1]) for s in action_segments(record)] == assistant_texts
        assert all(s[-1] == eos for s in action_segments(record))


def action_segments(record):
    """The record's runs of action tokens, in order."""
    segments, current = [], []
    for token, mask in zip(record.token_ids, record.action_mask):
        if mask:
            current.append(token)
        elif current:
            segments.append(current)
            current = []
    return segments + [current] if current else segments


THOUGHT = "<think>\nWhich tool does the request need next?\n</think>\n\n"


def thinking_oracle(seed):
    """The oracle's replies for ``seed`` in order, each behind a <think> block."""
    messages, _, _ = play_recorded(DeviceEnvironment(), seed, lambda env: env.oracle_message())
    return [THOUGHT + assistant_text(message) for message in messages if message["role"] == "assistant"]


def thinking_continuation(new_messages):
    """What THINKING_TEMPLATE writes after a reply closed by <|im_end|>, up to the next generation, by hand."""
    if all(message["role"] == "tool" for message in new_messages):
        responses = "".join(f"\n<tool_response>\n{message['content']}\n</tool_response>" for message in new_messages)
        return f"\n<|im_start|>user{responses}<|im_end|>\n<|im_start|>assistant\n"
    [user] = new_messages
    return f"\n<|im_start|>user\n{user['content']}<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("tool_format", ["native", "text"])
def test_a_template_that_rewrites_earlier_turns_extends_the_sampled_tokens(tiny_model, tool_format):
    tokenizer = with_template(tiny_model[1], THINKING_TEMPLATE)
    prompt = AgentPrompt(tokenizer, tool_format=tool_format)
    example = DeviceEnvironment().example_exchange()
    eos = tokenizer.eos_token_id
    for seed in (1, 6):  # tool results only; a tool result, then the user's reply (the template drops earlier thoughts)
        tasks = [EpisodeTask(f"device-{seed}", seed)]
        texts = thinking_oracle(seed)
        replies = iter(texts)
        engine = ScriptedEngine(tokenizer, lambda _, replies=replies: next(replies))
        params = replace(GREEDY, max_new_tokens=256)  # whole replies, thoughts included
        [result] = run_rollouts(tasks, LocalBackend(DeviceEnvironment, engine), prompt, params, 1, 8192)
        assert result.termination == "agent_reply" and result.turns >= 3
        messages = result.messages
        replies = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
        # the record: the first prompt, then each turn's sampled tokens verbatim and the new messages' rendering
        expected_ids = prompt.prompt_ids(messages[:2], result.tools, example)
        expected_mask = [0] * len(expected_ids)
        assert len(replies) == len(texts)
        for text, reply, next_reply in zip(texts, replies, replies[1:] + [None]):
            sampled = tokenizer.encode(text) + [eos]
            new_messages = messages[reply + 1 : next_reply] if next_reply else []
            continuation = tokenizer.encode(thinking_continuation(new_messages)) if new_messages else []
            expected_ids += sampled + continuation
            expected_mask += [1] * len(sampled) + [0] * len(continuation)
        assert result.record.token_ids == expected_ids
        assert result.record.action_mask == expected_mask
        assert tokenizer.decode(result.record.token_ids).count(THOUGHT) == result.turns
        # re-rendering the conversation drops the thoughts of the replies before the user's last message
        rerendered = tokenizer.apply_chat_template(
            prompt.chat(messages, result.tools, example), tools=result.tools if prompt.native else None, tokenize=False
        )
        last_user = max(i for i, message in enumerate(messages) if message["role"] == "user")
        kept = sum(1 for i in replies if i > last_user)
        assert rerendered.count(THOUGHT) == kept
        if seed == 6:  # the user replied after two replies: a whole-conversation rendering would have rewritten them
            assert kept == result.turns - 2


def test_each_turn_renders_only_its_new_messages(tiny_model):
    _, tokenizer = tiny_model
    counting = CountingTokenizer(tokenizer)
    calls = 20
    replies = iter([render_tool_call("get_wifi_status", {})] * calls + ["Wifi is on."])
    engine = ScriptedEngine(tokenizer, lambda _: next(replies))
    prompt = AgentPrompt(counting)
    [result] = run_rollouts(
        [EpisodeTask("device-0", 0)], LocalBackend(DeviceEnvironment, engine), prompt, GREEDY, 1, 8192
    )
    assert result.turns == calls + 1 and len(result.messages) == 2 + 2 * calls + 1
    first_prompt = 1 + len(DeviceEnvironment().example_exchange()) + 1  # system, the worked example, the request
    # the first prompt whole; the assistant turn's closing once (2 messages); then each turn its one tool result after
    # the same 2-message prefix, however long the conversation has grown (re-rendering it would take 7 + 2k at turn k)
    assert counting.rendered[0] == first_prompt
    assert sorted(counting.rendered[1:]) == [2] + [3] * calls


def test_sampled_record_logprobs_match_a_teacher_forced_forward(tiny_model):
    network, tokenizer = tiny_model
    params = SamplingParams(temperature=0.8, top_p=1.0, max_new_tokens=12, seed=5)  # top_p 1: the whole policy
    results = run_episodes([0, 1, 2], HFEngine(network, tokenizer), tokenizer, params, batch_size=3)
    for result in results:
        assert_logprobs_match_a_forward(result.record, network, params.temperature, atol=1e-3)


def assert_logprobs_match_a_forward(record, network, temperature, atol):
    """Every action token's recorded log-prob is the model's own, teacher-forced over the whole record."""
    ids = torch.tensor([record.token_ids])
    with torch.no_grad():
        logits = network(ids).logits[0, :-1].float() / temperature
    forward = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    mask = torch.tensor(record.action_mask[1:], dtype=torch.bool)
    assert mask.sum() == record.action_tokens > 0
    assert torch.allclose(forward[mask], torch.tensor(record.logprobs[1:])[mask], atol=atol)


class CountingTokenizer:
    """The tokenizer, recording how many messages each chat-template rendering gets."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.rendered = []

    def apply_chat_template(self, messages, **kwargs):
        self.rendered.append(len(messages))
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


class FlakyBackend(LocalBackend):
    """Loses episode device-2 at its first step and device-3 at its reset, once each."""

    def __init__(self, engine):
        super().__init__(DeviceEnvironment, engine)
        self.lost = set()
        self.resets = []

    def reset(self, tasks):
        self.resets += [task.key for task in tasks]
        results = super().reset(tasks)
        return [
            None if task.key == "device-3" and self._lose(task.key + "/reset") else result
            for task, result in zip(tasks, results)
        ]

    def step(self, steps):
        results = super().step(steps)
        return [None if key == "device-2" and self._lose(key) else result for (key, _), result in zip(steps, results)]

    def _lose(self, what):
        if what in self.lost:
            return False
        self.lost.add(what)
        return True


def test_lost_episodes_rerun_once_from_the_start(tiny_model):
    _, tokenizer = tiny_model
    engine = ScriptedEngine(tokenizer, lambda _: "Done.")
    backend = FlakyBackend(engine)
    tasks = [EpisodeTask(f"device-{seed}", seed) for seed in range(5)]
    finished = []
    results = run_rollouts(tasks, backend, AgentPrompt(tokenizer), GREEDY, 4, 8192, finished.append)
    assert [r.key for r in results] == [t.key for t in tasks]
    assert sorted(r.key for r in finished) == sorted(t.key for t in tasks)  # each reported exactly once
    assert backend.resets.count("device-2") == 2 and backend.resets.count("device-3") == 2
    assert all(r.turns == 1 for r in results)
