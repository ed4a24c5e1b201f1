"""``trace-ray evaluate run_dir=DIR``: did the agent get better? Every method on the held-out split, greedy.

Methods, all on the same tasks of ``split`` (default ``eval``) with the same
turn limits:

- ``base``: the base model alone;
- ``adapter:<name>``: each capability adapter on every task;
- ``TRACE (logit)``, ``TRACE (learned)``, ``TRACE (auto)`` (the router ``trace-ray route``
  chose by cross-validation): the router picks one adapter (or
  the base) per task from its first observation; with greedy decoding the
  task then plays exactly as that option's episode, so it is scored from it;
- ``TRACE (moe)``: the LoRA mixture-of-experts trained by ``trace-ray route``
  plays every task itself on the HF engine (its gates mix adapters per token);
- ``oracle router``: the best option per task (an upper bound of routing);
- ``GRPO on target``: one LoRA trained on the target itself
  (``evaluate.grpo_baseline``, trained by ``trace-ray train train_on=env``);
- ``prompt injection``: the base model with the selected capabilities'
  descriptions added to the system prompt.

Each method is compared, paired by task, with ``base``; each TRACE method also
with ``GRPO on target`` and with the best single adapter (highest mean reward
of the ``adapter:<name>`` methods); every p-value also comes Holm-adjusted over
all of the report's paired comparisons.

Writes ``DIR/eval/report.json``, ``report.md`` (the table first),
``episodes.parquet`` (every episode a method played itself: messages, reward,
milestones), ``transcripts.md`` (per method, the tasks where it beats the
base, both conversations in brief: a gain must survive a reading) and PNG
plots (methods with intervals, training reward curves; identification drew
Cov vs Delta in ``DIR/capabilities/cov_vs_delta.png``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from actors.model_tasks import on_model_worker, play_options
from environments.errors import TraceRayError
from trace_ray.artifacts import atomic_path, write_json
from trace_ray.capabilities.selection_file import read_selection
from trace_ray.config import TraceConfig
from trace_ray.console import console, print_table
from trace_ray.environment_setup import environment_maker
from trace_ray.evaluation.played_episodes import EPISODES, load_played, option_contexts
from trace_ray.evaluation.plots import plot_methods, plot_reward_curves
from trace_ray.evaluation.prompt_injection import capability_note, with_system_note
from trace_ray.evaluation.report import (
    COMPARISON_HEADER,
    GRPO_METHOD,
    ROUTING_HEADER,
    TABLE_HEADER,
    MethodScores,
    comparison_rows,
    evaluation_report,
    report_markdown,
    routing_cells,
    table_rows,
)
from trace_ray.evaluation.transcripts import write_episodes, write_predictions, write_wins
from trace_ray.rollout_loop import EpisodeResult
from trace_ray.routing.adapters import TrainedAdapter, trained_adapters
from trace_ray.routing.learned_gate import LearnedRouter, load_gate
from trace_ray.routing.logit_router import BASE
from trace_ray.routing.lora_moe import moe_engine
from trace_ray.routing.routers import auto_router, logit_router
from trace_ray.routing.selection import best_choice, routing_summary
from trace_ray.training.training_log import read_metrics

HELP = (
    "evaluate the base model, each adapter, TRACE with each router, the oracle router and two baselines on the "
    "held-out split"
)


def scores(name: str, results: list[EpisodeResult], rollouts: int) -> MethodScores:
    return MethodScores(
        name, [r.family for r in results], [r.reward for r in results], [r.success for r in results], rollouts
    )


def why_untrained(run_dir: Path, router: str) -> str | None:
    """Why ``trace-ray route`` trained no ``router`` in this run, as its summary recorded it (None: it did not say)."""
    summary = run_dir / "router" / "summary.json"
    if not summary.is_file():
        return None
    error = json.loads(summary.read_text(encoding="utf-8")).get("routers", {}).get(router, {}).get("error")
    return f"route trained none: {error}" if error else None


def router_choices(
    config: TraceConfig, run_dir: Path, adapters: list[TrainedAdapter], observations
) -> tuple[dict, dict, str | None]:
    """Router name -> its choice per task; router name -> why it could not route; and router=auto's fallback (the option
    best on the training split; None without a selection). Run on a Ray model worker."""
    from trace_ray.models import assigned_device, load_model

    model, tokenizer = load_model(config.model, assigned_device())
    choices, unavailable, fallback = {}, {}, None
    choices["logit"] = [d.choice for d in logit_router(config, model, tokenizer, adapters).route_many(observations)]
    try:
        gate = load_gate(run_dir / "router", config.model.name, [a.name for a in adapters])
        choices["learned"] = [d.choice for d in LearnedRouter(model, tokenizer, gate).route_many(observations)]
    except TraceRayError as exc:
        unavailable["TRACE (learned)"] = why_untrained(run_dir, "learned") or str(exc)
    try:
        router = auto_router(config, run_dir, model, tokenizer, adapters)
        choices["auto"], fallback = [d.choice for d in router.route_many(observations)], router.fallback
    except TraceRayError as exc:
        unavailable["TRACE (auto)"] = str(exc)
    return choices, unavailable, fallback


def run(config: TraceConfig) -> None:
    evaluate(config, config.split, config.limit)


def evaluate(config: TraceConfig, split: str, limit: int | None) -> None:
    """Every method's greedy episodes on the first ``limit`` tasks of ``split`` (all: None) and the report comparing
    them, in run_dir/eval/."""
    run_dir = Path(config.run_dir)
    adapters = trained_adapters(run_dir)
    selected = read_selection(run_dir)
    make_env = environment_maker(config.env)
    target = make_env()
    seeds = target.task_seeds(split)[: limit or None]
    baseline = run_dir / "adapters" / config.evaluate.grpo_baseline
    options = {a.name: a.folder for a in adapters}
    unavailable: dict[str, str] = {}
    if (baseline / "adapter_model.safetensors").is_file():
        options[config.evaluate.grpo_baseline] = baseline
    else:
        unavailable["GRPO on target"] = (
            f"no adapter in {baseline}; run trace-ray train run_dir={run_dir} train_on=env env={config.env.name} "
            f"adapter={config.evaluate.grpo_baseline}"
        )
    contexts = option_contexts(config, config.env, options)  # route's greedy episodes of the same options are reused
    played = play_options(config, make_env, options, seeds, known=load_played(run_dir / EPISODES, contexts, seeds))
    injected = play_options(config, with_system_note(make_env, capability_note(selected)), {}, seeds)
    observations = [list(target.reset(seed).messages) for seed in seeds]
    choices, router_gaps, fallback = on_model_worker(config, router_choices, config, run_dir, adapters, observations)
    unavailable.update(router_gaps)

    history = {a.name: read_metrics(a.folder) for a in adapters}
    spent = {name: sum(row["rollouts"] for row in rows) for name, rows in history.items()}
    trace_rollouts = sum(spent.values())
    methods = [scores("base", [played[s][BASE] for s in seeds], 0)]
    methods += [scores(f"adapter:{a.name}", [played[s][a.name] for s in seeds], spent[a.name]) for a in adapters]
    for router, picks in choices.items():
        methods.append(scores(f"TRACE ({router})", [played[s][pick] for s, pick in zip(seeds, picks)], trace_rollouts))
    order = [BASE] + [a.name for a in adapters]
    oracle = [best_choice({name: played[s][name].reward for name in order}, order) for s in seeds]
    methods.append(scores("oracle router", [played[s][pick] for s, pick in zip(seeds, oracle)], trace_rollouts))
    option_rewards = [{name: played[s][name].reward for name in order} for s in seeds]
    routed = {f"TRACE ({router})": picks for router, picks in choices.items()}
    routed["always base"] = [BASE] * len(seeds)
    if fallback:
        routed[f"always {fallback} (best on {config.router.train_split})"] = [fallback] * len(seeds)
    routed["oracle router"] = oracle
    routing = {
        name: routing_summary(picks, option_rewards, config.evaluate.confidence, config.seed)
        for name, picks in routed.items()
    }
    episodes = {"base": [played[s][BASE] for s in seeds]}  # what each method played itself (routers reuse these)
    episodes.update({f"adapter:{a.name}": [played[s][a.name] for s in seeds] for a in adapters})
    try:
        gated = functools.partial(moe_engine, config.model, config.engine, adapters, run_dir / "router" / "moe")
        mixed = play_options(config, make_env, {}, seeds, make_engine_here=gated)
        methods.insert(-1, scores("TRACE (moe)", [mixed[s][BASE] for s in seeds], trace_rollouts))
        episodes["TRACE (moe)"] = [mixed[s][BASE] for s in seeds]
    except TraceRayError as exc:
        unavailable["TRACE (moe)"] = why_untrained(run_dir, "moe") or str(exc)
    training = dict(history)  # report.md's training curves
    if config.evaluate.grpo_baseline in options:
        training[GRPO_METHOD] = read_metrics(baseline)
        baseline_rollouts = sum(row["rollouts"] for row in training[GRPO_METHOD])
        methods.append(
            scores(GRPO_METHOD, [played[s][config.evaluate.grpo_baseline] for s in seeds], baseline_rollouts)
        )
        episodes[GRPO_METHOD] = [played[s][config.evaluate.grpo_baseline] for s in seeds]
    methods.append(scores("prompt injection", [injected[s][BASE] for s in seeds], 0))
    episodes["prompt injection"] = [injected[s][BASE] for s in seeds]

    report = evaluation_report(methods, config.evaluate.confidence, config.seed)
    rows = report["methods"]
    title = f"{config.model.name} on {config.env.name}/{split}: {len(seeds)} tasks, greedy"
    notes = [
        "Training rollouts: GRPO episodes recorded in each adapter's metrics.parquet (TRACE: all capability adapters); "
        "identification's collected trajectories and synthesis calibration are not counted.",
        f"Cov vs Delta of the identified capabilities: {run_dir / 'capabilities' / 'cov_vs_delta.png'} (trace-ray "
        "identify).",
        f"Routers choose once per task from its first observation; routing from {', '.join(choices)} is scored "
        "from the chosen option's greedy episode.",
    ]
    folder = run_dir / "eval"
    write_json(
        folder / "report.json",
        {
            "model": config.model.name,
            "env": config.env.name,
            "split": split,
            "tasks": len(seeds),
            "confidence": config.evaluate.confidence,
            **report,
            "routing": routing,
            "not_evaluated": unavailable,
            "choices": {**choices, "oracle": oracle},
            "seeds": seeds,
        },
    )
    with atomic_path(folder / "report.md") as scratch:
        Path(scratch).write_text(
            report_markdown(title, {**report, "routing": routing, "training": training}, unavailable, notes),
            encoding="utf-8",
        )
    write_episodes(
        folder / "episodes.parquet",
        episodes,
        {"split": split, "env": config.env.name, "model": config.model.name},
    )
    write_wins(
        folder / "transcripts.md",
        episodes["base"],
        {name: results for name, results in episodes.items() if name != "base"},
    )
    write_predictions(folder / "predictions", episodes, config.model.name)  # code-repair targets: SWE-bench predictions
    plot_methods(rows, folder / "methods.png")
    curves = {name: [(r["iteration"], r["reward_mean"]) for r in rows] for name, rows in history.items()}
    plot_reward_curves(curves, folder / "reward_curves.png")
    print_report(folder)


def print_report(folder: Path) -> None:
    """The evaluation table, the TRACE comparisons and what was not evaluated, from ``folder/report.json``."""
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    title = f"{report['model']} on {report['env']}/{report['split']}: {report['tasks']} tasks, greedy"
    print_table(title, TABLE_HEADER, table_rows(report["methods"]))
    if report["comparisons"]:
        print_table(
            f"TRACE against GRPO on target and the best single adapter ({report['best_adapter']})",
            COMPARISON_HEADER,
            comparison_rows(report["comparisons"]),
        )
    if report.get("routing"):
        print_table(
            "routing (ties count as correct; regret: the best option's reward minus the chosen one's)",
            ROUTING_HEADER,
            [(name, *routing_cells(result)) for name, result in report["routing"].items()],
        )
    for name, reason in report["not_evaluated"].items():
        console.print(f"not evaluated: {name}: {reason}")
    console.print(f"report: {folder / 'report.md'}")
