import math
from types import SimpleNamespace

import pytest
import torch

from trace_ray.capabilities.llm_labeler import CUT_MARKER, cut_middle
from trace_ray.routing import BASE, LogitRouter, RouteOption, decide, label_tokens, routing_messages
from trace_ray.routing.logit_router import ANSWER_PREFIX, BASE_DESCRIPTION, options_block, task_block

OPTIONS = [
    RouteOption(
        "datetime_reasoning",
        "Compute absolute times from relative expressions such as 'in two hours'.",
        "user: Remind me in two hours.\ncall get_current_timestamp({})\n  -> 1803854437\n"
        'call add_reminder({"timestamp": 1803861637})\n  -> reminder 7 added\nfinal reply: Done.',
    ),
    RouteOption(
        "error_recovery",
        "Read a tool's error message and retry the call with corrected arguments.",
        'user: Text Bob.\ncall send_message({})\n  -> error: missing recipient\ncall send_message({"to": "Bob"})\n'
        "  -> sent\nfinal reply: " + "Sent it. " * 400,  # longer than the example limit
    ),
]


def observation(request, policy="You are a phone assistant. Follow the user's requests using the tools."):
    return [{"role": "system", "content": policy}, {"role": "user", "content": request}]


# -- labels -----------------------------------------------------------------------------------
def test_every_label_is_one_token_after_answer_with_the_smollm2_tokenizer(tiny_model):
    _, tokenizer = tiny_model
    labels = label_tokens(tokenizer, 26)
    assert [label for label, _ in labels] == list("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert len({token for _, token in labels}) == 26
    prefix = tokenizer.encode(ANSWER_PREFIX, add_special_tokens=False)
    for label, token in labels:
        assert tokenizer.encode(f"{ANSWER_PREFIX} {label}", add_special_tokens=False) == prefix + [token]
        assert tokenizer.decode([token]) == f" {label}"


class SplittingTokenizer:
    """Characters as tokens, except ' A' and ' B'; ' C' splits into ' ' and 'C'."""

    def encode(self, text, add_special_tokens=False):
        ids, index = [], 0
        while index < len(text):
            if text[index : index + 2] in (" A", " B"):
                ids.append(1000 + ord(text[index + 1]))
                index += 2
            else:
                ids.append(ord(text[index]))
                index += 1
        return ids


def test_a_label_that_splits_raises_naming_it():
    assert label_tokens(SplittingTokenizer(), 2) == [("A", 1065), ("B", 1066)]
    with pytest.raises(ValueError, match=r"routing label 'C' is not one token after 'Answer:'.*\[32, 67\]"):
        label_tokens(SplittingTokenizer(), 3)


def test_a_label_merging_with_the_prefix_raises():
    class Merging(SplittingTokenizer):
        def encode(self, text, add_special_tokens=False):
            return [9999] if text == f"{ANSWER_PREFIX} A" else super().encode(text)

    with pytest.raises(ValueError, match="routing label 'A'"):
        label_tokens(Merging(), 1)


def test_more_than_26_options_raise(tiny_model):
    network, tokenizer = tiny_model
    with pytest.raises(ValueError, match="1 to 26 options"):
        label_tokens(tokenizer, 27)
    with pytest.raises(ValueError, match="1 to 26 options"):
        label_tokens(tokenizer, 0)
    many = [RouteOption(f"skill_{i}", "d", "") for i in range(26)]  # + base = 27
    with pytest.raises(ValueError, match="1 to 26 options"):
        LogitRouter(network, tokenizer, many)
    with pytest.raises(ValueError, match="at most 26 options"):
        routing_messages(observation("x"), many)
    LogitRouter(network, tokenizer, many[:25])  # 25 capabilities + base fit


# -- decide -----------------------------------------------------------------------------------
def test_decide_takes_the_argmax_with_a_softmax():
    decision = decide({"a": 1.0, "b": 3.0, BASE: 2.0})
    assert decision.choice == "b"
    assert decision.scores == {"a": 1.0, "b": 3.0, BASE: 2.0}
    # by hand: e^1 = 2.718281828, e^3 = 20.085536923, e^2 = 7.389056099; sum 30.192874850
    # -> 2.718281828 / 30.192874850 = 0.090030573, 20.085536923 / 30.192874850 = 0.665240956, 7.389056099 / 30.192874850
    # = 0.244728471
    assert [decision.probabilities[k] for k in ("a", "b", BASE)] == pytest.approx(
        [0.090030573, 0.665240956, 0.244728471], abs=1e-9
    )
    # 1000 apart: e^-2000 underflows to 0 beside e^0 = 1 (a naive e^1000 would overflow)
    assert decide({"a": 1000.0, "b": -1000.0}).probabilities == {"a": 1.0, "b": 0.0}


def test_decide_ties():
    assert decide({"a": 2.0, "b": 2.0, BASE: 2.0}).choice == BASE
    assert decide({"a": 1.0, "b": 2.0, BASE: 2.0}).choice == BASE
    assert decide({"a": 2.0, "b": 2.0, BASE: 1.0}).choice == "a"
    assert decide({"b": 2.0, "a": 2.0, BASE: 1.0}).choice == "b"
    assert decide({"a": 2.0, "b": 2.0}, tie_break="b").choice == "b"
    with pytest.raises(ValueError):
        decide({})


# -- the router with a fake model -------------------------------------------------------------
class FakeModel(torch.nn.Module):
    """Next-token logits favouring ``favoured`` at every position (and recording its inputs)."""

    def __init__(self, vocab_size, favoured):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.vocab_size, self.favoured, self.calls = vocab_size, favoured, []

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        self.calls.append(
            {"input_ids": input_ids, "attention_mask": attention_mask, "training": self.training, **kwargs}
        )
        logits = torch.zeros(*input_ids.shape, self.vocab_size)
        logits[..., self.favoured] = 5.0
        return SimpleNamespace(logits=logits)


@pytest.mark.parametrize(
    "favoured_label, expected", [("A", "datetime_reasoning"), ("B", "error_recovery"), ("C", BASE)]
)
def test_the_router_picks_the_option_whose_label_wins(tiny_model, favoured_label, expected):
    _, tokenizer = tiny_model
    token = dict(label_tokens(tokenizer, 3))[favoured_label]
    fake = FakeModel(len(tokenizer), token)
    fake.train()
    # whole prompts: one call per decision
    router = LogitRouter(fake, tokenizer, OPTIONS, reuse_prefix=False, calibration="none")
    decision = router.route(observation("Remind me to call mum in two hours."))
    assert decision.choice == expected
    assert list(decision.scores) == ["datetime_reasoning", "error_recovery", BASE]
    assert decision.scores[expected] == 5.0 and sum(decision.scores.values()) == 5.0
    assert decision.probabilities[expected] > 0.98
    call = fake.calls[0]
    assert call["training"] is False and fake.training  # scored in eval mode, mode restored
    assert call["use_cache"] is False
    ids = call["input_ids"][0].tolist()
    answer = tokenizer.encode(ANSWER_PREFIX, add_special_tokens=False)
    assert ids[-len(answer) :] == answer
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\nAnswer:")


def test_route_many_left_pads_and_sends_batches(tiny_model):
    _, tokenizer = tiny_model
    fake = FakeModel(len(tokenizer), dict(label_tokens(tokenizer, 3))["B"])
    router = LogitRouter(fake, tokenizer, OPTIONS, batch_size=2, reuse_prefix=False, calibration="none")
    decisions = router.route_many([observation("Hi."), observation("A much longer request " * 10), observation("x")])
    assert [d.choice for d in decisions] == ["error_recovery"] * 3
    assert [call["input_ids"].shape[0] for call in fake.calls] == [2, 1]
    mask = fake.calls[0]["attention_mask"]
    assert mask[0, 0] == 0 and mask[0, -1] == 1 and bool(mask[1].all())  # the short prompt is padded on the left


def test_base_cannot_be_passed_as_a_capability(tiny_model):
    network, tokenizer = tiny_model
    with pytest.raises(ValueError, match="appends the 'base' option"):
        LogitRouter(network, tokenizer, [*OPTIONS, RouteOption(BASE, "no adapter", "")])
    with pytest.raises(ValueError, match="distinct names"):
        LogitRouter(network, tokenizer, [OPTIONS[0], OPTIONS[0]])


# -- the prompt -------------------------------------------------------------------------------
def test_the_prompt_lists_options_then_task_with_truncated_examples_and_base():
    policy = "You are a phone assistant. " + "Always confirm before sending. " * 100
    messages = routing_messages(observation("Text Bob that I am late.", policy=policy), OPTIONS, max_example_chars=300)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "choose the skill that helps" in messages[0]["content"].lower()
    text = messages[1]["content"]
    assert "User request: Text Bob that I am late." in text
    assert "Policy (shortened): You are a phone assistant." in text and policy.strip() not in text
    assert "A. datetime_reasoning: " + OPTIONS[0].description in text
    assert "B. error_recovery: " + OPTIONS[1].description in text
    assert f"C. {BASE}: {BASE_DESCRIPTION}" in text
    short = "\n".join("   " + line if line else line for line in OPTIONS[0].example.splitlines())
    assert short in text  # a short example whole, indented under its option
    cut = cut_middle(OPTIONS[1].example, 300)
    assert len(cut) == 300 and CUT_MARKER in cut
    head, tail = cut.split(CUT_MARKER)
    assert "\n   ".join(head.splitlines()) in text and tail.strip() in text
    assert "Sent it. " * 40 not in text
    assert text.endswith("Answer with the letter of one option (A, B or C) only.")
    # options first, then the task
    assert text.index("Options:\nA. ") < text.index("C. base") < text.index("\n\nTask\n")
    assert text.startswith(options_block(OPTIONS, 300)) and text.endswith(
        task_block(observation("Text Bob that I am late.", policy=policy), 3)
    )


def test_the_prompt_needs_a_user_message():
    with pytest.raises(ValueError, match="no user message"):
        routing_messages([{"role": "system", "content": "policy"}], OPTIONS)


# -- the router with the tiny model -----------------------------------------------------------
def test_route_with_the_tiny_model_scores_every_option(tiny_model):
    network, tokenizer = tiny_model
    router = LogitRouter(network, tokenizer, OPTIONS, calibration="none")
    task = observation("Remind me to water the plants in 3 hours.")
    decision = router.route(task)
    assert list(decision.scores) == ["datetime_reasoning", "error_recovery", BASE]
    assert math.isclose(sum(decision.probabilities.values()), 1.0)
    with torch.no_grad():  # the scores are the next-token logits of the label tokens at the last position
        logits = network(torch.tensor([router.prompt_ids(task)])).logits[0, -1]
    by_hand = {name: logits[token].item() for (_, token), name in zip(router.labels, router.names)}
    assert decision.scores == pytest.approx(by_hand, abs=1e-5)
    assert decision.choice == max(by_hand, key=by_hand.get)  # the label whose logit, computed here, is highest
    prompt = tokenizer.decode(router.prompt_ids(task))
    assert "Remind me to water the plants in 3 hours." in prompt and BASE_DESCRIPTION in prompt
    assert prompt.endswith("<|im_start|>assistant\nAnswer:")


def test_route_many_equals_route_one_by_one(tiny_model):
    network, tokenizer = tiny_model
    router = LogitRouter(network, tokenizer, OPTIONS, batch_size=3)
    tasks = [
        observation("Remind me to water the plants in 3 hours."),
        observation("Send a message to Alice saying hello, and if it fails try again. " * 3),
        observation("What time is it?", policy="Be brief."),
        observation("Turn on do not disturb."),
    ]
    together = router.route_many(tasks)
    for task, batched in zip(tasks, together):
        alone = router.route(task)
        assert batched.choice == alone.choice
        for name in router.names:
            assert batched.scores[name] == pytest.approx(alone.scores[name], abs=1e-4)


class BiasedModel(torch.nn.Module):
    """Label logits with a bias toward C (base) whatever the prompt says (+3), and +2 for A when the request asks for a
    reminder: the raw scores always pick base, the task's signal is only in the difference to the content-free ones."""

    def __init__(self, tokenizer):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tokenizer, self.labels, self.requests = tokenizer, dict(label_tokens(tokenizer, 3)), []

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        logits = torch.zeros(*input_ids.shape, len(self.tokenizer))
        for row, ids in enumerate(input_ids.tolist()):
            request = self.tokenizer.decode(ids).split("User request: ")[-1].split("\n")[0]
            self.requests.append(request)
            logits[row, :, self.labels["C"]] = 3.0
            logits[row, :, self.labels["A"]] = 2.0 if "remind" in request.lower() else 0.0
        return SimpleNamespace(logits=logits)


def test_content_free_calibration_removes_the_bias_measured_once_per_policy(tiny_model):
    _, tokenizer = tiny_model
    model = BiasedModel(tokenizer)
    raw = LogitRouter(model, tokenizer, OPTIONS, reuse_prefix=False, calibration="none")
    calibrated = LogitRouter(model, tokenizer, OPTIONS, reuse_prefix=False)
    reminder, other = observation("Remind me to call mum in two hours."), observation("Turn on wifi.")
    assert [raw.route(task).choice for task in (reminder, other)] == [BASE, BASE]  # the bias wins every raw decision
    model.requests.clear()
    decisions = calibrated.route_many([reminder, other, observation("Remind me to stretch.")])
    # content-free logits: A 0, B 0, C 3; a reminder's: A 2, B 0, C 3. Calibrated score = log-softmax(task) -
    # log-softmax(free):
    # the log-sum-exps cancel in differences, so A - C = (2 - 0) - (3 - 3) = 2 and B - C = 0 - 0 = 0
    scores = decisions[0].scores
    assert decisions[0].choice == "datetime_reasoning"
    assert scores["datetime_reasoning"] - scores[BASE] == pytest.approx(2.0, abs=1e-5)
    assert scores["error_recovery"] - scores[BASE] == pytest.approx(0.0, abs=1e-5)
    # no signal: a tie
    assert decisions[1].choice == BASE and list(decisions[1].scores.values()) == pytest.approx([0.0] * 3, abs=1e-5)
    assert decisions[2].choice == "datetime_reasoning"
    # the three content-free requests ran once for the policy the three tasks share, then each task once
    assert sorted(model.requests) == sorted(
        ["N/A", "", "[MASK]", *(task[1]["content"] for task in (reminder, other))] + ["Remind me to stretch."]
    )
    with pytest.raises(ValueError, match="calibration='platt' is not one of content_free, fitted, none"):
        LogitRouter(model, tokenizer, OPTIONS, calibration="platt")


def test_fitted_calibration_adds_each_options_offset_to_the_content_free_scores(tiny_model):
    _, tokenizer = tiny_model
    model = BiasedModel(tokenizer)
    offsets = {"datetime_reasoning": -2.5, "error_recovery": 0.5, BASE: 0.0}
    free = LogitRouter(model, tokenizer, OPTIONS, reuse_prefix=False)
    fitted = LogitRouter(model, tokenizer, OPTIONS, reuse_prefix=False, calibration="fitted", offsets=offsets)
    tasks = [observation("Remind me to call mum in two hours."), observation("Turn on wifi.")]
    for before, after in zip(free.route_many(tasks), fitted.route_many(tasks)):
        assert after.scores == pytest.approx({name: before.scores[name] + offsets[name] for name in offsets}, abs=1e-5)
    # the reminder's datetime_reasoning score was 2 above base: -2.5 puts it 0.5 below; error_recovery's 0 becomes 0.5
    assert [d.choice for d in fitted.route_many(tasks)] == ["error_recovery", "error_recovery"]
    with pytest.raises(ValueError, match="needs one offset per option"):
        LogitRouter(model, tokenizer, OPTIONS, calibration="fitted", offsets={"datetime_reasoning": 1.0, BASE: 0.0})
    with pytest.raises(ValueError, match="needs one offset per option"):
        LogitRouter(model, tokenizer, OPTIONS, calibration="fitted")


class CountingModel(torch.nn.Module):
    """The model, recording each forward pass's new tokens and the cached tokens before them."""

    def __init__(self, network):
        super().__init__()
        self.network, self.calls = network, []

    def forward(self, input_ids, past_key_values=None, **kwargs):
        cached = past_key_values.get_seq_length() if past_key_values is not None else 0
        self.calls.append((input_ids.shape[0], input_ids.shape[1], cached))
        return self.network(input_ids=input_ids, past_key_values=past_key_values, **kwargs)


TASKS = [
    observation("Remind me to water the plants in 3 hours."),
    observation("Send a message to Alice saying hello, and if it fails try again. " * 3),
    observation("What time is it?", policy="Be brief."),
]


def test_each_policy_head_runs_once_and_later_decisions_run_their_request_tokens_only(tiny_model):
    network, tokenizer = tiny_model
    counting = CountingModel(network)
    router = LogitRouter(counting, tokenizer, OPTIONS, calibration="none")
    whole = LogitRouter(network, tokenizer, OPTIONS, reuse_prefix=False, calibration="none")
    prompts = [router.prompt(task) for task in TASKS]
    assert [ids for ids, _ in prompts] == [whole.prompt_ids(task) for task in TASKS]  # the same tokens as without reuse
    assert whole.prompt(TASKS[0])[1] == 0  # no head without reuse
    (first, head), (second, same), (third, other) = prompts
    # one policy: one head, most of the prompt
    assert head == same and first[:head] == second[:head] and head > len(first) * 3 // 4
    assert other < head and third[:other] != first[:other]  # another policy: another head
    assert tokenizer.decode(first[:head]).rstrip().endswith("Policy (shortened): " + TASKS[0][0]["content"])
    assert tokenizer.decode(first[head:]).lstrip().startswith("User request: Remind me")
    for task, _prompt in zip(TASKS, prompts):
        decision, reference = router.route(task), whole.route(task)
        assert decision.choice == reference.choice
        assert decision.scores == pytest.approx(reference.scores, abs=1e-4)
    assert counting.calls == [
        (1, head, 0),
        (1, len(first) - head, head),
        (1, len(second) - head, head),
        (1, other, 0),
        (1, len(third) - other, other),
    ]
    counting.calls.clear()
    batched = router.route_many(TASKS)  # grouped by head: one left-padded batch per policy, from the cache
    assert counting.calls == [(2, max(len(first), len(second)) - head, head), (1, len(third) - other, other)]
    for decision, task in zip(batched, TASKS):
        assert decision.scores == pytest.approx(whole.route(task).scores, abs=1e-4)


def test_the_router_keeps_the_last_heads_only(tiny_model, monkeypatch):
    network, tokenizer = tiny_model
    monkeypatch.setattr("trace_ray.routing.logit_router.PREFIX_CACHE_ENTRIES", 2)
    counting = CountingModel(network)
    router = LogitRouter(counting, tokenizer, OPTIONS, calibration="none")
    policies = [observation("Hi.", policy=f"Policy number {i}.") for i in range(3)]
    for task in [policies[0], policies[1], policies[0], policies[2], policies[1]]:
        router.route(task)
    heads = [cached == 0 for _, _, cached in counting.calls]
    # 1 was dropped for 2, 0 kept by its reuse
    assert heads == [True, False, True, False, False, True, False, True, False]
    assert len(router._prefixes) == 2


def test_prompts_batched_after_a_head_must_share_it(tiny_model):
    network, tokenizer = tiny_model
    router = LogitRouter(network, tokenizer, OPTIONS)
    (first, head), (third, _) = router.prompt(TASKS[0]), router.prompt(TASKS[2])
    with pytest.raises(ValueError, match="same .* tokens"):
        router.label_logits([first, third], head)
    assert router.label_logits([first, third]).shape == (2, 3)  # without a head: whole prompts


def test_the_router_scores_a_peft_model_with_its_adapters_disabled(tiny_model):
    from trace_ray.config_compose import compose_config
    from trace_ray.training.lora_model import trainable_model

    network, tokenizer = tiny_model
    config = compose_config("train", ["model=tiny_random", "lora.rank=4", "lora.alpha=8"])
    peft_model, _ = trainable_model(config.model, config.lora, seed=3)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    task = TASKS[0]
    with torch.no_grad():  # the adapter changes the model's logits ...
        ids = torch.tensor([LogitRouter(network, tokenizer, OPTIONS).prompt_ids(task)])
        assert not torch.allclose(
            peft_model(input_ids=ids).logits[0, -1], network(input_ids=ids).logits[0, -1], atol=1e-3
        )
    routed = LogitRouter(peft_model, tokenizer, OPTIONS)
    for _ in range(2):  # ... but not the router's scores, from the head's cache or after it
        assert routed.route(task).scores == pytest.approx(
            LogitRouter(network, tokenizer, OPTIONS).route(task).scores, abs=1e-4
        )
    assert peft_model.training  # its mode is restored


def test_compact_messages_is_compact_trajectory_without_its_header():
    from trace_ray.capabilities.llm_labeler import compact_messages, compact_trajectory
    from trace_ray.capabilities.trajectories import Trajectory

    messages = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "Text Bob."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "send", "arguments": '{"to": "Bob"}'}}],
        },
        {"role": "tool", "content": "sent"},
        {"role": "assistant", "content": "Done."},
    ]
    text = compact_messages(messages, 10_000)
    assert text == 'user: Text Bob.\ncall send({"to": "Bob"})\n  -> sent\nfinal reply: Done.'
    trajectory = Trajectory(
        id="t#0",
        task_id="t",
        env="synthetic",
        seed=0,
        family="f",
        success=True,
        reward=1.0,
        messages=messages,
        reward_info={},
        termination="reply",
    )
    assert compact_trajectory(trajectory, 10_000) == "trajectory t#0: success (reward 1.00, reply)\n" + text
    short = compact_messages(messages, 40)
    assert len(short) == 40 and CUT_MARKER in short and short.startswith("user: Text")
