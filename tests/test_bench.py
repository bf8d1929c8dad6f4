"""The benchmark's baselines and CLI, on the CPU fallback (GPU timing runs in scripts/gpu-check)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from conv1d_silu import bench
from conv1d_silu.documents import doc_table
from conv1d_silu.reference import forward as reference_forward


@pytest.mark.parametrize("bias", [False, True])
def test_baselines_compute_the_op(bias):
    x = torch.randn(50, 12, dtype=torch.float64)
    w = torch.randn(12, 4, dtype=torch.float64)
    b = torch.randn(12, dtype=torch.float64) if bias else None
    want, _ = reference_forward(x, w, b, doc_table(x, None, None, None), None, False, True)
    torch.testing.assert_close(bench.torch_reference(x, w, b), want)
    torch.testing.assert_close(bench.torch_reference_shifts(x, w, b), want)


@pytest.mark.skipif(shutil.which("c++") is None, reason="Inductor needs a C++ compiler on the CPU")
@pytest.mark.timeout(600)
def test_compiled_baseline_builds_one_graph_for_every_shape():
    # Inductor specialises F.conv1d's groups=C (one graph per C: the recompile storm the bench's
    # first compiled baseline had); the shifted form stays one dynamic graph
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(bench.torch_reference_shifts, dynamic=True)
    compiled(torch.randn(40, 8), torch.randn(8, 4), torch.randn(8))
    with torch._dynamo.config.patch(error_on_recompile=True):  # a recompile raises
        for S, C in ((64, 16), (100, 24), (33, 264)):
            x, w, b = torch.randn(S, C), torch.randn(C, 4), torch.randn(C)
            torch.testing.assert_close(compiled(x, w, b), bench.torch_reference(x, w, b))


def test_cli_writes_rows_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "r.json"
    result = bench.main(["--cpu", "--shapes", "64,16", "--reps", "2", "--warmup", "1", "--baselines", "eager",
                         "--no-host", "--json", str(out), "--csv", str(tmp_path / "r.csv")])
    assert json.loads(out.read_text())["rows"] == result["rows"]
    calls = {(r["call"], r["impl"]) for r in result["rows"]}
    assert {("fwd", "conv1d_silu"), ("bwd", "conv1d_silu"), ("fwd", "torch_eager")} <= calls
    assert all(r["median_us"] > 0 for r in result["rows"])
    assert "| 64 | 16 |" in capsys.readouterr().out


def _cpu_bench(*extra: str) -> list[str]:
    return ["--cpu", "--reps", "2", "--warmup", "1", "--baselines", "eager", *extra]


def test_parts_of_a_bench_merge_into_the_whole_table(tmp_path):
    """--part I/N takes every N-th shape from the I-th; --from-json joins the parts' results into
    the rows and speedups of every shape (a bench split over several device calls)."""
    shapes = ["--shapes", "40,8", "48,8", "56,8"]
    whole = bench.main(_cpu_bench(*shapes, "--no-host"))
    files = []
    for i in (1, 2):
        files.append(tmp_path / f"p{i}.json")
        bench.main(_cpu_bench(*shapes, "--part", f"{i}/2", "--json", str(files[-1]), *(["--no-host"] if i == 2 else [])))
    assert {r["S"] for r in json.loads(files[0].read_text())["rows"]} == {40, 56}
    assert {r["S"] for r in json.loads(files[1].read_text())["rows"]} == {48}
    merged = bench.main(["--from-json", *map(str, files), "--json", str(tmp_path / "m.json")])

    def keys(result, what, impl):
        return sorted((r["S"], r["C"], r["call"], r[impl]) for r in result[what])

    assert keys(merged, "rows", "impl") == keys(whole, "rows", "impl")
    assert [r["S"] for r in merged["rows"]] == sorted(r["S"] for r in merged["rows"])  # the parts interleaved
    assert keys(merged, "speedups", "baseline") == keys(whole, "speedups", "baseline")
    assert merged["host_overhead_us"]["ratio"] > 0  # part 1's
    assert [p["commit"] for p in merged["meta"]["parts"]] == [merged["meta"]["commit"]] * 2
    # a later part's row replaces an earlier one of the same shape, call and implementation
    again = bench.main(["--from-json", str(files[0]), str(files[0])])
    assert keys(again, "rows", "impl") == keys(json.loads(files[0].read_text()), "rows", "impl")


def test_parts_from_different_runs_are_refused(tmp_path):
    part = bench.main(_cpu_bench("--shapes", "40,8", "--no-host"))
    other = {**part, "meta": {**part["meta"], "gpu": "NVIDIA H100 80GB HBM3"}}
    for name, result in (("a", part), ("b", other)):
        (tmp_path / f"{name}.json").write_text(json.dumps(result))
    with pytest.raises(ValueError, match="part 2 differs from part 1 in gpu"):
        bench.main(["--from-json", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    with pytest.raises(SystemExit):
        bench.parser().parse_args(["--part", "3/2"])


def test_a_run_cut_short_keeps_the_shapes_it_measured(tmp_path, monkeypatch):
    """With --json the result so far is written after every shape: a device call that runs out of
    time (gpu-check's timeout) still brings back the rows it measured."""
    measure = bench._shape_rows

    def shape_rows(args, impls, S, C, *rest):
        if S == 48:
            raise KeyboardInterrupt  # the timeout's SIGINT, mid-shape
        return measure(args, impls, S, C, *rest)

    monkeypatch.setattr(bench, "_shape_rows", shape_rows)
    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(_cpu_bench("--shapes", "40,8", "48,8", "--no-host", "--json", str(out)))
    saved = json.loads(out.read_text())
    assert {r["S"] for r in saved["rows"]} == {40} and saved["speedups"]
    assert not (tmp_path / "r.json.tmp").exists()


def test_meta_takes_the_commit_from_the_environment(monkeypatch):
    """A copied tree (the GPU machine's) may carry stale git history: CONV1D_SILU_COMMIT wins."""
    import argparse

    args = argparse.Namespace(dtype="bf16", K=4, graph=True, reps=3)
    monkeypatch.setenv("CONV1D_SILU_COMMIT", "0123456789abcdef")
    assert bench.meta(torch.device("cpu"), args, 0.0)["commit"] == "0123456789abcdef"
    monkeypatch.delenv("CONV1D_SILU_COMMIT")
    assert bench.meta(torch.device("cpu"), args, 0.0)["commit"] != "0123456789abcdef"


def test_timer_alternates_the_callables_within_every_rep():
    # the same-run ratio's two sides take turns, so a drift during the row reaches both alike
    order = []
    timer = bench.Timer(torch.device("cpu"), reps=3, warmup=2, graph=False)
    runs = [timer.prepare(lambda: order.append("ref")), timer.prepare(lambda: order.append("ours"))]
    assert order == ["ref", "ref", "ours", "ours"]  # the warm-up calls
    ref, ours = timer.times(runs)
    assert order[4:] == ["ref", "ours"] * 3
    assert len(ref) == len(ours) == 3 and all(t >= 0 for t in ref + ours)


def test_same_run_ratio_uses_the_reference_timed_with_ours():
    result = bench.main(["--cpu", "--shapes", "64,16", "--reps", "3", "--warmup", "1", "--baselines", "eager",
                         "--no-host", "--calls", "fwd", "bwd"])
    rows = {(r["call"], r["impl"]): r for r in result["rows"]}
    for call, ref in bench.SAME_BYTES.items():
        ours, plain = rows[(call, "conv1d_silu")], rows[(ref, "torch_" + ref)]
        assert ours["same_run_ratio"] == pytest.approx(ours["median_us"] / plain["median_us"])


@pytest.mark.parametrize("bias", [False, True])
def test_determinism_check_runs_on_fresh_leaves(bias):
    from conv1d_silu import causal_conv1d_silu

    x, w = torch.randn(300, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    b = torch.randn(16, requires_grad=True) if bias else None
    assert bench._bitwise_repeatable(causal_conv1d_silu, x, w, b, torch.randn(300, 16))
    assert x.grad is None and w.grad is None  # the caller's leaves are left alone
    calls = []

    def drifting(x, w, b):  # a different result on every call is caught
        calls.append(1)
        return causal_conv1d_silu(x, w, b) * (1 + len(calls) * 1e-3)

    assert not bench._bitwise_repeatable(drifting, x, w, b, torch.randn(300, 16))


def test_host_overhead_reports_importable_peers_beside_ours(capsys):
    """The host line times each peer's tiny eager step beside ours and PyTorch's; a peer that
    fails at that size is left out with a note, not a crash."""

    def broken(x, w, b):
        raise RuntimeError("no kernel for this size")

    h = bench.host_overhead_us(
        torch.device("cpu"), iters=4, rounds=2, peers={"fla_triton": bench.torch_reference, "dao_cc1d": broken}
    )
    assert {"torch_x2_sum_backward", "conv1d_silu_fwd_bwd", "fla_triton_fwd_bwd"} <= set(h)
    assert "dao_cc1d_fwd_bwd" not in h and "dao_cc1d" in capsys.readouterr().err
    assert all(v > 0 for v in h.values())
    assert h["ratio"] == h["conv1d_silu_fwd_bwd"] / h["torch_x2_sum_backward"]
    meta = {"gpu": "cpu", "torch": torch.__version__, "commit": "", "dtype": "fp32", "K": 4,
            "copy_bandwidth_TBps": 1.0, "graph": False}
    line = bench.markdown({"meta": meta, "rows": [], "speedups": [], "host_overhead_us": h}).splitlines()[-1]
    assert "fla_triton" in line and "dao_cc1d" not in line


def test_markdown_counts_the_rows_within_the_issue_bounds():
    """Item 2's bounds per row: 1.3x copy / add below 65536 tokens, 1.10x from there, and from
    250000 tokens also 85 % of the copy bandwidth; combined calls and other impls are not judged."""

    def row(S, call, ratio, pct=90.0, impl="conv1d_silu"):
        return {"S": S, "C": 264, "call": call, "impl": impl, "median_us": 1.0, "same_run_ratio": ratio,
                "pct_copy_bw": pct, "deterministic": None}

    rows = [row(32768, "fwd", 1.29), row(32768, "bwd", 1.31), row(65536, "fwd", 1.10), row(65536, "bwd", 1.11),
            row(250340, "fwd", 1.05, pct=84.9), row(1048576, "bwd", 1.07), row(32768, "fwdbwd", 1.0),
            row(32768, "fwd", 9.0, impl="eager")]
    assert [bench.meets_target(r) for r in rows[:7]] == [True, False, True, False, False, True, None]
    meta = {"gpu": "cpu", "torch": torch.__version__, "commit": "", "dtype": "bf16", "K": 4,
            "copy_bandwidth_TBps": 1.0, "graph": True}
    text = bench.markdown({"meta": meta, "rows": rows, "speedups": []})
    assert "met in 3 of 6 forward and backward rows" in text
    assert "| 32768 | 264 | bwd | 1.0 | 1.31x | 90 | no |  |" in text.splitlines()
    assert "eager" not in text


@pytest.mark.timeout(300)
def test_host_ab_script_compares_the_tree_with_a_revision():
    """scripts/host_ab.py exports a revision's package beside the tree (op namespace renamed, so
    both register in one process) and times both with PyTorch's line."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=False, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / "host_ab.py"), "--rev", "HEAD", "--rounds", "1", "--calls", "2", "--noop"],
        check=False, capture_output=True, text=True, timeout=280,
    )
    assert out.returncode == 0, out.stderr
    assert "ours at HEAD" in out.stdout and "working tree / HEAD" in out.stdout
