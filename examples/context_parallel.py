"""Context parallelism: one packed sequence split over ranks, checked against one process.

    torchrun --nproc-per-node 2 examples/context_parallel.py          # gloo on CPUs
    torchrun --nproc-per-node 2 examples/context_parallel.py --cuda   # NCCL, one GPU per rank

Every rank builds the same global inputs (same seed), keeps its chunk, runs the context-parallel
op forward and backward, and all-reduces the local weight/bias gradient partials (what a data- or
context-parallel reducer does). Rank 0 then compares everything with the single-process op on
the whole sequence and prints the max differences (0 for y and dx: they are bitwise equal).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from conv1d_silu import causal_conv1d_silu
from conv1d_silu.distributed import causal_conv1d_silu_cp


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cuda", action="store_true", help="NCCL, one GPU per rank")
    p.add_argument("--tokens", type=int, default=4099)
    p.add_argument("--channels", type=int, default=264)
    args = p.parse_args()
    backend = "nccl" if args.cuda else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if args.cuda else torch.float32

    g = torch.Generator().manual_seed(0)
    S, C, K = args.tokens, args.channels, 4
    x = torch.randn(S, C, generator=g).to(device, dtype)
    w = torch.randn(C, K, generator=g).to(device, dtype)
    b = torch.randn(C, generator=g).to(device, dtype)
    dy = torch.randn(S, C, generator=g).to(device, dtype)
    cu = torch.tensor([0, 100, 101, S // 2 + 3, S], dtype=torch.int32, device=device)  # documents cross ranks

    # uneven chunks, the last rank gets the rest
    cuts = [0] + sorted(torch.randint(1, S, (world - 1,), generator=g).tolist()) + [S]
    lo, hi = cuts[rank], cuts[rank + 1]
    x_local = x[lo:hi].clone().requires_grad_()
    w_local, b_local = w.clone().requires_grad_(), b.clone().requires_grad_()
    y_local = causal_conv1d_silu_cp(x_local, w_local, b_local, cu_seqlens=cu)
    y_local.backward(dy[lo:hi])
    for grad in (w_local.grad, b_local.grad):  # local partials -> the full gradient
        dist.all_reduce(grad)

    ys = [None] * world
    dxs = [None] * world
    dist.all_gather_object(ys, y_local.detach().cpu())
    dist.all_gather_object(dxs, x_local.grad.cpu())
    if rank == 0:
        xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
        y = causal_conv1d_silu(xr, wr, br, cu_seqlens=cu)
        y.backward(dy)
        diff = lambda a, b: (a.float() - b.float()).abs().max().item()  # noqa: E731
        print(f"{world} ranks ({backend}), chunks {[cuts[i + 1] - cuts[i] for i in range(world)]}, {dtype}")
        print(f"max |y  - single process| = {diff(torch.cat(ys), y.detach().cpu()):.3g}")
        print(f"max |dx - single process| = {diff(torch.cat(dxs), xr.grad.cpu()):.3g}")
        print(f"max |dweight - single process| = {diff(w_local.grad, wr.grad):.3g} (sum of per-rank partials)")
        print(f"max |dbias   - single process| = {diff(b_local.grad, br.grad):.3g}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
