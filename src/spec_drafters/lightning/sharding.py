"""FSDP2 for a drafter run (Lightning's ``ModelParallelStrategy`` hands over the device mesh)."""

from __future__ import annotations

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
