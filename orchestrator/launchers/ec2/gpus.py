"""How many peers one EC2 worker instance runs: one per GPU (``launcher_options.peers_per_machine``).

The GPU counts of common GPU instance types are written here rather than asked of EC2
(``DescribeInstanceTypes``' ``GpuInfo``): a run's options are checked when it is created, and a table
answers at once, offline, with no call that can fail. A test holds it to what moto's copy of
DescribeInstanceTypes says. A type the table lacks counts as one GPU (one peer, as before), and a run
on it may still set ``peers_per_machine`` itself.

A run's default is the fewest GPUs among its instance types, so that whichever pool EC2 Fleet picks,
every peer has a device of its own; a run that sets ``peers_per_machine`` above what one of its types
has is refused when it is created.
"""

from __future__ import annotations

from collections.abc import Iterable

#: the most peers one instance runs: the largest GPU instances have 8 (p4d, p5, g5/g6/g6e.48xlarge);
#: the Terraform module opens one DHT port per peer for as many
MAX_PEERS_PER_INSTANCE = 8

# One line per family: {size: GPUs}, the sizes with more than one GPU listed (the rest have 1).
_MULTI_GPU_SIZES: dict[str, dict[str, int]] = {
    "g4dn": {"12xlarge": 4, "metal": 8},
    "g5": {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8},
    "g5g": {"16xlarge": 2, "metal": 2},
    "g6": {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8},
    "g6e": {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8},
    "p3dn": {"24xlarge": 8},
    "p4d": {"24xlarge": 8},
    "p4de": {"24xlarge": 8},
    "p5": {"48xlarge": 8},
    "p5e": {"48xlarge": 8},
    "p5en": {"48xlarge": 8},
}
_SINGLE_GPU_SIZES: dict[str, tuple[str, ...]] = {
    "g4dn": ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge"),
    "g5": ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge"),
    "g5g": ("xlarge", "2xlarge", "4xlarge", "8xlarge"),
    "g6": ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge"),
    "g6e": ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge"),
    "p5": ("4xlarge",),
}
GPUS_BY_INSTANCE_TYPE: dict[str, int] = {
    **{f"{family}.{size}": 1 for family, sizes in _SINGLE_GPU_SIZES.items() for size in sizes},
    **{f"{family}.{size}": n for family, sizes in _MULTI_GPU_SIZES.items() for size, n in sizes.items()},
}


def gpus_of(instance_type: str) -> int | None:
    """The GPUs of ``instance_type``, or None when the table does not know it."""
    return GPUS_BY_INSTANCE_TYPE.get(instance_type)


def default_peers(instance_types: Iterable[str]) -> int:
    """One peer per GPU of the run's smallest known type (1 where none is known), at most 8."""
    known = [n for n in (gpus_of(t) for t in instance_types) if n is not None]
    return max(1, min([*known, MAX_PEERS_PER_INSTANCE]) if known else 1)


def too_few_gpus(instance_types: Iterable[str], peers: int) -> list[str]:
    """The run's instance types known to have fewer GPUs than ``peers``, as ``type (n GPUs)``."""
    return [f"{t} ({gpus_of(t)} GPU)" for t in instance_types if (gpus_of(t) or peers) < peers]
