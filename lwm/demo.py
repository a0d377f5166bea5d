"""The smallest real run: a few AdamW steps of a preset model on one batch of random tokens.

    python -m lwm.demo [--preset debug] [--steps 20] [--seq-len 256]

It exercises the whole model path (RoPE, GQA attention, chunked loss, backward) and prints the
loss, which falls as the model memorizes the batch. `python train.py` is the real training run.
"""

from __future__ import annotations

import argparse
import time

import torch

from lwm.model import ModelConfig, Transformer


def run(
    preset: str = "debug", steps: int = 20, seq_len: int = 256, batch: int = 2, lr: float = 3e-3, seed: int = 0
) -> list[float]:
    torch.manual_seed(seed)
    config = ModelConfig.from_preset(preset)
    model = Transformer(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    tokens = torch.randint(0, config.vocab_size, (batch, seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # next-token prediction
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {preset}: {n_params / 1e6:.2f}M parameters, batch {batch} x {seq_len} tokens")
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        loss = model(inputs, targets=targets).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step + 1:3d}/{steps}  loss {losses[-1]:.4f}")
    print(f"{steps} steps in {time.perf_counter() - start:.1f}s; loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return losses


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="debug", choices=["debug", "tiny", "7b"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args(argv)
    run(args.preset, args.steps, args.seq_len, args.batch, args.lr)


if __name__ == "__main__":
    main()
