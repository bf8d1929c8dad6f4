"""Train a tiny Mamba-style block with CausalConv1dSiLU on synthetic data.

    python examples/train_tiny_mamba_block.py [--steps 300] [--cpu]

The block is in_proj -> CausalConv1dSiLU -> a gate (where Mamba has its selective scan) ->
out_proj, on packed documents (cu_seqlens). The task: predict, at every token,
a running mix of the previous few tokens of the same document, so the short causal convolution
and the document boundaries both matter. The loss goes down; runs in well under a minute on a
CPU and uses the GPU kernels when a GPU is there.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from conv1d_silu import CausalConv1dSiLU


class TinyMambaBlock(nn.Module):
    def __init__(self, d_model: int, expand: int = 2, d_conv: int = 4):
        super().__init__()
        d_inner = expand * d_model
        self.norm = nn.LayerNorm(d_model)
        self.in_proj = nn.Linear(d_model, 2 * d_inner)
        self.conv = CausalConv1dSiLU(d_inner, d_conv)
        self.out_proj = nn.Linear(d_inner, d_model)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        u, gate = self.in_proj(self.norm(x)).chunk(2, dim=-1)
        u = self.conv(u, cu_seqlens=cu_seqlens)  # the short causal convolution, per document
        return x + self.out_proj(u * torch.nn.functional.silu(gate))  # gated mixer


def batch(S: int, d: int, device: torch.device, gen: torch.Generator):
    """Packed documents; target = a causal mix of the last three tokens' first features."""
    lengths = torch.randint(16, 128, (S // 16,), generator=gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    cu = cu[cu < S]
    cu = torch.cat([cu, torch.tensor([S])]).to(torch.int32)
    x = torch.randn(S, d, generator=gen)
    target = torch.zeros_like(x)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        seg = x[a:b]
        for lag, wgt in ((0, 0.5), (1, 0.3), (2, -0.2)):
            target[a + lag : b] += wgt * seg[: b - a - lag]
    return x.to(device), target.to(device), cu.to(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--cpu", action="store_true")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(*[TinyMambaBlock(args.d_model) for _ in range(2)]).to(device)
    head = nn.Linear(args.d_model, args.d_model).to(device)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=3e-3)
    data = [batch(args.tokens, args.d_model, device, gen) for _ in range(8)]
    t0 = time.time()
    first = None
    for step in range(args.steps):
        x, target, cu = data[step % len(data)]
        h = x
        for block in model:
            h = block(h, cu)
        loss = torch.nn.functional.mse_loss(head(h), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    print(f"loss {first:.4f} -> {loss.item():.4f} in {time.time() - t0:.1f} s on {device}")


if __name__ == "__main__":
    main()
