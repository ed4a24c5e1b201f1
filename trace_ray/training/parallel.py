"""How the Ray Train workers hold the policy: whole replicas (DDP) or shards (FSDP), ``trainer.strategy``.

``ddp`` (the default) keeps the whole base model on every worker and
all-reduces the LoRA gradients (Ray Train's ``prepare_model``): the fastest
choice while the base fits on one GPU beside its activations. ``fsdp`` shards
every decoder layer's parameters, the frozen base's and the adapter's alike,
across the workers (PyTorch's per-parameter FSDP, ``fully_shard``: frozen and
trainable parameters may share a layer, as LoRA's do), so each GPU holds
1/N of the ~61 GB of Qwen3-30B-A3B's bf16 weights; a layer's full parameters
exist only while it runs. Sharded parameters are gathered where whole
tensors are needed (the adapter for the rollout workers, its export, the
checkpoint), which every worker must then call together.
"""

from __future__ import annotations

import torch


def is_sharded(strategy: str, world_size: int) -> bool:
    return strategy == "fsdp" and world_size > 1


def distribute(scorer: torch.nn.Module, strategy: str, world_size: int, device: torch.device) -> torch.nn.Module:
    """``scorer`` (an ``ActionLogprobs`` on ``device``) as the workers share it; alone, a worker keeps it as it is."""
    if world_size == 1:
        return scorer
    if strategy == "ddp":
        import ray.train.torch

        return ray.train.torch.prepare_model(scorer)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    for layer in scorer.decoder.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(scorer, mesh=mesh)  # the rest: embeddings, final norm, lm_head
    return scorer


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (a collective: every worker calls it); any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def optimizer_state(scorer: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> dict:
    """The optimizer's whole state on the CPU (every worker calls it when ``sharded``)."""
    if not sharded:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(scorer, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(scorer: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict, sharded: bool) -> None:
    """Restore what :func:`optimizer_state` gave (each worker keeps its shard when ``sharded``)."""
    if not sharded:
        optimizer.load_state_dict(saved)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(scorer, optimizer, saved, options=StateDictOptions(full_state_dict=True))
