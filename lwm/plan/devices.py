"""The devices a plan is made for: memory, peak bf16 matmul rate, HBM and link bandwidths.

Vendor figures (dense bf16, no sparsity; SXM parts). Memory is what `torch.cuda.mem_get_info` reports
as the device's total, not the marketing number (an "80GB" H100 shows 79.1 GiB). Links are per GPU,
one direction: NVLink inside a node, the node's InfiniBand share per GPU (one 400 Gb/s NIC per GPU,
200 Gb/s on A100 systems) across nodes. Host memory is a DGX node's (2 TiB on DGX A100/H100/H200/B200),
shared by its 8 GPUs; host copies run at a pinned PCIe copy's typical rate (about 50 GB/s one way on
PCIe Gen5 x16, 25 on Gen4), an assumption until scripts/gpu_check.sh measures it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from lwm.core.preflight import GIB  # noqa: F401  (the planner's modules read it here)
from lwm.parallel.flash_impl import KERNELS, NAME, choose_kernel


@dataclass(frozen=True)
class Device:
    name: str
    memory_gib: float  # what the device holds in total
    tflops: float  # peak dense bf16 matmul rate
    hbm_tbps: float  # HBM bandwidth, TB/s
    nvlink_gbps: float  # GB/s per GPU, one direction, inside a node
    ib_gbps: float  # GB/s per GPU, one direction, between nodes
    # Not the tensors' memory: the CUDA context and NCCL's buffers (about 0.5 + 1 GiB on H100 with
    # NCCL's defaults), and the caching allocator's rounding and fragmentation on top of the peak.
    reserved_gib: float = 1.5
    fragmentation: float = 0.05
    # What the kernels this code calls reach of the peak, published (sources in docs/planning.md,
    # "What the kernels reach"): bf16 matmuls at the best shape's rate measured by mamf-finder
    # (ml-engineering's table), each flash kernel's forward + backward as its paper measured it (HOPPER_RATES);
    # 1.0 where the peak itself is measured (cpu_device).
    matmul_efficiency: float = 0.803  # H100 SXM: 794.5 of 989 TFLOP/s
    # The kernel behind aten's flash ops (parallel.attention_kernel; with_kernel plans one) and each kernel's
    # share of the peak on this device. `major`: the compute capability (None: a custom device).
    kernel: str = "fa2"
    major: int | None = 9
    kernel_rates: dict[str, float] = field(default_factory=lambda: dict(HOPPER_RATES))
    host_gib: float = 2048.0  # host memory of one node (shared by its GPUs)
    pcie_gbps: float = 50.0  # GB/s per GPU, one direction, device <-> pinned host memory
    # GB/s of host memory a node's CPU optimizer steps reach together (parameter offload): half the
    # DDR5 peak of a DGX H100/H200 node's two sockets (2 x 8 channels x 38.4 GB/s = 614 GB/s), an
    # assumption until measured; A100 nodes' DDR4 (2 x 8 x 25.6 = 410 GB/s) likewise.
    host_mem_gbps: float = 300.0
    # What a rank's process holds in host memory beside the offloaded tensors (Python, torch, CUDA's
    # host side, the data loader): an assumption, not measured.
    host_reserved_gib: float = 16.0

    @property
    def attention_efficiency(self) -> float:
        """The planned kernel's share of the peak."""
        return self.kernel_rates[self.kernel]

    def with_kernel(self, setting: str) -> Device:
        """This device running parallel.attention_kernel `setting`: auto and fa2 plan FlashAttention-2 (the
        kernel every install has; a run's auto may find a faster one installed), fa3 and fa4 their own rates;
        ValueError where the GPU cannot run it or no rate is published for it here."""
        if setting not in KERNELS:
            raise ValueError(f"parallel.attention_kernel must be one of {list(KERNELS)}, got {setting!r}")
        kernel = "fa2" if setting == "auto" else setting
        if kernel != "fa2":
            if self.major is None:
                raise ValueError(
                    f"parallel.attention_kernel={kernel}: a custom device has no compute capability; plan fa2"
                )
            choose_kernel(kernel, "cuda", (self.major, 0), frozenset(KERNELS))  # raises where the GPU cannot run it
        if kernel not in self.kernel_rates:
            raise ValueError(f"parallel.attention_kernel={kernel}: no published {NAME[kernel]} rate on {self.name}")
        return replace(self, kernel=kernel)

    def host_needs(self, host_peak_bytes: int, ranks_per_node: int) -> float:
        """Bytes a node's host holds when each of its ranks offloads host_peak_bytes, margins included."""
        return ranks_per_node * (host_peak_bytes * (1 + self.fragmentation) + self.host_reserved_gib * GIB)

    def host_fits(self, host_peak_bytes: int, ranks_per_node: int) -> bool:
        return self.host_needs(host_peak_bytes, ranks_per_node) <= self.host_gib * GIB

    def needs(self, peak_bytes: int) -> float:
        """Bytes a step with this tracked peak holds on the device, margins included."""
        return peak_bytes * (1 + self.fragmentation) + self.reserved_gib * GIB

    def fits(self, peak_bytes: int) -> bool:
        return self.needs(peak_bytes) <= self.memory_gib * GIB

    def headroom_gib(self, peak_bytes: int) -> float:
        return (self.memory_gib * GIB - self.needs(peak_bytes)) / GIB


# Each kernel's flash forward + backward on Hopper, weighted as counted here (2 products forward, 5 backward;
# sources in docs/planning.md): FlashAttention-2 (335, 322) at 326 of 989 TFLOP/s, FlashAttention-3 (616,
# 561) at 577, cuDNN (539, 516, the same figures' bars) at 523; FlashAttention-4 on Hopper has no published
# figure: FlashAttention-3's.
HOPPER_RATES = {"fa2": 0.33, "fa3": 0.583, "fa4": 0.583, "cudnn": 0.528}

DEVICES = {
    "h100-80g": Device("h100-80g", 79.1, 989.0, 3.35, 450.0, 50.0),
    # the table's H100 SXM row holds for the H200 ("H200 is the same"); no separate flash figure
    "h200-141g": Device("h200-141g", 139.8, 989.0, 4.8, 450.0, 50.0),
    # A100 SXM's measured matmul rate (271.2 of 312); FlashAttention-2's paper: 50-73% of the peak, its low end
    "a100-80g": Device(
        "a100-80g",
        79.1,
        312.0,
        2.04,
        300.0,
        25.0,
        matmul_efficiency=0.869,
        pcie_gbps=25.0,
        host_mem_gbps=200.0,
        major=8,
        kernel_rates={"fa2": 0.5},
    ),
    # B200's measured matmul rate (1745 of 2250); no published FlashAttention-2 figure: the H100's
    # FlashAttention-4's forward at 1613 of 2250 (71%), its backward unpublished: FlashAttention-2's rate here
    "b200-192g": Device(
        "b200-192g",
        178.4,
        2250.0,
        8.0,
        900.0,
        50.0,
        matmul_efficiency=0.776,
        major=10,
        kernel_rates={"fa2": 0.33, "fa4": 0.44},
    ),  # fmt: skip
}


def parse_device(text: str) -> Device:
    """A name of DEVICES, or custom:MEM_GIB,TFLOPS,NVLINK_GBPS,IB_GBPS[,HBM_TBPS] (HBM 3.35 if not
    given; MEM net of the CUDA context and NCCL's buffers)."""
    if text in DEVICES:
        return DEVICES[text]
    if not text.startswith("custom:"):
        raise ValueError(
            f"--gpu must be one of {sorted(DEVICES)} or custom:MEM,TFLOPS,NVLINK_GBPS,IB_GBPS, got {text!r}"
        )
    parts = text.removeprefix("custom:").split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"--gpu {text!r}: custom values must be numbers (MEM_GIB,TFLOPS,NVLINK_GBPS,IB_GBPS)"
        ) from None
    if len(values) not in (4, 5) or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(
            f"--gpu {text!r}: expected 4 or 5 finite positive numbers MEM_GIB,TFLOPS,NVLINK_GBPS,IB_GBPS[,HBM_TBPS], got {parts}"
        )
    mem, tflops, nvlink, ib = values[:4]
    hbm = values[4] if len(values) == 5 else 3.35
    # MEM is what the tensors may use: nothing reserved for a context; the allocator's margin stays.
    return Device(
        text, mem, tflops, hbm, nvlink, ib, reserved_gib=0.0, major=None, kernel_rates={"fa2": HOPPER_RATES["fa2"]}
    )


def cpu_device(tflops: float, mem_gbps: float, memory_gib: float, workspace_mib: float) -> Device:
    """This machine's CPU as a device, from measured rates: nothing reserved but the workspaces
    (oneDNN's, the allocator's) the tracker does not see; kernels at the measured rate."""
    base = Device("cpu", memory_gib, tflops, mem_gbps / 1000, 1e9, 1e9, major=None, kernel_rates={"fa2": 1.0})
    return replace(base, reserved_gib=workspace_mib / 1024, fragmentation=0.0, matmul_efficiency=1.0)
