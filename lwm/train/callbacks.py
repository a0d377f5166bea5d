"""Training callbacks: throughput (tokens/s, model TFLOP/s, MFU) and peak memory per rank."""

from __future__ import annotations

import resource
import time

import lightning as L
import torch

from lwm.model import ModelConfig


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x parameters (matmuls, forward + backward) plus causal attention."""
    params = config.num_params() - config.vocab_size * config.dim  # the embedding lookup is not a matmul
    attention = 6 * config.n_layers * config.dim * seq_len  # 12 L d S / 2 for the causal half
    return 6 * params + attention


class Throughput(L.Callback):
    """Logs tokens/s over all ranks, model TFLOP/s and MFU (when a peak is given)."""

    def __init__(self, model_config: ModelConfig, seq_len: int, global_batch: int, peak_tflops: float = 0.0):
        self.tokens_per_step = seq_len * global_batch
        self.flops_per_step = flops_per_token(model_config, seq_len) * self.tokens_per_step
        self.peak_tflops = peak_tflops
        self._start = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        dt = time.perf_counter() - self._start
        world = max(1, trainer.world_size)
        tflops = self.flops_per_step / dt / 1e12 / world  # per device
        metrics = {"perf/tokens_per_s": self.tokens_per_step / dt, "perf/tflops_per_device": tflops}
        if self.peak_tflops > 0:
            metrics["perf/mfu"] = tflops / self.peak_tflops
        pl_module.log_dict(metrics, on_step=True, on_epoch=False)


class PeakMemory(L.Callback):
    """Logs this rank's peak memory: CUDA allocator peak on GPU, peak RSS on CPU (MiB)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if torch.cuda.is_available() and pl_module.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(pl_module.device) / 2**20
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        pl_module.log("perf/peak_mem_mib", peak, on_step=True, on_epoch=False)
