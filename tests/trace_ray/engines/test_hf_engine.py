from dataclasses import replace

import pytest
import torch

from trace_ray.engines import SamplingParams
from trace_ray.engines.engine_loop import Request, request_generator
from trace_ray.engines.hf import HFEngine


def prompts_for(tokenizer, texts):
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )["input_ids"]
        )
        for text in texts
    ]


def forward_logprobs(network, prompt, generated, temperature, top_p=1.0):
    """Teacher-forced log-probs of ``generated`` under the temperature-scaled policy, renormalized to the top-p
    nucleus."""
    from trace_ray.engines.sampling import nucleus

    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = network(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    logprobs = torch.log_softmax(logits, -1)
    chosen = logprobs.gather(-1, torch.tensor(generated)[:, None]).squeeze(-1)
    nucleus_mass = torch.tensor([float(nucleus(step.exp(), top_p)[0].sum()) for step in logprobs])
    return chosen - torch.log(nucleus_mass)


def test_batched_greedy_matches_single_sequences(tiny_model):
    network, tokenizer = tiny_model
    engine = HFEngine(network, tokenizer)
    prompts = prompts_for(tokenizer, ["Turn on wifi please", "Hi", "What time is it in Paris right now?"])
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=12)
    batched = engine.generate(prompts, params)
    for prompt, together in zip(prompts, batched):
        alone = engine.generate([prompt], params)[0]
        assert alone.token_ids == together.token_ids
        assert torch.allclose(torch.tensor(alone.logprobs), torch.tensor(together.logprobs), atol=1e-4)


def test_logprobs_are_those_of_the_sampling_policy(tiny_model):
    network, tokenizer = tiny_model
    engine = HFEngine(network, tokenizer)
    prompts = prompts_for(tokenizer, ["short", "a somewhat longer prompt here"])
    for temperature in (0.0, 0.7):
        params = SamplingParams(temperature=temperature, top_p=0.9, max_new_tokens=10, seed=3)
        for prompt, generation in zip(prompts, engine.generate(prompts, params)):
            assert len(generation.logprobs) == len(generation.token_ids) > 0
            expected = forward_logprobs(
                network, prompt, generation.token_ids, temperature or 1.0, 0.9 if temperature else 1.0
            )
            assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-3)


def test_sampling_is_reproducible_per_seed_and_varies_across_seeds(tiny_model):
    network, tokenizer = tiny_model
    engine = HFEngine(network, tokenizer)
    prompts = prompts_for(tokenizer, ["hello"]) * 4
    first = engine.generate(prompts, SamplingParams(1.0, 1.0, 16, seed=1))
    again = engine.generate(prompts, SamplingParams(1.0, 1.0, 16, seed=1))
    other = engine.generate(prompts, SamplingParams(1.0, 1.0, 16, seed=2))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]


def test_generation_stops_at_and_keeps_the_stop_token(tiny_model):
    network, tokenizer = tiny_model
    prompt = prompts_for(tokenizer, ["stop here"])[0]
    free = HFEngine(network, tokenizer, stop_token_ids=[tokenizer.eos_token_id]).generate(
        [prompt], SamplingParams(0.0, 1.0, 8)
    )[0]
    stop_at = free.token_ids[2]
    stopped = HFEngine(network, tokenizer, stop_token_ids=[stop_at]).generate([prompt], SamplingParams(0.0, 1.0, 8))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]
    assert free.finish_reason in ("stop", "length") and len(free.token_ids) <= 8


def test_prefix_cache_gives_the_same_tokens_and_logprobs(tiny_model, monkeypatch):
    network, tokenizer = tiny_model
    policy = "You are a careful phone assistant. " * 12
    prompts = prompts_for(tokenizer, [policy + "Turn on wifi.", policy + "Text Ann that I am late.", policy + "Hi"])
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=10, seed=4)
    cached_engine = HFEngine(network, tokenizer)
    cached = cached_engine.generate(prompts, params)
    assert len(cached_engine._prefix_caches) == 1
    ((adapter, prefix),) = cached_engine._prefix_caches
    assert adapter is None and len(prefix) >= 100 and all(list(prefix) == p[: len(prefix)] for p in prompts)
    again = cached_engine.generate(prompts, params)  # reuses the stored prefix
    assert len(cached_engine._prefix_caches) == 1
    assert [g.token_ids for g in again] == [g.token_ids for g in cached]
    greedy = replace(params, temperature=0.0, top_p=1.0)
    cached_greedy = cached_engine.generate(prompts, greedy)
    monkeypatch.setattr("trace_ray.engines.hf.MIN_CACHED_PREFIX", 10**9)
    plain_engine = HFEngine(network, tokenizer)
    plain = plain_engine.generate(prompts, params)
    assert not plain_engine._prefix_caches
    for with_cache, without in zip(cached, plain):
        # the random model's near-uniform distribution puts a top-p boundary anywhere: a 1e-6 difference in the
        # logits may pick another token there, so sampled runs agree token for token up to the first difference
        same = next(
            (i for i, (x, y) in enumerate(zip(with_cache.token_ids, without.token_ids)) if x != y),
            len(without.token_ids),
        )
        assert same >= 1
        assert torch.allclose(
            torch.tensor(with_cache.logprobs[:same]), torch.tensor(without.logprobs[:same]), atol=1e-4
        )
    for with_cache, without in zip(cached_greedy, plain_engine.generate(prompts, greedy)):
        assert with_cache.token_ids == without.token_ids
        assert torch.allclose(torch.tensor(with_cache.logprobs), torch.tensor(without.logprobs), atol=1e-4)


def test_a_prefix_shared_with_the_previous_whole_prompt_is_taken_from_its_kv_not_recomputed(tiny_model, monkeypatch):
    network, tokenizer = tiny_model
    policy = "You are a careful phone assistant. " * 12
    first, *rest = prompts_for(
        tokenizer, [policy + "Hi", policy + "Turn on wifi.", policy + "Text Ann that I am late."]
    )
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=8)
    engine = HFEngine(network, tokenizer)
    engine.generate([first], greedy)  # alone: prefilled whole, nothing shared yet
    widths = []
    forward = engine._forward
    monkeypatch.setattr(
        engine,
        "_forward",
        lambda store, step, names: widths.append(max(map(len, step.tokens))) or forward(store, step, names),
    )
    shared = engine.generate(rest, greedy)
    ((_, prefix),) = engine._prefix_caches
    assert len(prefix) >= 100 and max(widths) < len(prefix)  # no forward pass over the prefix itself
    plain = HFEngine(network, tokenizer, continuation_cache_tokens=0).generate(rest, greedy)
    assert [g.token_ids for g in shared] == [g.token_ids for g in plain]
    assert torch.allclose(torch.tensor(shared[0].logprobs), torch.tensor(plain[0].logprobs), atol=1e-4)


def test_rows_whose_prefixes_differ_by_a_short_tail_read_one_prefix_with_the_same_results(tiny_model):
    network, tokenizer = tiny_model
    policy = "You are a careful phone assistant. " * 12
    first, *rest = prompts_for(
        tokenizer, [policy + "Hi", policy + "Turn on wifi.", policy + "Text Ann that I am late."]
    )
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=8)
    engine = HFEngine(network, tokenizer, continuation_cache_tokens=0)
    engine.admit([Request(first, greedy, None, request_generator(None))])
    engine.step()  # the first prompt prefilled alone
    engine.admit([Request(first, greedy, None, request_generator(None))])  # its twin reads all of it but one token
    engine.admit([Request(prompt, greedy, None, request_generator(None)) for prompt in rest])  # these, less of it
    prefixes = {id(prefix): prefix for prefix in engine._store.prefixes}
    assert len(prefixes) == 1 and len(next(iter(prefixes.values())).tokens) < len(first) - 1
    finished = []
    while engine.busy:
        finished += engine.step()
    merged = {tuple(request.prompt): generation.token_ids for request, generation in finished}
    plain = HFEngine(network, tokenizer, continuation_cache_tokens=0).generate([first, *rest], greedy)
    assert [merged[tuple(prompt)] for prompt in [first, *rest]] == [g.token_ids for g in plain]


def wait_until(started, timeout_s=30):
    """Poll until ``started()`` is true (a submitted request is running)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not started():
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.001)


def test_a_request_joining_a_running_batch_generates_what_it_would_alone(tiny_model):
    network, tokenizer = tiny_model
    engine = HFEngine(network, tokenizer, stop_token_ids=[tokenizer.eos_token_id])
    long_prompt, short_prompt = prompts_for(tokenizer, ["a long task with a long answer", "hi"])
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=300)
    rows_per_step = []
    step = engine.step
    engine.step = lambda: (rows_per_step.append(len(engine._rows)), step())[1]
    running = engine.submit(long_prompt, params)
    wait_until(lambda: engine._rows)
    joining = engine.submit(short_prompt, replace(params, max_new_tokens=20))
    joined, first = joining.result(), running.result()
    assert rows_per_step[0] == 1 and max(rows_per_step) == 2 and rows_per_step[-1] == 1  # joined mid-way, left early
    alone_long = engine.generate([long_prompt], params)[0]
    alone_short = engine.generate([short_prompt], replace(params, max_new_tokens=20))[0]
    assert first.token_ids == alone_long.token_ids and joined.token_ids == alone_short.token_ids
    assert torch.allclose(torch.tensor(joined.logprobs), torch.tensor(alone_short.logprobs), atol=1e-4)
    assert engine._rows == [] and engine._store.rows == 0  # the batch is empty again


def test_close_finishes_what_was_submitted_then_stops_its_thread_and_frees_the_engine(tiny_model):
    """A process that makes engine after engine (a Ray worker playing evaluation after evaluation) must get each one's
    memory back: the loop thread of an engine never closed holds it (measured: +1.8 GiB per SmolLM2 evaluation)."""
    import gc
    import threading
    import weakref

    from trace_ray.engines.engine_loop import EngineClosedError

    network, tokenizer = tiny_model
    engine = HFEngine(network, tokenizer, stop_token_ids=[tokenizer.eos_token_id])
    (prompt,) = prompts_for(tokenizer, ["a task"])
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=40)
    pending = engine.submit(prompt, params)
    thread = engine._loop._thread
    engine.close()
    assert pending.done() and len(pending.result().token_ids) > 0  # close waited for it
    assert not thread.is_alive()
    with pytest.raises(EngineClosedError, match="make a new engine"):
        engine.submit(prompt, params)
    engine.close()  # a second close is harmless
    freed = weakref.ref(engine)
    del engine, pending
    gc.collect()
    assert freed() is None and thread not in threading.enumerate()


def test_batch_holds_at_most_max_batch_rows(tiny_model):
    network, tokenizer = tiny_model
    engine = HFEngine(network, tokenizer, max_batch_rows=2)
    seen = []
    step = engine.step
    engine.step = lambda: (seen.append(len(engine._rows)), step())[1]  # rows in each decode step
    prompts = prompts_for(tokenizer, ["one", "two", "three", "four", "five"])
    generations = engine.generate(prompts, SamplingParams(0.0, 1.0, 6))
    assert len(generations) == 5 and max(seen) == 2


def test_next_turn_reuses_the_finished_generation_cache_with_the_same_results(tiny_model):
    network, tokenizer = tiny_model
    prompt = prompts_for(tokenizer, ["Turn on wifi please"])[0]
    params = SamplingParams(temperature=0.8, top_p=1.0, max_new_tokens=12, seed=3)
    engine = HFEngine(network, tokenizer)
    [first] = engine.generate([prompt], params)
    ((adapter, kept),) = engine._continuations  # prompt + reply but its last (never fed) token
    assert adapter is None and list(kept) == prompt + first.token_ids[:-1]
    next_prompt = (
        prompt
        + first.token_ids
        + tokenizer.encode("<|im_start|>user\nThanks, and bluetooth?<|im_end|>\n<|im_start|>assistant\n")
    )
    prefills = []
    forward = engine._forward
    engine._forward = lambda store, step, names: prefills.append(len(step.tokens[0])) or forward(store, step, names)
    [second] = engine.generate([next_prompt], params)
    assert prefills[0] == len(next_prompt) - len(kept)  # only the new tokens were prefilled
    [fresh] = HFEngine(network, tokenizer, continuation_cache_tokens=0).generate([next_prompt], params)
    assert second.token_ids == fresh.token_ids
    assert torch.allclose(torch.tensor(second.logprobs), torch.tensor(fresh.logprobs), atol=1e-4)


def test_on_token_sees_every_token_in_order_and_can_end_the_generation(tiny_model):
    network, tokenizer = tiny_model
    engine = HFEngine(network, tokenizer)
    [prompt] = prompts_for(tokenizer, ["Tell me about wifi"])
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=12)
    full = engine.generate([prompt], params)[0]
    seen = []
    streamed = engine.submit(prompt, params, on_token=lambda token: seen.append(token) or True).result()
    assert seen == streamed.token_ids == full.token_ids  # a callback that wants everything changes nothing
    count = []
    ended = engine.submit(prompt, params, on_token=lambda token: count.append(token) or len(count) < 3).result()
    assert len(full.token_ids) > 3 and full.finish_reason == "length"
    assert ended.token_ids == full.token_ids[:3] and ended.finish_reason == "stop"  # ended at the token it said no to
    # a failing callback ends only its request
    broken = engine.submit(prompt, params, on_token=lambda token: 1 / 0).result()
    assert broken.token_ids == full.token_ids[:1] and broken.finish_reason == "stop"


def test_a_draft_continues_the_latest_earlier_occurrence_of_the_last_tokens():
    from trace_ray.engines.hf import draft_tokens

    assert draft_tokens([5, 1, 2, 3, 4, 9, 1, 2, 3], 3) == [4, 9, 1]
    assert draft_tokens([7, 1, 2, 8, 8, 1, 2], 2) == [8, 8]  # no earlier 3-gram: the 2-gram
    assert draft_tokens([1, 2, 3, 4], 4) == []


@pytest.mark.parametrize("temperature", [0.0, 0.05, 1.0])
def test_small_batches_verify_drafts_and_give_the_tokens_of_one_token_steps(tiny_model, monkeypatch, temperature):
    """Greedy or sampled: a draft changes how many passes the tokens take, never which tokens (each drawn with the
    row's next random number, as a one-token step draws it)."""
    network, tokenizer = tiny_model
    prompts = prompts_for(tokenizer, ["wifi wifi wifi wifi wifi wifi", "Hi"])
    params = SamplingParams(temperature=temperature, top_p=0.9, max_new_tokens=40, seed=7)
    engine = HFEngine(network, tokenizer, continuation_cache_tokens=0)
    passes = []
    forward = engine._forward
    monkeypatch.setattr(engine, "_forward", lambda store, step, names: passes.append(1) or forward(store, step, names))
    drafted = engine.generate(prompts, params)
    monkeypatch.setattr("trace_ray.engines.hf.SPECULATIVE_ROWS", 0)
    stepped = HFEngine(network, tokenizer, continuation_cache_tokens=0).generate(prompts, params)
    assert [g.token_ids for g in drafted] == [g.token_ids for g in stepped]
    assert [g.finish_reason for g in drafted] == [g.finish_reason for g in stepped]
    for with_drafts, without in zip(drafted, stepped):
        assert torch.allclose(torch.tensor(with_drafts.logprobs), torch.tensor(without.logprobs), atol=1e-4)
    if temperature < 0.1:  # the tiny random model repeats itself only when (nearly) greedy: drafts then hold
        assert len(passes) < max(len(g.token_ids) for g in drafted)  # some passes kept several tokens
