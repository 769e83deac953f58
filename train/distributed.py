"""Multi-process training on torch.distributed (docs/distributed.md): init from torchrun's environment, rank helpers,
broadcasts, gathers, per-sample augmentation seeds. Outside torchrun every helper is a no-op for one process."""

from __future__ import annotations

import os
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset


@dataclass(frozen=True)
class World:
    """This process's place in the job: global rank, number of processes, rank on this node."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        """True when more than one process (or any torchrun launch) shares the work."""
        return dist.is_available() and dist.is_initialized()

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that prints, writes metrics and saves checkpoints."""
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """True when torchrun (or another launcher setting ``WORLD_SIZE``/``RANK``) started this process."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_world(device_name: str, sync_bn: bool = False) -> tuple[World, torch.device]:
    """Join the process group torchrun describes and pick this rank's device (without torchrun: one process). Raises
    ``ValueError`` for launches that cannot work, e.g. more ranks on a node than visible GPUs."""
    want_cuda = device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())
    if not launched_by_torchrun():
        if sync_bn:
            raise ValueError("--sync-bn needs a multi-process launch (torchrun --nproc_per_node N -m train ...)")
        return World(), resolve_device(device_name)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    if want_cuda:
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device_name}: CUDA is not available on this machine")
        gpus = torch.cuda.device_count()
        if local_size > gpus:
            raise ValueError(f"{local_size} processes on this node but only {gpus} visible GPU(s); launch with "
                             f"torchrun --nproc_per_node {gpus} (or fewer)")
        if device_name not in ("auto", "cuda"):
            raise ValueError(f"--device {device_name}: under torchrun each rank uses cuda:LOCAL_RANK; "
                             "pass --device auto or cuda")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        if sync_bn:
            raise ValueError("--sync-bn needs CUDA GPUs (PyTorch's SyncBatchNorm has no CPU kernel)")
        device = torch.device("cpu")
    if not dist.is_initialized():
        # on GPUs: NCCL for CUDA tensors and gloo for the small CPU-side collectives (skip votes, metric sums,
        # gathered evaluation rows), so that no helper has to move its tensors to the GPU first
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    return World(rank, size, local_rank), device


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda if available else cpu; otherwise ``torch.device(name)`` (checked to exist)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return device


def current_world() -> World:
    """The world of the initialised process group (rank 0 of 1 when there is none)."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def shutdown() -> None:
    """Leave the process group (no-op without one)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for every rank (no-op in one process)."""
    if current_world().distributed:
        dist.barrier()


def broadcast_object(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (e.g. the run name, which holds a timestamp)."""
    if not current_world().distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(value: Any) -> list[Any]:
    """Every rank's ``value`` in rank order, on every rank (``[value]`` in one process)."""
    world = current_world()
    if not world.distributed:
        return [value]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, value)
    return out


def per_rank_batch(global_batch: int, world: World) -> int:
    """The per-process batch for a global ``--batch-size``; a ``ValueError`` unless it divides evenly."""
    if global_batch % world.size:
        raise ValueError(f"--batch-size {global_batch} is the global batch and must be divisible by the "
                         f"{world.size} processes")
    return global_batch // world.size


class _SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) whose backward sums the upstream gradients of every rank."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def broadcast_buffers(module: torch.nn.Module) -> None:
    """Copy rank 0's buffers (BatchNorm statistics) to every rank (no-op in one process)."""
    if not current_world().distributed:
        return
    for buffer in module.buffers():
        dist.broadcast(buffer.data, src=0)


def global_mean(values: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` over every rank's samples, with the gradients of one process on the whole batch."""
    if not current_world().distributed:
        return values.mean()
    total = _SumOverRanks.apply(values.sum().reshape(1))
    count = torch.tensor([float(values.numel())], device=values.device)
    dist.all_reduce(count)
    return (total / count)[0]


def sum_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Element-wise sum of a dict of floats over ranks (same keys on every rank)."""
    if not current_world().distributed or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


def gather_varying(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every rank's ``x`` concatenated in rank order (others' detached), and where this rank's rows start."""
    world = current_world()
    if not world.distributed:
        return x, 0
    size = torch.tensor([x.shape[0]], device=x.device)
    sizes = [torch.zeros_like(size) for _ in range(world.size)]
    dist.all_gather(sizes, size)
    counts = [int(s) for s in sizes]
    padded = torch.zeros((max(counts), *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[:x.shape[0]] = x.detach()
    parts = [torch.empty_like(padded) for _ in range(world.size)]
    dist.all_gather(parts, padded)
    pieces = [p[:c] for p, c in zip(parts, counts, strict=True)]
    pieces[world.rank] = x
    return torch.cat(pieces), sum(counts[:world.rank])


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The augmentation seed of one training sample in one epoch (independent of rank and world size)."""
    return (seed * 1_000_003 + epoch * 7_919 + index) % (2**63 - 1)


class PerSampleSeeded(Dataset[dict[str, torch.Tensor]]):
    """A dataset whose augmentation is seeded by (seed, epoch, index): the same for every world size."""

    def __init__(self, dataset: Dataset[dict[str, torch.Tensor]], seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's augmentation seeds."""
        self.epoch = epoch

    def __len__(self) -> int:
        assert isinstance(self.dataset, Sized)
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(self.seed, self.epoch, index))
            return self.dataset[index]


def gather_indexed_rows(local: torch.Tensor, indices: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's rows at their dataset ``indices`` in one tensor, and a mask of the rows that arrived."""
    rows, _ = gather_varying(local)
    where, _ = gather_varying(indices)
    out = local.new_zeros((total, *local.shape[1:]))
    out[where] = rows
    present = torch.zeros(total, dtype=torch.bool)
    present[where.cpu()] = True
    return out, present


def max_over_ranks_(tensor: torch.Tensor) -> torch.Tensor:
    """In place: the element-wise maximum of ``tensor`` over the ranks; returns ``tensor``."""
    if current_world().distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor
