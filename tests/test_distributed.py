"""Context parallelism with real processes (gloo on CPU, NCCL when >= 2 GPUs): the concatenated
y and dx equal the single-process op bitwise; summed dweight/dbias match it to fp32 rounding."""

from __future__ import annotations

import os
import tempfile
import time

import pytest
import torch
import torch.multiprocessing as mp

from conv1d_silu import causal_conv1d_silu

pytestmark = pytest.mark.timeout(300)


def _inputs(spec):
    g = torch.Generator().manual_seed(spec["seed"])
    S, C, K = sum(spec["split"]), spec["C"], spec["K"]
    dtype = getattr(torch, spec["dtype"])
    x = torch.randn(S, C, generator=g).to(dtype)
    w = torch.randn(C, K, generator=g).to(dtype)
    b = torch.randn(C, generator=g).to(dtype)
    dy = torch.randn(S, C, generator=g).to(dtype)
    cu = torch.tensor(spec["docs"], dtype=torch.int32) if spec.get("docs") else None
    seq = None
    if cu is not None and spec.get("table") == "seq_idx":
        seq = (torch.searchsorted(cu.long(), torch.arange(S), right=True) - 1).to(torch.int32) + 5  # any base id
        cu = None
    return x, w, b, dy, cu, seq


def _worker(rank, world, backend, init_file, out_dir, spec):
    import torch.distributed as dist

    from conv1d_silu.distributed import causal_conv1d_silu_cp

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        x, w, b, dy, cu, seq = (t.to(device) if t is not None else None for t in _inputs(spec))
        o = sum(spec["split"][:rank])
        n = spec["split"][rank]
        xl = x[o : o + n].clone().requires_grad_()
        wl, bl = w.clone().requires_grad_(), b.clone().requires_grad_()
        y = causal_conv1d_silu_cp(
            xl, wl, bl, seq_idx=None if seq is None else seq[o : o + n].contiguous(), cu_seqlens=cu
        )
        y.backward(dy[o : o + n])
        out = {"y": y.detach().cpu(), "dx": xl.grad.cpu(), "dw": wl.grad.cpu(), "db": bl.grad.cpu()}
        torch.save(out, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_cp(spec, backend="gloo", timeout=240):
    world = len(spec["split"])
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.start_processes(
            _worker, args=(world, backend, os.path.join(d, "init"), d, spec), nprocs=world, join=False,
            start_method="spawn",
        )
        deadline = time.time() + timeout
        try:
            while not ctx.join(timeout=5):
                if time.time() > deadline:
                    raise TimeoutError(f"context-parallel workers did not finish in {timeout} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
        return [torch.load(os.path.join(d, f"{r}.pt")) for r in range(world)]


def check(spec, backend="gloo"):
    results = run_cp(spec, backend)
    x, w, b, dy, cu, seq = _inputs(spec)
    device = "cuda" if backend == "nccl" else "cpu"
    x, w, b = (t.to(device).requires_grad_() for t in (x, w, b))
    y = causal_conv1d_silu(x, w, b, cu_seqlens=None if cu is None else cu.to(device),
                           seq_idx=None if seq is None else seq.to(device))
    y.backward(dy.to(device))
    y_cp = torch.cat([r["y"] for r in results])
    dx_cp = torch.cat([r["dx"] for r in results])
    assert torch.equal(y_cp, y.detach().cpu()), "y differs from the single-process op"
    assert torch.equal(dx_cp, x.grad.cpu()), "dx differs from the single-process op"
    # per-rank partials are rounded to the weight dtype before the sum (bf16: 2^-9)
    tol = 1e-5 if w.dtype != torch.bfloat16 else 2e-2
    dw = sum(r["dw"].double() for r in results)
    db = sum(r["db"].double() for r in results)
    torch.testing.assert_close(dw, w.grad.cpu().double(), rtol=tol, atol=tol)
    torch.testing.assert_close(db, b.grad.cpu().double(), rtol=tol, atol=tol)


SPECS = {
    "two_ranks_plain": dict(split=[70, 50], C=8, K=4, dtype="float32", seed=1),
    "two_ranks_short_first": dict(split=[2, 97], C=8, K=4, dtype="float64", seed=2, docs=[0, 60, 99]),
    "four_ranks_short_and_empty": dict(
        split=[40, 2, 0, 58], C=16, K=4, dtype="float32", seed=3,
        docs=[0, 10, 40, 41, 90, 100],  # starts exactly at a boundary (40); 41..90 spans ranks 1, 3
    ),
    "four_ranks_doc_spans_three": dict(split=[30, 5, 1, 40], C=8, K=8, dtype="float64", seed=4, docs=[0, 25, 50, 76]),
    "four_ranks_seq_idx": dict(
        split=[33, 1, 26, 20], C=8, K=3, dtype="float32", seed=5, docs=[0, 33, 34, 35, 70, 80], table="seq_idx"
    ),
    "bfloat16": dict(split=[64, 64], C=16, K=4, dtype="bfloat16", seed=6, docs=[0, 50, 128]),
}


@pytest.mark.parametrize("name", SPECS)
def test_context_parallel_gloo(name):
    check(SPECS[name])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for NCCL")
@pytest.mark.parametrize("name", ["two_ranks_short_first", "bfloat16"])
def test_context_parallel_nccl(name):
    spec = dict(SPECS[name])
    spec["split"] = spec["split"][:2]
    check(spec, backend="nccl")


def test_requires_initialised_process_group():
    from conv1d_silu.distributed import causal_conv1d_silu_cp

    with pytest.raises(RuntimeError, match="not initialised"):
        causal_conv1d_silu_cp(torch.randn(4, 2), torch.randn(2, 4))


def test_example_runs_with_torchrun():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(root / "examples" / "context_parallel.py"), "--tokens", "700", "--channels", "16"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "max |y  - single process| = 0" in out.stdout and "max |dx - single process| = 0" in out.stdout
