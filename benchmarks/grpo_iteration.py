"""One GRPO iteration: ours against TRL's ``GRPOTrainer``, on the same model, adapter and work, on CPU.

Both sides take G groups of K completions of single-turn prompts per
iteration and one optimizer step on them, with the same model, LoRA settings
(``peft_settings``), group size, number of prompts, token budget
(max new tokens), learning rate, sampling temperature (top_p 1), clip range,
no KL (beta 0) and the same reward function:

  (ours) the pieces of ``trace-ray train`` without Ray Train's startup: the HF
         engine (``make_engine``) generates the G x K completions with the
         adapter it was last synced (rollout s, with the rewards and
         ``training_rows``); ``update()`` of ``trace_ray/training/grpo_iteration.py``
         trains the ``trainable_model`` PEFT policy, one minibatch of G*K
         trajectories (update s); ``engine.load_adapter`` takes the new weights
         (sync s). Groups with equal rewards are dropped, as in training.
  (TRL)  ``trl.GRPOTrainer``: G*K completions generated at once, trained in
         micro-batches of ``--trl-micro-batch`` with gradient accumulation to one
         optimizer step (default: all at once; 4 on the device workload),
         num_generations = K, max_completion_length = the token budget, loss_type "grpo" (token
         mean per completion, then mean over completions, like ours), no
         gradient checkpointing, fp32. Its step is timed by a callback; the part
         spent in ``_generate_and_score_completions`` (generation, rewards,
         advantages) is its rollout s, the rest its update s. It generates with
         the policy itself, so it has no sync.

Prompts (iteration i takes prompts i*G..i*G+G-1 of the device environment's
training tasks on both sides), ``--workload``:

  short   the task's user request alone, chat-templated by the model's tokenizer
          (TRL gets the conversation and applies the same template);
  device  the agent's real first-turn prompt, as collection and training render
          it (``AgentPrompt``: the policy, one line per tool, the worked example,
          the request; ~800 tokens on SmolLM2); TRL gets its text. Rewards, computed on the completion text:
``--reward length`` (default) its character count / 100: K completions
almost never all have the same length, so every group is informative and
ours, which drops groups with equal rewards, trains on as many completions as
TRL (which trains on all); ``--reward parity`` 1 if the character count is
even, else 0; ``--reward tool`` 1 if it names the tool of the task's oracle
first call. With binary rewards and small K some groups are constant: ours
then skips them and the comparison says so.

One untimed warm-up iteration per side, then the mean of ``--iterations``.
Prints rollout/update/sync/total seconds and generated tokens per second of
the iteration, the update's ratio TRL s / ours s, and last the whole
iteration's ``ratio TRL/ours`` (targets on the device workload: >= 5 for the
update, >= 3 for the iteration).

    python benchmarks/grpo_iteration.py [--workload short|device] [--model smollm2_135m|tiny_random] [--group-size 8]
        [--groups 4] [--max-new-tokens 64] [--iterations 2] [--lora-rank 16] [--lr 1e-5] [--reward length|parity|tool]

Needs TRL: ``pip install -e '.[bench]'`` or ``make install-bench``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import torch

from trace_ray.config import TraceConfig
from trace_ray.config_compose import compose_config
from trace_ray.console import print_table

TRL_MISSING = "grpo_iteration: error: TRL is not installed; run: pip install -e '.[bench]' (or: make install-bench)"
ADAPTER = "bench"


@dataclass
class IterationTimes:
    rollout_s: float = 0.0  # generation, rewards, advantages / training rows
    update_s: float = 0.0  # forward, backward, optimizer step
    sync_s: float = 0.0  # new adapter weights into the generating engine
    tokens: float = 0  # completion tokens generated
    trained: float = 0  # completions the update trained on

    @property
    def total_s(self) -> float:
        return self.rollout_s + self.update_s + self.sync_s

    @staticmethod
    def mean(times: list[IterationTimes]) -> IterationTimes:
        return IterationTimes(
            *(
                statistics.fmean(getattr(t, name) for t in times)
                for name in ("rollout_s", "update_s", "sync_s", "tokens", "trained")
            )
        )


@dataclass
class Prompt:
    ids: list[int]  # our prompt's token ids
    trl_prompt: list[dict] | str  # the same prompt for TRL: the conversation (short) or the rendered text (device)
    tool: str  # the tool of the task's oracle first call ("" when it starts with text)


def device_prompts(count: int, workload: str, config: TraceConfig) -> list[Prompt]:
    """The prompts of the device environment's first ``count`` training tasks (see the module docstring)."""
    from environments.device.environment import DeviceEnvironment
    from trace_ray.agent_prompt import AgentPrompt
    from trace_ray.models import load_tokenizer

    tokenizer = load_tokenizer(config.model)
    agent_prompt = AgentPrompt.for_model(config.model, tokenizer)
    env, prompts = DeviceEnvironment(), []
    for index in range(count):
        reset = env.reset(env.train_seed(index))
        calls = env.oracle_message().get("tool_calls") or []
        tool = calls[0]["function"]["name"] if calls else ""
        if workload == "device":
            ids = agent_prompt.prompt_ids(reset.messages, reset.tools, env.example_exchange())
            prompts.append(Prompt(ids, tokenizer.decode(ids), tool))
        else:
            user = next(message for message in reset.messages if message["role"] == "user")
            messages = [{"role": "user", "content": user["content"]}]
            prompts.append(Prompt(chat_ids(tokenizer, messages), messages, tool))
    return prompts


def reward(kind: str, text: str, tool: str) -> float:
    """The reward of one completion's text, the same on both sides."""
    if kind == "tool":
        return float(bool(tool) and tool in text)
    if kind == "parity":
        return float(len(text) % 2 == 0)
    return len(text) / 100


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


# -- ours ----------------------------------------------------------------------------------------
def our_rollouts(engine, tokenizer, batch: list[Prompt], config: TraceConfig, version: int, iteration: int, kind: str):
    """G groups of K completions with adapter ``version``, as EpisodeResults (what ``training_rows`` takes)."""
    from trace_ray.engines import SamplingParams
    from trace_ray.rollout_loop import EpisodeResult, episode_seed
    from trace_ray.trajectory import TokenRecord

    grpo = config.grpo
    jobs = []
    for g, prompt in enumerate(batch):
        ids = prompt.ids
        for k in range(grpo.group_size):
            key = f"{ADAPTER}-{iteration}-{g}#{k}"
            params = SamplingParams(
                grpo.temperature, 1.0, config.model.sampling.max_new_tokens, episode_seed(config.seed, key, 0)
            )
            jobs.append((key, g, k, prompt, ids, engine.submit(ids, params, (ADAPTER, version))))
    results = []
    for key, g, k, prompt, ids, future in jobs:
        generation = future.result()
        record = TokenRecord()
        record.add_observation(ids)
        record.add_action(generation.token_ids, generation.logprobs)
        text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        results.append(
            EpisodeResult(
                key=key,
                task_id=str(g),
                family="bench",
                seed=g,
                sample_index=k,
                adapter=(ADAPTER, version),
                reward=reward(kind, text, prompt.tool),
                success=False,
                turns=1,
                termination=generation.finish_reason,
                messages=[{"role": "assistant", "content": text}],
                tools=[],
                record=record,
            )
        )
    size = grpo.group_size
    return [results[i : i + size] for i in range(0, len(results), size)]


def run_ours(config: TraceConfig, prompts: list[Prompt], iterations: int, kind: str) -> list[IterationTimes]:
    """Warm-up plus ``iterations`` iterations of rollout -> rows -> update() -> load_adapter; the timed ones."""
    from trace_ray.engines import make_engine
    from trace_ray.training.action_logprobs import ActionLogprobs
    from trace_ray.training.groups import training_rows
    from trace_ray.training.grpo_iteration import update
    from trace_ray.training.lora_model import adapter_weights, lora_parameters, peft_settings, trainable_model

    grpo = config.grpo
    engine = make_engine(config.model, config.engine)
    policy, tokenizer = trainable_model(config.model, config.lora, config.seed)
    optimizer = torch.optim.AdamW(lora_parameters(policy), lr=grpo.lr, weight_decay=grpo.weight_decay)
    scorer = ActionLogprobs(policy, grpo.temperature, config.trainer.gradient_checkpointing)
    lora_config = peft_settings(config.lora)
    engine.load_adapter(ADAPTER, 0, adapter_weights(policy), lora_config)  # version 0, before training starts
    times = []
    for iteration in range(iterations + 1):  # iteration 0: the warm-up
        batch = prompts[iteration * grpo.groups_per_batch : (iteration + 1) * grpo.groups_per_batch]
        started = time.perf_counter()
        groups = our_rollouts(engine, tokenizer, batch, config, iteration, iteration, kind)
        rows = training_rows(groups, grpo.advantage, grpo.advantage_eps, grpo.max_tokens_per_trajectory)
        rolled = time.perf_counter()
        if rows:
            generator = torch.Generator().manual_seed(config.seed * 1_000_003 + iteration)
            update(scorer, policy, optimizer, rows, grpo, generator)
        updated = time.perf_counter()
        engine.load_adapter(ADAPTER, iteration + 1, adapter_weights(policy), lora_config)
        synced = time.perf_counter()
        tokens = sum(result.record.action_tokens for group in groups for result in group)
        step = IterationTimes(rolled - started, updated - rolled, synced - updated, tokens, len(rows))
        print(f"  ours iteration {iteration}{' (warm-up)' if iteration == 0 else ''}: {step.total_s:.2f} s", flush=True)
        if iteration:
            times.append(step)
    return times


# -- TRL -----------------------------------------------------------------------------------------
def trl_settings(config: TraceConfig, iterations: int, output_dir: str, micro_batch: int):
    """GRPOConfig (trl 1.16) matching ours: one optimizer step on G*K completions per iteration."""
    from trl import GRPOConfig

    grpo = config.grpo
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        fp16=False,  # bf16 defaults to True in TRL's configs
        gradient_checkpointing=False,  # TRL's default is True; ours does not checkpoint
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=grpo.groups_per_batch * grpo.group_size // micro_batch,
        num_generations=grpo.group_size,
        max_completion_length=config.model.sampling.max_new_tokens,
        temperature=grpo.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=grpo.lr,
        lr_scheduler_type="constant",
        weight_decay=grpo.weight_decay,
        max_grad_norm=grpo.max_grad_norm,
        beta=0.0,
        num_iterations=1,
        loss_type="grpo",
        scale_rewards="group",
        epsilon=grpo.clip_eps,
        epsilon_high=grpo.clip_eps_high,
        max_steps=iterations + 1,
        shuffle_dataset=False,
        use_vllm=False,
        seed=config.seed,
        logging_strategy="no",
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
    )


def completion_text(completion) -> str:
    """A TRL completion: text, or (conversational prompts) a list of messages."""
    return (
        completion if isinstance(completion, str) else "".join(message.get("content") or "" for message in completion)
    )


def run_trl(
    config: TraceConfig, prompts: list[Prompt], iterations: int, kind: str, micro_batch: int
) -> list[IterationTimes]:
    """Warm-up plus ``iterations`` GRPOTrainer steps; the timed ones."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from trace_ray.models import load_model
    from trace_ray.training.lora_model import peft_settings

    model, tokenizer = load_model(config.model)
    dataset = Dataset.from_list([{"prompt": prompt.trl_prompt, "tool": prompt.tool} for prompt in prompts])

    def bench_reward(completions, tool, **_):
        return [reward(kind, completion_text(completion), name) for completion, name in zip(completions, tool)]

    steps: list[IterationTimes] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()
            steps.append(IterationTimes())

        def on_step_end(self, args, state, control, **kwargs):
            step = steps[-1]
            step.update_s = time.perf_counter() - self.started - step.rollout_s
            print(
                f"  TRL step {len(steps) - 1}{' (warm-up)' if len(steps) == 1 else ''}: {step.total_s:.2f} s",
                flush=True,
            )

    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as output_dir:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=bench_reward,
            args=trl_settings(config, iterations, output_dir, micro_batch),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=LoraConfig(**peft_settings(config.lora)),
            callbacks=[StepTimer()],
        )
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-training metrics even with logging off
        generate_and_score = trainer._generate_and_score_completions

        def timed_generate_and_score(inputs):
            started = time.perf_counter()
            output = generate_and_score(inputs)
            steps[-1].rollout_s += time.perf_counter() - started
            steps[-1].tokens += int(output["completion_mask"].sum())
            steps[-1].trained += int(output["completion_mask"].shape[0])
            return output

        trainer._generate_and_score_completions = timed_generate_and_score
        trainer.train()
    return steps[1:]


# -- the comparison ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workload", default="short", choices=["short", "device"], help="the prompts (see the docstring)"
    )
    parser.add_argument("--model", default="smollm2_135m", choices=["smollm2_135m", "tiny_random"])
    parser.add_argument("--group-size", type=int, default=8, help="K completions per prompt (>= 2)")
    parser.add_argument("--groups", type=int, default=4, help="G prompts per iteration")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="token budget per completion")
    parser.add_argument("--iterations", type=int, default=2, help="timed iterations after one warm-up")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: grpo.lr of conf/grpo)")
    parser.add_argument("--reward", default="length", choices=["length", "parity", "tool"])
    parser.add_argument(
        "--trl-micro-batch",
        type=int,
        default=None,
        help="completions per TRL forward/backward (gradient accumulation to one step; default: all at "
        "once, "
        "4 on the device workload, whose 32 x 860-token batch does not fit 24 GiB at once)",
    )
    args = parser.parse_args(argv)
    if args.trl_micro_batch is None:
        args.trl_micro_batch = 4 if args.workload == "device" else args.groups * args.group_size
    if args.group_size < 2:
        parser.error("--group-size must be at least 2 (GRPO needs two completions per prompt)")
    if min(args.groups, args.max_new_tokens, args.iterations, args.lora_rank) < 1:
        parser.error("--groups, --max-new-tokens, --iterations and --lora-rank must be at least 1")
    if args.trl_micro_batch < 1 or (args.groups * args.group_size) % args.trl_micro_batch:
        parser.error("--trl-micro-batch must divide --groups x --group-size")
    return args


def bench_config(args: argparse.Namespace) -> TraceConfig:
    overrides = [
        f"model={args.model}",
        f"lora.rank={args.lora_rank}",
        f"model.sampling.max_new_tokens={args.max_new_tokens}",
        f"grpo.group_size={args.group_size}",
        f"grpo.groups_per_batch={args.groups}",
        f"grpo.mini_batch_size={args.groups * args.group_size}",
        "grpo.ppo_epochs=1",
        "grpo.kl_coef=0",
    ]
    if args.lr is not None:
        overrides.append(f"grpo.lr={args.lr}")
    return compose_config("train", overrides)


def table_row(side: str, times: IterationTimes, has_sync: bool) -> tuple:
    return (
        side,
        f"{times.rollout_s:.2f}",
        f"{times.update_s:.2f}",
        f"{times.sync_s:.3f}" if has_sync else "-",
        f"{times.total_s:.2f}",
        f"{times.tokens / times.total_s:.1f}" if times.total_s > 0 else "-",
    )


def main(argv: list[str] | None = None) -> None:
    if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
        sys.exit(TRL_MISSING)
    # known, harmless: TRL's check of the installed vLLM (unused here), PEFT's note when the engine retires an adapter
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
    warnings.filterwarnings("ignore", message="Adapter adapter.* was active which is now deleted")
    import trl

    args = parse_args(argv)
    config = bench_config(args)
    grpo, lora = config.grpo, config.lora
    prompts = device_prompts(grpo.groups_per_batch * (args.iterations + 1), args.workload, config)
    print(
        f"settings: workload={args.workload} ({statistics.fmean(len(prompt.ids) for prompt in prompts):.0f} prompt "
        "tokens on average), "
        f"model={config.model.name}, {grpo.groups_per_batch} prompts x {grpo.group_size} completions, "
        f"max_new_tokens={config.model.sampling.max_new_tokens}, temperature={grpo.temperature}, top_p=1, "
        f"LoRA rank {lora.rank} alpha {lora.alpha:g} on {','.join(lora.target_modules)}, lr={grpo.lr:g}, "
        f"clip {grpo.clip_eps}, no KL, one optimizer step per iteration, reward={args.reward}, "
        f"1 warm-up + {args.iterations} timed iterations, CPU, {torch.get_num_threads()} torch threads, trl "
        f"{trl.__version__}",
        flush=True,
    )
    ours = IterationTimes.mean(run_ours(config, prompts, args.iterations, args.reward))
    gc.collect()
    theirs = IterationTimes.mean(run_trl(config, prompts, args.iterations, args.reward, args.trl_micro_batch))
    print(
        "ours = HF engine + training_rows + update() + engine.load_adapter; TRL = GRPOTrainer (generate, score, step)"
    )
    print_table(
        f"one GRPO iteration (mean of {args.iterations}): {grpo.groups_per_batch}x{grpo.group_size} completions, "
        f"{config.model.name}, max_new_tokens={config.model.sampling.max_new_tokens}",
        ["side", "rollout s", "update s", "sync s", "total s", "tokens/s"],
        [table_row("ours", ours, True), table_row("TRL", theirs, False)],
    )
    print(
        f"tokens/s: generated completion tokens per second of the whole iteration "
        f"(ours {ours.tokens:.0f}, TRL {theirs.tokens:.0f} tokens per iteration)"
    )
    print(
        f"completions trained per iteration: ours {ours.trained:.1f} (groups with equal rewards are dropped), TRL "
        f"{theirs.trained:.1f}"
    )
    if ours.trained < theirs.trained:
        print(
            "note: ours skipped constant groups that TRL trained on, so its update did less work; "
            "use --reward length or a larger --group-size for equal work"
        )
    print("sync: ours loads the new adapter into its engine; TRL generates with the policy itself (no sync)")
    update_ratio = theirs.update_s / ours.update_s
    ratio = theirs.total_s / ours.total_s
    targets = (5.0, 3.0) if args.workload == "device" else (1.0, 1.0)
    print(
        f"update ratio TRL/ours = {update_ratio:.2f} (target >= {targets[0]:g}: "
        f"{'met' if update_ratio >= targets[0] else 'NOT met'})"
    )
    print(f"iteration target >= {targets[1]:g}: {'met' if ratio >= targets[1] else 'NOT met'}")
    print(f"ratio TRL/ours = {ratio:.2f}")


if __name__ == "__main__":
    main()
