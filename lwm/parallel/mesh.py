"""The device meshes and process groups of a ParallelDims, built in one place.

Every rank calls `build_meshes` with the same dims (each mesh creates its groups collectively).
Meshes are made with DeviceMesh's public constructor from the rank grid of lwm.parallel.dims:

    fsdp x tp   a 2-D mesh ("dp_cp", "tp"): FSDP2 shards over "dp_cp" (all dp x cp ranks with this
                rank's tp index), tensor parallelism runs over "tp"; one root, so the two compose
                (parameters become 2-D DTensors)
    cp          the context-parallel groups: the cp ranks with this rank's dp and tp indices
                (hybrid: its ring and its all-to-all group)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh

from lwm.parallel.dims import ParallelDims


@dataclass
class Meshes:
    dims: ParallelDims
    fsdp: DeviceMesh  # 1-D: the dp x cp ranks FSDP2 shards over
    tp: DeviceMesh  # 1-D: this rank's tensor-parallel group (size 1: no tensor parallelism)
    cp_group: object  # the cp ranks that share one sequence (the loss's counts are summed over them)
    attention_group: object  # the group attention runs over: the cp ranks; hybrid: the ring
    ulysses_group: object | None  # hybrid: this rank's all-to-all group
    rank: int

    @property
    def cp(self) -> int:
        return self.dims.cp

    @property
    def cp_rank(self) -> int:
        return self.dims.coords(self.rank)[1]


def build_meshes(dims: ParallelDims, device_type: str, rank: int) -> Meshes:
    """The meshes of `dims` for the world that is initialized (its size must be dims.world)."""
    grid = torch.arange(dims.world).reshape(dims.dp, dims.cp, dims.tp)  # rank = (dp * cp + c) * tp + t
    main = DeviceMesh(device_type, grid.reshape(dims.dp * dims.cp, dims.tp), mesh_dim_names=("dp_cp", "tp"))
    cp_group = DeviceMesh(device_type, grid.permute(0, 2, 1), mesh_dim_names=("dp", "tp", "cp"))["cp"].get_group()
    attention_group, ulysses_group = cp_group, None
    if dims.mode == "hybrid":
        cells = grid.reshape(dims.dp, dims.ring, dims.ulysses, dims.tp).permute(0, 3, 1, 2)  # c = r * U + u
        hybrid = DeviceMesh(device_type, cells, mesh_dim_names=("dp", "tp", "ring", "ulysses"))
        attention_group, ulysses_group = hybrid["ring"].get_group(), hybrid["ulysses"].get_group()
    return Meshes(dims, main["dp_cp"], main["tp"], cp_group, attention_group, ulysses_group, rank)


def lightning_sizes(dims: ParallelDims) -> dict[str, int]:
    """Lightning's ModelParallelStrategy arguments for `dims`. Its own 2-D mesh only starts the
    process group and names the data-parallel ranks; lwm's meshes come from build_meshes."""
    return {"data_parallel_size": dims.dp, "tensor_parallel_size": dims.cp * dims.tp}
