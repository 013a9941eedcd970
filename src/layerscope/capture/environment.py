"""What a live profile records about where it ran: versions, devices, the distributed job."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import torch

from layerscope.model.profile import SCHEMA_VERSION


def environment_meta() -> dict[str, Any]:
    """The part of a live profile's ``meta`` that describes the process and machine it ran on."""
    from layerscope.version import __version__

    return {
        "schema_version": SCHEMA_VERSION,
        "layerscope_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "source": "live",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # "highest": fp32 matmuls at the fp32 rate; "high"/"medium": TF32 (MFU's peak follows it)
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),  # fp32 convolutions in TF32
    }


def device_meta() -> list[dict[str, Any]]:
    """Index, name and memory of each CUDA device torch sees (empty without CUDA)."""
    devices: list[dict[str, Any]] = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.append({"index": i, "name": props.name, "total_memory": int(props.total_memory)})
    return devices


def distributed_info() -> dict[str, Any] | None:
    """rank, world size and backend of a torch.distributed job (or torchrun's environment)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return {
            "rank": int(dist.get_rank()),
            "world_size": int(dist.get_world_size()),
            "backend": str(dist.get_backend()),
        }
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        try:
            return {
                "rank": int(os.environ["RANK"]),
                "world_size": int(os.environ["WORLD_SIZE"]),
                "backend": None,
            }
        except ValueError:
            return None
    return None
