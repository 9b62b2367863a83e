"""FSDP2 for a drafter run (Lightning's ``ModelParallelStrategy`` hands over the device mesh)."""

from __future__ import annotations

import torch
from torch import nn


def shard_fsdp2(drafter: nn.Module, loss: nn.Module, target, mesh, shard_target: bool) -> None:
    """``fully_shard`` per drafter layer, then the drafter's root (fc, norms) and any trained auxiliary
    head of the loss. The frozen target is replicated (no gradients or optimizer state to shard; every
    rank runs it on its own batch), or with ``shard_target`` sharded per decoder layer when its
    weights do not fit one device (its embedding, final norm and head stay whole: the drafter reads
    them outside the target's forward)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dp = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
    policy = MixedPrecisionPolicy()  # parameters and gradient reduction in the stored dtype
    for layer in drafter.layers:
        fully_shard(layer, mesh=dp, mp_policy=policy)
    fully_shard(drafter, mesh=dp, mp_policy=policy)
    if any(p.requires_grad for p in loss.parameters()):
        fully_shard(loss, mesh=dp, mp_policy=policy)
    if shard_target:
        for layer in target.base.layers:  # gathered around each layer's forward, then freed
            fully_shard(layer, mesh=dp, mp_policy=policy)


def target_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the target by name (non-persistent buffers too: RoPE's
    ``inv_freq``), taken before sharding: rank 0's are the loaded weights, kept alive until sent."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def receive_target(model: nn.Module, source: dict[str, torch.Tensor], device: torch.device) -> None:
    """``load_target_once``: global rank 0 loaded the target (the other ranks of its node built it on
    the meta device); after sharding, every rank gets each tensor from rank 0, one at a time, and keeps
    what it holds of it: the whole tensor where the target is replicated, its shard where
    ``shard_target`` sharded the layer. A rank's host memory then peaks at its share plus the largest
    tensor, not the whole target (benchmarks/README.md, target_load).
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, distribute_tensor

    deferred = any(t.is_meta for t in source.values())
    if deferred:
        model.to_empty(device=device)
        if hasattr(model, "tie_weights"):
            model.tie_weights()  # to_empty gives tied weights separate storage
    now = target_tensors(model)
    for name, held in source.items():
        full = (
            torch.empty(held.shape, dtype=held.dtype, device=device)
            if held.is_meta
            else held.detach().to(device)  # rank 0's loaded tensor (taken before sharding)
        )
        dist.broadcast(full, src=0)
        dst = now[name]
        if isinstance(dst, DTensor):
            local = distribute_tensor(full, dst.device_mesh, dst.placements, src_data_rank=None)
            dst.to_local().copy_(local.to_local())
        else:
            dst.data.copy_(full)
    if deferred:
        rank = dist.get_rank()
        print(f"rank {rank}: the target's {len(source)} tensors received from rank 0 (built on meta here)")
