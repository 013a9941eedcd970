"""What a live profile records about where it ran: versions, devices, the distributed job."""

from __future__ import annotations

import os
import platform
import time

import torch

from layerscope.model.meta import DeviceInfo, DistributedInfo, Environment


def environment(with_devices: bool = True) -> Environment:
    """The process and machine a live profile runs on (``ProfileMeta.environment``); the CUDA
    devices only ``with_devices`` (reading them initialises CUDA)."""
    from layerscope.version import __version__

    return Environment(
        layerscope_version=__version__,
        torch_version=str(torch.__version__),
        python_version=platform.python_version(),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        cudnn_allow_tf32=bool(torch.backends.cudnn.allow_tf32),
        checkpoint_early_stop=_checkpoint_early_stop(),
        devices=devices() if with_devices else (),
        distributed=distributed_info(),
    )


def _checkpoint_early_stop() -> bool:
    """Whether gradient checkpointing's recomputation stops early (``attribution/recompute.py``)."""
    return getattr(torch.utils.checkpoint, "_enable_checkpoint_early_stop", None) is not False


def devices() -> tuple[DeviceInfo, ...]:
    """Name, index and memory of each CUDA device torch sees (empty without CUDA)."""
    if not torch.cuda.is_available():
        return ()
    found = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        found.append(DeviceInfo(name=props.name, index=i, total_memory=int(props.total_memory)))
    return tuple(found)


def distributed_info() -> DistributedInfo | None:
    """rank, world size and backend of a torch.distributed job (or torchrun's environment)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return DistributedInfo(int(dist.get_rank()), int(dist.get_world_size()), str(dist.get_backend()))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        try:
            return DistributedInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        except ValueError:
            return None
    return None
