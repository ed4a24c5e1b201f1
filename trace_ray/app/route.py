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

- ``auto``: the router chosen by k-fold cross-validation on the training
  split's tasks alone (``trace_ray/routing/selection.py``): always the option
  best on average there (the fallback) unless a logit, learned or keyword
  router beats it out of fold; saved to ``DIR/router/selection.json`` (the
  folds' figures, the choice and its fitted rule), served as ``router=auto``.

Scores are tie-aware: a choice is correct when its reward equals the best
option's on the task, and a router's regret is the best reward minus its
choice's. Beside the routers, the comparators: always base, always the
fallback, the oracle. A learned router whose training labels are degenerate
(one option throughout) is reported as not trained, with the reason. Writes
``DIR/router/<router>.json`` (per task: choice, scores, oracle label,
rewards), ``DIR/router/summary.json`` and ``DIR/router/report.md``
(accuracy, routed reward, regret and the confusion matrix of each router;
the cross-validation table).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from actors.model_tasks import on_model_worker, play_options
from environments.errors import TraceRayError
from trace_ray.artifacts import atomic_path, write_json
from trace_ray.config import EnvConfig, TraceConfig
from trace_ray.console import console, print_table
from trace_ray.environment_setup import environment_maker, synthetic_env_config
from trace_ray.evaluation.played_episodes import EPISODES, load_played, option_contexts, save_played
from trace_ray.evaluation.report import ROUTING_HEADER, ROUTING_NOTE, routing_cells
from trace_ray.routing.adapters import TrainedAdapter, read_peft_folder, trained_adapters
from trace_ray.routing.auto_router import chosen_decisions, save_selection, task_features
from trace_ray.routing.learned_gate import fit_gate, gate_decisions, save_gate
from trace_ray.routing.logit_router import BASE, RouteDecision
from trace_ray.routing.lora_moe import MoERouter, fit_moe, prompt_ids, save_moe
from trace_ray.routing.offsets import fit_offsets, offset_decisions, save_offsets
from trace_ray.routing.routers import logit_router
from trace_ray.routing.selection import (
    FALLBACK,
    RoutingRow,
    TaskFeatures,
    best_choice,
    best_on_average,
    candidate_rules,
    choose,
    cross_validate,
    hidden_matrix,
    routing_metrics,
    routing_summary,
    tool_vocabulary,
)

HELP = (
    "build every router over the trained adapters, choose one by cross-validation (router=auto), score them on "
    "held-out tasks"
)


def split_seeds(env, split: str, limit: int | None) -> list[int]:
    """The first ``limit`` task seeds of ``split``; ``train`` (unbounded) needs a limit."""
    if split == "train":
        if not limit:
            raise TraceRayError("router.train_split=train has unlimited tasks; set router.train_limit")
        return [env.train_seed(index) for index in range(limit)]
    return env.task_seeds(split)[: limit or None]


def oracle_rewards(
    config: TraceConfig, adapters: list[TrainedAdapter], seeds: list[int], env: EnvConfig | None = None
) -> dict[int, dict[str, float]]:
    """Seed -> option -> greedy reward of the base model and of each adapter (on ``env``, default the target).

    The episodes are kept in ``run_dir/router/episodes.parquet``: evaluate (and a resumed route) reuse them."""
    env = env or config.env
    folders = {a.name: a.folder for a in adapters}
    path, contexts = Path(config.run_dir) / EPISODES, option_contexts(config, env, folders)
    played = play_options(config, environment_maker(env), folders, seeds, known=load_played(path, contexts, seeds))
    save_played(path, contexts, played, {"split": None, "env": env.name, "model": config.model.name})
    return {seed: {option: result.reward for option, result in results.items()} for seed, results in played.items()}


def synthetic_examples(
    config: TraceConfig, adapters: list[TrainedAdapter], names: list[str]
) -> list[tuple[list[dict], dict, str]]:
    """(first observation, option rewards, oracle label) of the first ``router.synthetic_train_tasks`` analysis tasks of
    each adapter's synthetic environment, from greedy episodes of every option there: where an adapter helps at all,
    it is on its own capability's tasks, so these give the learned routers non-base labels."""
    examples = []
    for adapter in adapters:
        env_config = synthetic_env_config(config, adapter.name)
        env = environment_maker(env_config)()
        seeds = env.task_seeds("analysis")[: config.router.synthetic_train_tasks]
        for seed, rewards in oracle_rewards(config, adapters, seeds, env_config).items():
            examples.append((list(env.reset(seed).messages), rewards, best_choice(rewards, [BASE] + names[:-1])))
    return examples


def confusion(labels: list[str], choices: list[str], names: list[str]) -> list[list[int]]:
    """Rows: oracle label; columns: the router's choice; both in ``names`` order."""
    counts = Counter(zip(labels, choices))
    return [[counts[(label, choice)] for choice in names] for label in names]


def router_summary(
    choices: list[str],
    labels: list[str],
    rewards: list[dict[str, float]],
    names: list[str],
    confidence: float,
    seed: int,
) -> dict:
    """Tie-aware accuracy, routed reward, regret (mean and bootstrap interval) and the confusion matrix against the
    oracle labels."""
    return {**routing_summary(choices, rewards, confidence, seed), "confusion": confusion(labels, choices, names)}


def matrix_markdown(names: list[str], matrix: list[list[int]]) -> list[str]:
    return [
        "| oracle \\ router | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
        *(f"| {name} | " + " | ".join(str(n) for n in row) + " |" for name, row in zip(names, matrix)),
    ]


def label_counts(labels: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in labels.items()) or "none"


def routing_rows(summary: dict) -> list[list[str]]:
    """One row per router on the held-out tasks, then the comparators (always base, the fallback, the oracle)."""
    rows = []
    for name, result in summary["routers"].items():
        label = name
        if name == "auto":
            chosen = summary["auto_chosen"]
            label = f"auto ({'always ' + summary['fallback'] if chosen == FALLBACK else chosen})"
        rows.append(
            [label, *routing_cells(result)] if "accuracy" in result else [name, "not trained", result["error"], ""]
        )
    return rows + [[name, *routing_cells(result)] for name, result in summary["comparators"].items()]


def selection_rows(selection: dict) -> list[list[str]]:
    """One row per candidate: its out-of-fold figures on the training tasks, the chosen one marked."""
    return [
        [
            name + (" (chosen)" if name == selection["chosen"] else ""),
            *routing_cells(result),
            " ".join(f"{fold['routed_reward']:.3f}" for fold in result["folds"]),
        ]
        for name, result in selection["candidates"].items()
    ]


def report_markdown(summary: dict, selection: dict) -> str:
    names, lines = summary["options"], [f"# Routing on {summary['tasks']} held-out tasks ({summary['split']})", ""]
    lines += [ROUTING_NOTE, ""]
    lines += ["| " + " | ".join(ROUTING_HEADER) + " |", "|---" * len(ROUTING_HEADER) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in routing_rows(summary)]
    lines += [
        "",
        f"training labels: {label_counts(summary['train_labels'])} (target), "
        f"{label_counts(summary['synthetic_train_labels'])} (synthetic environments)",
        "",
        f"## router=auto: {selection['folds']}-fold cross-validation on {selection['train_tasks']} "
        f"{summary['train_split']} tasks",
        "",
        f"chosen: **{selection['chosen']}** (the highest out-of-fold routed reward, if above the fallback's: "
        f"always {selection['fallback']} on all {summary['train_split']} tasks)",
        "",
        "| candidate | accuracy (ties count) | routed reward | regret | routed reward per fold |",
        "|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in selection_rows(selection)),
        "",
    ]
    for name, result in summary["routers"].items():
        if "confusion" in result:
            lines += [f"## {name}: choices against the oracle labels (ties to base)", ""]
            lines += [*matrix_markdown(names, result["confusion"]), ""]
    return "\n".join(lines)


def routing_features(config, adapters, observations, vocabulary) -> list[TaskFeatures]:
    """Every feature of every task (run on a Ray model worker): the logit router's scores, pooled hidden states,
    keywords."""
    from trace_ray.models import assigned_device, load_model

    model, tokenizer = load_model(config.model, assigned_device())
    logit = logit_router(config, model, tokenizer, adapters, calibration="content_free")
    return task_features(model, tokenizer, logit, observations, vocabulary, {"logit", "hidden", "keywords"})


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


def logit_choices(
    config, rows: list[RoutingRow], held_out: list[TaskFeatures], folder: Path
) -> dict[str, list[RouteDecision]]:
    """The logit router's decisions on ``held_out`` under each calibration (``logit``: router.calibration's); the fitted
    offsets come from the training ``rows`` and are saved in ``folder``."""
    free = [row.features.content_free for row in rows]
    rewards, labels = [row.rewards for row in rows], [row.label for row in rows]
    offsets = fit_offsets(free, rewards, labels)
    zero = {name: 0.0 for name in offsets}
    on_train = {
        name: [d.choice for d in offset_decisions(free, shift)]
        for name, shift in (("content_free", zero), ("fitted", offsets))
    }
    save_offsets(
        folder,
        offsets,
        config.model.name,
        train_split=config.router.train_split,
        train_tasks=len(rows),
        train_routed_reward={
            name: routing_metrics(picks, rewards)["routed_reward"] for name, picks in on_train.items()
        },
        train_accuracy={name: routing_metrics(picks, rewards)["accuracy"] for name, picks in on_train.items()},
    )
    held_free = [task.content_free for task in held_out]
    variants = {
        "none": offset_decisions([task.raw_logits for task in held_out], zero),
        "content_free": offset_decisions(held_free, zero),
        "fitted": offset_decisions(held_free, offsets),
    }
    decisions = {"logit": variants[config.router.calibration]}
    decisions.update(
        (LOGIT_VARIANTS[name], found) for name, found in variants.items() if name != config.router.calibration
    )
    return decisions


def learned_choices(
    config, names, training: list[RoutingRow], held_out: list[TaskFeatures], folder: Path
) -> list[RouteDecision]:
    """The learned gate fitted on ``training``'s pooled hidden states and oracle labels (saved in ``folder``), on
    ``held_out``."""
    gate = fit_gate(
        hidden_matrix([row.features for row in training]),
        [row.label for row in training],
        names,
        config.router.gate,
        config.seed,
    )
    save_gate(folder, gate, config.model.name)
    return gate_decisions(gate, hidden_matrix(held_out))


def auto_choices(
    config, names, vocabulary, rows, synthetic, held_out, folder: Path
) -> tuple[list[RouteDecision], dict]:
    """router=auto: every candidate cross-validated on the training ``rows``; the chosen one, fitted on all of them,
    saved in
    ``folder`` and applied to ``held_out``. Returns its choices and the selection's record."""
    settings = config.router.auto
    candidates = candidate_rules(names, config.router.gate, settings.ridge, settings.margin, config.seed)
    folds = min(settings.folds, len(rows))
    results = cross_validate(candidates, rows, synthetic, folds, config.seed)
    chosen = choose(results)
    rule = next(c for c in candidates if c.name == chosen).fit(rows, synthetic)
    fallback = best_on_average(rows, names)
    facts = {
        "train_split": config.router.train_split,
        "train_tasks": len(rows),
        "folds": folds,
        "fallback": fallback,
        "train_seeds": [row.seed for row in rows],
    }
    save_selection(folder, config.model.name, names, vocabulary, chosen, rule, results, **facts)
    return chosen_decisions(rule.choose(held_out), names), {"chosen": chosen, "candidates": results, **facts}


def run(config: TraceConfig) -> None:
    route(config, config.split, config.limit)


def route(config: TraceConfig, split: str, limit: int | None) -> None:
    """Fit every router on ``router.train_split`` and score it on the first ``limit`` tasks of ``split`` (all: None);
    run_dir/router/ holds the decisions, the selection and the report."""
    run_dir = Path(config.run_dir)
    if config.router.train_split == split:
        raise TraceRayError(
            f"router.train_split and split are both {split}; held-out accuracy needs two splits "
            "(e.g. analysis and eval)"
        )
    adapters = trained_adapters(run_dir)
    target = environment_maker(config.env)()
    eval_seeds = split_seeds(target, split, limit)
    train_seeds = split_seeds(target, config.router.train_split, config.router.train_limit)
    rewards = oracle_rewards(config, adapters, train_seeds + eval_seeds)
    names = [a.name for a in adapters] + [BASE]
    labels = {seed: best_choice(rewards[seed], [BASE] + names[:-1]) for seed in rewards}
    observations = {seed: list(target.reset(seed).messages) for seed in rewards}
    vocabulary = tool_vocabulary(target.reset(eval_seeds[0]).tools)
    folder = run_dir / "router"
    synthetic = synthetic_examples(config, adapters, names) if config.router.synthetic_train_tasks else []

    console.print("routers: features on a Ray model worker")
    ordered = (
        [observations[s] for s in train_seeds] + [o for o, _, _ in synthetic] + [observations[s] for s in eval_seeds]
    )
    features = on_model_worker(config, routing_features, config, adapters, ordered, vocabulary)
    rows = [RoutingRow(s, f, rewards[s], labels[s]) for s, f in zip(train_seeds, features)]
    synthetic_rows = [RoutingRow(-1, f, r, label) for (_, r, label), f in zip(synthetic, features[len(rows) :])]
    held_out = features[len(rows) + len(synthetic_rows) :]

    choices: dict[str, list[RouteDecision] | str] = logit_choices(config, rows, held_out, folder)
    try:
        choices["learned"] = learned_choices(config, names, rows + synthetic_rows, held_out, folder)
    except TraceRayError as exc:
        choices["learned"] = str(exc)
    train_observations = [observations[s] for s in train_seeds] + [o for o, _, _ in synthetic]
    try:
        choices["moe"] = on_model_worker(
            config,
            moe_decisions,
            config,
            adapters,
            train_observations,
            [row.label for row in rows + synthetic_rows],
            [observations[s] for s in eval_seeds],
            folder,
        )
    except TraceRayError as exc:
        choices["moe"] = str(exc)
    choices["auto"], selection = auto_choices(config, names, vocabulary, rows, synthetic_rows, held_out, folder)

    eval_labels, eval_rewards = [labels[s] for s in eval_seeds], [rewards[s] for s in eval_seeds]
    confidence = config.evaluate.confidence
    routers = {}
    for router, outcome in choices.items():
        if isinstance(outcome, str):
            routers[router] = {"error": outcome}
            continue
        routers[router] = router_summary(
            [d.choice for d in outcome], eval_labels, eval_rewards, names, confidence, config.seed
        )
        write_json(
            folder / router_file(router),
            {
                "router": router,
                "split": split,
                "options": names,
                **routers[router],
                "tasks": [
                    {
                        "seed": seed,
                        "choice": d.choice,
                        "scores": d.scores,
                        "probabilities": d.probabilities,
                        "oracle": label,
                        "rewards": reward,
                    }
                    for seed, d, label, reward in zip(eval_seeds, outcome, eval_labels, eval_rewards)
                ],
            },
        )
    count = len(eval_seeds)
    comparators = {
        "always base": [BASE] * count,
        f"always {selection['fallback']} (best on {config.router.train_split})": [selection["fallback"]] * count,
        "oracle": eval_labels,
    }
    summary = {
        "split": split,
        "tasks": count,
        "train_split": config.router.train_split,
        "train_tasks": len(train_seeds),
        "options": names,
        "routers": routers,
        "auto_chosen": selection["chosen"],
        "fallback": selection["fallback"],
        "comparators": {
            name: router_summary(picks, eval_labels, eval_rewards, names, confidence, config.seed)
            for name, picks in comparators.items()
        },
        "train_labels": dict(Counter(labels[s] for s in train_seeds)),
        "eval_labels": dict(Counter(eval_labels)),
        "synthetic_train_labels": dict(Counter(label for _, _, label in synthetic)),
        "base_reward": sum(r[BASE] for r in eval_rewards) / count,
        "oracle_reward": sum(max(r.values()) for r in eval_rewards) / count,
    }
    write_json(folder / "summary.json", summary)
    with atomic_path(folder / "report.md") as scratch:
        Path(scratch).write_text(report_markdown(summary, selection))
    print_table(
        f"router=auto: {selection['folds']}-fold cross-validation on {len(train_seeds)} {config.router.train_split} "
        "tasks "
        f"(chosen: {selection['chosen']})",
        ["candidate", *ROUTING_HEADER[1:], "per fold"],
        selection_rows(selection),
    )
    print_table(
        f"routers on {count} held-out {config.env.name}/{split} tasks (trained on {len(train_seeds)} "
        f"{config.router.train_split} tasks)",
        ROUTING_HEADER,
        routing_rows(summary),
    )
    console.print(f"per-task decisions, router/selection.json and the report: {folder}")
