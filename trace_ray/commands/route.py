"""``trace-ray route run_dir=DIR``: build every router over the trained adapters and score it against oracle labels.

Oracle labels: every task is played greedily with the base model and with
each trained adapter; the label is whichever scored best (ties go to the
base). Tasks of ``router.train_split`` (default ``analysis``) train the
learned routers; tasks of ``split`` (default ``eval``) are held out, and
every router is scored on them:

- ``logit``: the paper's training-free router (``trace_ray/routing/logit_router.py``), with
  ``router.calibration`` (content-free by default); the other calibrations are
  scored beside it from the same forward passes: ``logit (uncalibrated)`` (the
  paper's raw logits), ``logit (content-free)`` and ``logit (fitted)``, whose
  per-option offsets are fitted here on the training split's target tasks
  (``trace_ray/routing/offsets.py``) and saved to ``DIR/router/logit_offsets.json``;
- ``learned``: one gate over pooled hidden states (``trace_ray/routing/learned_gate.py``),
  saved to ``DIR/router/learned_gate.*``;
- ``moe``: the LoRA mixture-of-experts, a gate at every adapted layer
  (``trace_ray/routing/lora_moe.py``), saved to ``DIR/router/moe/``; its
  choice for a task is the option most of its layers pick at the prompt's
  last token.

A learned router whose training labels are degenerate (one option
throughout) is reported as not trained, with the reason. Writes
``DIR/router/<router>.json`` (per task: choice, scores, oracle label,
rewards), ``DIR/router/summary.json`` and ``DIR/router/report.md``
(accuracy, routed reward and the confusion matrix of each router).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from trace_ray.artifacts import atomic_path, write_json
from trace_ray.config import EnvConfig, TraceConfig
from trace_ray.console import console, print_table
from trace_ray.environment_setup import environment_maker, synthetic_env_config
from trace_ray.errors import TraceRayError
from trace_ray.evaluation.option_rollouts import best_choice, play_options
from trace_ray.evaluation.played_episodes import EPISODES, load_played, option_contexts, save_played
from trace_ray.routing.adapters import TrainedAdapter, read_peft_folder, trained_adapters
from trace_ray.routing.learned_gate import fit_gate, gate_decisions, pooled_features, save_gate
from trace_ray.routing.logit_router import BASE, RouteDecision
from trace_ray.routing.lora_moe import MoERouter, fit_moe, prompt_ids, save_moe
from trace_ray.routing.offsets import fit_offsets, offset_decisions, save_offsets
from trace_ray.routing.routers import logit_router

HELP = "build the logit and learned routers over the trained adapters; accuracy and confusion matrices against oracle labels"


def split_seeds(env, split: str, limit: int | None) -> list[int]:
    """The first ``limit`` task seeds of ``split``; ``train`` (unbounded) needs a limit."""
    if split == "train":
        if not limit:
            raise TraceRayError("router.train_split=train has unlimited tasks; set router.train_limit")
        return [env.train_seed(index) for index in range(limit)]
    return env.task_seeds(split)[: limit or None]


def oracle_rewards(config: TraceConfig, adapters: list[TrainedAdapter], seeds: list[int], env: EnvConfig | None = None) -> dict[int, dict[str, float]]:
    """Seed -> option -> greedy reward of the base model and of each adapter (on ``env``, default the target).

    The episodes are kept in ``run_dir/router/episodes.parquet``: evaluate (and a resumed route) reuse them."""
    env = env or config.env
    folders = {a.name: a.folder for a in adapters}
    path, contexts = Path(config.run_dir) / EPISODES, option_contexts(config, env, folders)
    played = play_options(config, environment_maker(env), folders, seeds, known=load_played(path, contexts, seeds))
    save_played(path, contexts, played, {"split": None, "env": env.name, "model": config.model.name})
    return {seed: {option: result.reward for option, result in results.items()} for seed, results in played.items()}


def synthetic_examples(config: TraceConfig, adapters: list[TrainedAdapter], names: list[str]) -> list[tuple[list[dict], str]]:
    """(first observation, oracle label) of the first ``router.synthetic_train_tasks`` analysis tasks of each adapter's
    synthetic environment, labelled like the target's tasks from greedy episodes of every option there: where an
    adapter helps at all, it is on its own capability's tasks, so these give the learned routers non-base labels."""
    examples = []
    for adapter in adapters:
        env_config = synthetic_env_config(config, adapter.name)
        env = environment_maker(env_config)()
        seeds = env.task_seeds("analysis")[: config.router.synthetic_train_tasks]
        for seed, rewards in oracle_rewards(config, adapters, seeds, env_config).items():
            examples.append((list(env.reset(seed).messages), best_choice(rewards, [BASE] + names[:-1])))
    return examples


def confusion(labels: list[str], choices: list[str], names: list[str]) -> list[list[int]]:
    """Rows: oracle label; columns: the router's choice; both in ``names`` order."""
    counts = Counter(zip(labels, choices))
    return [[counts[(label, choice)] for choice in names] for label in names]


def router_summary(decisions: list[RouteDecision], labels: list[str], rewards: list[dict[str, float]], names: list[str]) -> dict:
    """Accuracy against the oracle labels, the mean reward of the chosen options, and the confusion matrix."""
    choices = [decision.choice for decision in decisions]
    return {
        "accuracy": sum(label == choice for label, choice in zip(labels, choices)) / len(labels),
        "routed_reward": sum(reward[choice] for reward, choice in zip(rewards, choices)) / len(labels),
        "confusion": confusion(labels, choices, names),
    }


def matrix_markdown(names: list[str], matrix: list[list[int]]) -> list[str]:
    return [
        "| oracle \\ router | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|",
        *(f"| {name} | " + " | ".join(str(n) for n in row) + " |" for name, row in zip(names, matrix)),
    ]


def label_counts(labels: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in labels.items()) or "none"


def report_markdown(summary: dict) -> str:
    names, lines = summary["options"], [f"# Routing on {summary['tasks']} held-out tasks ({summary['split']})", ""]
    lines += ["| router | accuracy | routed reward |", "|---|---|---|"]
    for name, result in summary["routers"].items():
        if "accuracy" in result:
            lines.append(f"| {name} | {result['accuracy']:.3f} | {result['routed_reward']:.3f} |")
        else:
            lines.append(f"| {name} | not trained: {result['error']} | |")
    lines += [f"| always base | {summary['base_accuracy']:.3f} | {summary['base_reward']:.3f} |"]
    lines += [f"| oracle | 1.000 | {summary['oracle_reward']:.3f} |", ""]
    lines += [
        f"training labels: {label_counts(summary['train_labels'])} (target), "
        f"{label_counts(summary['synthetic_train_labels'])} (synthetic environments)", "",
    ]
    for name, result in summary["routers"].items():
        if "confusion" in result:
            lines += [f"## {name} router accuracy against the oracle labels: {result['accuracy']:.3f}", ""]
            lines += [*matrix_markdown(names, result["confusion"]), ""]
    return "\n".join(lines)


def learned_decisions(config, model, tokenizer, names, train_observations, train_labels, eval_observations, folder: Path):
    gate = fit_gate(pooled_features(model, tokenizer, train_observations), train_labels, names, config.router.gate, config.seed)
    save_gate(folder, gate, config.model.name)
    return gate_decisions(gate, pooled_features(model, tokenizer, eval_observations))


def moe_decisions(config, adapters, train_observations, train_labels, eval_observations, folder: Path):
    from trace_ray.models import assigned_device, load_model

    network, tokenizer = load_model(config.model, assigned_device())  # a second copy: the gates are built into it
    weights = {a.name: read_peft_folder(a.folder) for a in adapters}
    examples = [prompt_ids(tokenizer, observation) for observation in train_observations]
    moe = fit_moe(network, tokenizer, weights, examples, train_labels, config.router.moe, config.seed)
    save_moe(folder / "moe", moe, {a.name: str(a.folder) for a in adapters})
    return MoERouter(moe, tokenizer).route_many(eval_observations)


LOGIT_VARIANTS = {"none": "logit (uncalibrated)", "content_free": "logit (content-free)", "fitted": "logit (fitted)"}


def router_file(router: str) -> str:
    """``logit (content-free)`` -> ``logit_content_free.json``."""
    return router.replace(" (", "_").replace(")", "").replace("-", "_").replace(" ", "_") + ".json"


def logit_decisions(config, model, tokenizer, adapters, target_train, eval_observations, folder: Path) -> dict:
    """The logit router under each calibration (``logit``: router.calibration's), from one forward pass per task;
    the fitted offsets come from the target's training tasks (``target_train``: observations, per-option rewards,
    oracle labels) and are saved in ``folder``."""
    logit = logit_router(config, model, tokenizer, adapters, calibration="content_free")
    observations, rewards, labels = target_train

    def score_rows(table):
        return [dict(zip(logit.names, row.tolist())) for row in table]

    raw = logit.raw_label_logits(eval_observations)
    free = score_rows(logit.scores(eval_observations, raw))
    train_free = score_rows(logit.scores(observations, logit.raw_label_logits(observations)))
    offsets, zero = fit_offsets(train_free, rewards, labels), {name: 0.0 for name in logit.names}
    on_train = {name: [d.choice for d in offset_decisions(train_free, shift)] for name, shift in (("content_free", zero), ("fitted", offsets))}
    save_offsets(
        folder, offsets, config.model.name, train_split=config.router.train_split, train_tasks=len(observations),
        train_routed_reward={name: sum(r[c] for r, c in zip(rewards, picks)) / len(picks) for name, picks in on_train.items()},
        train_accuracy={name: sum(c == label for c, label in zip(picks, labels)) / len(picks) for name, picks in on_train.items()},
    )
    variants = {
        "none": offset_decisions(score_rows(raw), zero),
        "content_free": offset_decisions(free, zero),
        "fitted": offset_decisions(free, offsets),
    }
    decisions = {"logit": variants[config.router.calibration]}
    decisions.update((LOGIT_VARIANTS[name], found) for name, found in variants.items() if name != config.router.calibration)
    return decisions


def router_decisions(config, adapters, names, target_train, train_observations, train_labels, eval_observations, folder: Path) -> dict:
    """Router name -> its decision per held-out task, or why it was not trained (run on a Ray model worker: the
    logit router's scores and offsets, the learned gate's and the MoE's training)."""
    from trace_ray.models import assigned_device, load_model

    model, tokenizer = load_model(config.model, assigned_device())
    decisions: dict[str, list[RouteDecision] | str] = logit_decisions(config, model, tokenizer, adapters, target_train, eval_observations, folder)
    try:
        decisions["learned"] = learned_decisions(config, model, tokenizer, names, train_observations, train_labels, eval_observations, folder)
    except TraceRayError as exc:
        decisions["learned"] = str(exc)
    try:
        decisions["moe"] = moe_decisions(config, adapters, train_observations, train_labels, eval_observations, folder)
    except TraceRayError as exc:
        decisions["moe"] = str(exc)
    return decisions


def run(config: TraceConfig) -> None:
    from actors.model_tasks import on_model_worker

    run_dir = Path(config.run_dir)
    if config.router.train_split == config.split:
        raise TraceRayError(f"router.train_split and split are both {config.split}; held-out accuracy needs two splits (e.g. analysis and eval)")
    adapters = trained_adapters(run_dir)
    target = environment_maker(config.env)()
    eval_seeds = split_seeds(target, config.split, config.limit)
    train_seeds = split_seeds(target, config.router.train_split, config.router.train_limit)
    rewards = oracle_rewards(config, adapters, train_seeds + eval_seeds)
    names = [a.name for a in adapters] + [BASE]
    labels = {seed: best_choice(rewards[seed], [BASE] + names[:-1]) for seed in rewards}
    observations = {seed: list(target.reset(seed).messages) for seed in rewards}
    eval_observations, eval_labels = [observations[s] for s in eval_seeds], [labels[s] for s in eval_seeds]
    eval_rewards = [rewards[s] for s in eval_seeds]
    folder = run_dir / "router"
    synthetic = synthetic_examples(config, adapters, names) if config.router.synthetic_train_tasks else []
    train_observations = [observations[s] for s in train_seeds] + [observation for observation, _ in synthetic]
    train_labels = [labels[s] for s in train_seeds] + [label for _, label in synthetic]

    console.print("routers: scores and training on a Ray model worker")
    target_train = ([observations[s] for s in train_seeds], [rewards[s] for s in train_seeds], [labels[s] for s in train_seeds])
    decisions = on_model_worker(config, router_decisions, config, adapters, names, target_train, train_observations, train_labels,
                                eval_observations, folder)

    routers = {}
    for router, outcome in decisions.items():
        if isinstance(outcome, str):
            routers[router] = {"error": outcome}
            continue
        routers[router] = router_summary(outcome, eval_labels, eval_rewards, names)
        write_json(folder / router_file(router), {
            "router": router, "split": config.split, "options": names, **routers[router],
            "tasks": [
                {"seed": seed, "choice": d.choice, "scores": d.scores, "probabilities": d.probabilities, "oracle": label, "rewards": reward}
                for seed, d, label, reward in zip(eval_seeds, outcome, eval_labels, eval_rewards)
            ],
        })
    count = len(eval_seeds)
    summary = {
        "split": config.split, "tasks": count, "train_split": config.router.train_split, "train_tasks": len(train_seeds),
        "options": names, "routers": routers,
        "train_labels": dict(Counter(labels[s] for s in train_seeds)), "eval_labels": dict(Counter(eval_labels)),
        "synthetic_train_labels": dict(Counter(label for _, label in synthetic)),
        "base_accuracy": eval_labels.count(BASE) / count, "base_reward": sum(r[BASE] for r in eval_rewards) / count,
        "oracle_reward": sum(max(r.values()) for r in eval_rewards) / count,
    }
    write_json(folder / "summary.json", summary)
    with atomic_path(folder / "report.md") as scratch:
        Path(scratch).write_text(report_markdown(summary))
    rows = [
        (name, f"{r['accuracy']:.3f}", f"{r['routed_reward']:.3f}") if "accuracy" in r else (name, "not trained", r["error"])
        for name, r in routers.items()
    ]
    rows += [("always base", f"{summary['base_accuracy']:.3f}", f"{summary['base_reward']:.3f}"), ("oracle", "1.000", f"{summary['oracle_reward']:.3f}")]
    print_table(
        f"routers on {count} held-out {config.env.name}/{config.split} tasks (trained on {len(train_seeds)} {config.router.train_split} tasks)",
        ["router", "accuracy", "routed reward"], rows,
    )
    for router, result in routers.items():
        if "confusion" in result:
            print_table(f"{router} router (rows: oracle label, columns: choice)", ["oracle \\ router", *names],
                        [(name, *(str(n) for n in row)) for name, row in zip(names, result["confusion"])])
    console.print(f"per-task decisions and the report: {folder}")
