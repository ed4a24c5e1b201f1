#!/usr/bin/env bash
# The GPU paths the CPU suite cannot run, in one script for one GPU machine (about 5-10 minutes on one H200).
# Run from the repository root on a machine with the GPU image's packages (docker/Dockerfile.gpu; no network needed):
#   bash benchmarks/gpu_check.sh [OUT_DIR]
# It prints each figure with its verdict and exits non-zero on a failed check. Never part of CI.
#   1. the machine: torch, CUDA, the GPU, vLLM
#   2. the vLLM engine with LoRA (benchmarks/gpu_engine_check.py): versions under one name, no KV-cache block
#      crossing versions, the engine-trainer log-prob gap, throughput
#   3. two GRPO iterations through Ray Train with NCCL on the GPU: vLLM rollouts and the trainer sharing the GPU
#      (0.5 each), bf16 (model.dtype=auto), trainer-side old log-probs, adapter sync to the engine, the checkpoint
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-runs/gpu_check}}"
mkdir -p "$OUT"

echo "== 1. machine"
python - <<'PY'
import importlib.metadata as md, torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPUs {torch.cuda.device_count()}:",
      ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "none")
for name in ("vllm", "ray", "transformers", "peft"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} not installed")
PY

echo "== 2. vLLM engine with LoRA"
python benchmarks/gpu_engine_check.py

echo "== 3. GRPO on Ray Train with NCCL"
started=$(date +%s)
trace-ray train run_dir="$OUT" train_on=env env=device model=smollm2_135m model.dtype=auto \
  engine=vllm engine.memory_fraction=0.3 engine.max_lora_rank=8 rollout.worker_gpus=0.5 \
  trainer.use_gpu=true trainer.gpus_per_worker=0.5 trainer.gradient_checkpointing=true \
  lora.rank=8 lora.alpha=16 grpo.iterations=2 grpo.group_size=8 grpo.groups_per_batch=4 grpo.mini_batch_size=8 \
  grpo.lr=1e-4 grpo.old_logprobs=trainer grpo.checkpoint_every=1 rollout.max_episode_tokens=512
echo "wall time $(( $(date +%s) - started )) s"
python - "$OUT" <<'PY'
import sys
from pathlib import Path
from trace_ray.training.training_log import read_metrics
rows = read_metrics(Path(sys.argv[1]) / "adapters" / "device")
for row in rows:
    print(f"iteration {row['iteration']}: reward {row['reward_mean']:.3f}, rollout {row['rollout_s']:.1f} s "
          f"({row['rollout_tokens_per_s']:.0f} tokens/s), update {row['update_s']:.1f} s, sync {row.get('sync_s', 0):.2f} s, "
          f"engine-trainer gap {row.get('old_logprob_gap', float('nan')):.2e} (max {row.get('old_logprob_gap_max', float('nan')):.2e})")
assert [row["iteration"] for row in rows] == [1, 2], "GRPO did not finish two iterations"
print("gpu_check: all checks passed")
PY
