"""conv1d_silu.compat.install(): ``import causal_conv1d`` (its submodules, ``find_spec``, metadata and
version gates) served by compat, as mamba_ssm, fla, transformers and Megatron look for it."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from conv1d_silu import compat
from conv1d_silu.compat import shim

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def installed():
    compat.install()
    yield
    compat.uninstall()


SURFACE = {  # what the callers and causal-conv1d's own tests import
    "causal_conv1d": ("causal_conv1d_fn", "causal_conv1d_update"),
    "causal_conv1d.causal_conv1d_interface": (
        "causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_ref", "causal_conv1d_update_ref",
    ),
    "causal_conv1d.cpp_functions": (
        "causal_conv1d_fwd_function", "causal_conv1d_bwd_function", "causal_conv1d_update_function",
    ),
    "causal_conv1d.causal_conv1d_varlen": ("causal_conv1d_varlen_states", "causal_conv1d_varlen_states_ref"),
}


def test_import_surface(installed):
    """Every name the callers import is compat's own function."""
    for module, names in SURFACE.items():
        for name in names:
            assert getattr(importlib.import_module(module), name) is getattr(compat, name), (module, name)
    import causal_conv1d
    from causal_conv1d.cpp_functions import causal_conv1d_bwd_function

    assert causal_conv1d.__version__ == compat.VERSION
    assert causal_conv1d.cpp_functions.causal_conv1d_bwd_function is causal_conv1d_bwd_function


def test_find_spec_and_metadata(installed):
    """transformers: find_spec (a sys.modules entry needs __spec__) and importlib.metadata.version."""
    for name in shim.MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is shim.FINDER and sys.modules[name].__spec__ is spec
    assert importlib.metadata.version("causal_conv1d") == compat.VERSION
    assert importlib.metadata.version("causal-conv1d") == compat.VERSION
    assert "causal_conv1d" in importlib.metadata.packages_distributions()["causal_conv1d"]
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("no-such-distribution-conv1d-silu")


def test_version_gates():
    """Megatron's gates: packed training (1.4.0), packed inference (1.5.3.post1), deterministic mode
    (1.6.0) pass. The version stays causal-conv1d's 1.6.1, whose semantics compat matches; it also
    takes seq_idx with initial_states (1.7.0's packed rows with states, which Megatron's context
    parallelism gates on 1.7.0)."""
    version = pytest.importorskip("packaging.version").Version
    ours = version(compat.VERSION)
    assert ours >= version("1.4.0") and ours >= version("1.5.3.post1") and ours >= version("1.6.0")
    assert ours < version("1.7.0")


def test_install_twice_then_uninstall_restores():
    meta_path, modules = list(sys.meta_path), set(sys.modules)
    compat.install()
    first = sys.modules["causal_conv1d"]
    compat.install()
    assert sys.meta_path.count(shim.FINDER) == 1 and sys.modules["causal_conv1d"] is first
    compat.uninstall()
    assert sys.meta_path == meta_path and set(sys.modules) == modules
    spec = importlib.util.find_spec("causal_conv1d")
    assert spec is None or spec.loader is not shim.FINDER


def test_refuses_a_real_causal_conv1d(monkeypatch):
    meta_path = list(sys.meta_path)
    monkeypatch.setitem(sys.modules, "causal_conv1d", types.ModuleType("causal_conv1d"))
    with pytest.raises(RuntimeError, match="already imported"):
        compat.install()
    assert sys.meta_path == meta_path


def test_warns_when_a_caller_was_imported_first(monkeypatch):
    monkeypatch.setitem(sys.modules, "mamba_ssm", types.ModuleType("mamba_ssm"))
    try:
        with pytest.warns(UserWarning, match="mamba_ssm"):
            compat.install()
    finally:
        compat.uninstall()


def test_shimmed_calls_run(installed):
    from causal_conv1d import causal_conv1d_fn
    from causal_conv1d.cpp_functions import causal_conv1d_bwd_function

    x = torch.randn(2, 8, 10).requires_grad_()
    w = torch.randn(8, 4)
    causal_conv1d_fn(x, w, activation="silu").sum().backward()
    dx, *_ = causal_conv1d_bwd_function(
        x.detach(), w, None, torch.ones(2, 8, 10), None, None, None, None, False, True
    )
    assert torch.equal(dx, x.grad)


TRANSFORMERS_RUN = """
import functools, sys, torch
calls = {}
if sys.argv[1] == "shim":
    import conv1d_silu.compat
    conv1d_silu.compat.install()
    import causal_conv1d
    from transformers.integrations import hub_kernels
    # the shim serves CPU tensors too
    hub_kernels._PACKAGE_SUPPORTED_DEVICES["causal_conv1d"] = ("cuda", "cpu")
    for name in ("causal_conv1d_fn", "causal_conv1d_update"):
        def counted(*args, __f=getattr(causal_conv1d, name), __name=name, **kwargs):
            calls[__name] = calls.get(__name, 0) + 1
            return __f(*args, **kwargs)
        setattr(causal_conv1d, name, functools.wraps(getattr(causal_conv1d, name))(counted))
from transformers import Mamba2Config, Mamba2ForCausalLM
torch.manual_seed(0)
config = Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2, head_dim=8,
                      num_heads=8, n_groups=1, conv_kernel=4, chunk_size=8)
model = Mamba2ForCausalLM(config).eval()
with torch.no_grad():
    out = model.generate(torch.randint(0, 64, (2, 11)), max_new_tokens=4, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
torch.save((torch.stack(out.logits), calls), sys.argv[2])
"""


def test_transformers_mamba2_generates_through_the_shim(tmp_path):
    """transformers' Mamba2 (prefill through causal_conv1d_fn, decode through causal_conv1d_update)
    generates the same logits through the shim as through its own PyTorch path."""
    import transformers
    from packaging.version import Version
    from transformers.integrations import hub_kernels  # a test dependency: fail, never skip

    if not hasattr(hub_kernels, "_PACKAGE_SUPPORTED_DEVICES") and Version(transformers.__version__) < Version("5.25"):
        # CI installs a current transformers, where the test runs; an older one (a GPU machine's
        # preinstalled 5.17) has no per-package device list to open its hub-kernel route to CPU tensors
        pytest.skip(f"transformers {transformers.__version__} routes causal-conv1d to CUDA tensors only")

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    results = {}
    for mode in ("torch", "shim"):
        path = tmp_path / f"{mode}.pt"
        subprocess.run(
            [sys.executable, "-c", TRANSFORMERS_RUN, mode, str(path)], check=True, env=env, cwd=tmp_path
        )
        results[mode] = torch.load(path)
    (want, _), (got, calls) = results["torch"], results["shim"]
    assert calls.get("causal_conv1d_fn", 0) >= 2 and calls.get("causal_conv1d_update", 0) >= 2, calls
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


FLA_RUN = r"""
import sys

import conv1d_silu.compat

conv1d_silu.compat.install()
import torch
import torch.nn.functional as F
from fla.modules import ShortConvolution
import fla.modules.causal_conv1d.backends.cuda.ops as cuda_ops

assert cuda_ops.causal_conv1d_fn_cuda.__module__.startswith("conv1d_silu"), cuda_ops.causal_conv1d_fn_cuda.__module__


def oracle(x, w, b, spans):  # float64 per document of (T, D) tokens
    out = []
    for a, e in spans:
        z = F.conv1d(F.pad(x[a:e].double().t()[None], (w.shape[1] - 1, 0)), w.double()[:, None], b.double(),
                     groups=w.shape[0])
        out.append(F.silu(z)[0].t())
    return torch.cat(out)


bad = []
for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 6e-2)):
    D, W = 384, 4
    torch.manual_seed(1)
    ours = ShortConvolution(D, W, bias=True, backend="cuda", device="cuda", dtype=dtype)
    triton = ShortConvolution(D, W, bias=True, backend="triton", device="cuda", dtype=dtype)
    triton.load_state_dict(ours.state_dict())
    assert ours.backend == "cuda", "the shim did not provide causal_conv1d_fn"
    w, b = ours.weight[:, 0].detach(), ours.bias.detach()
    for label, B, T, cu in (("batch", 3, 700, None), ("cu_seqlens", 1, 1000, [0, 17, 400, 401, 1000])):
        x = torch.randn(B, T, D, device="cuda", dtype=dtype)
        dy = torch.randn(B, T, D, device="cuda", dtype=dtype)
        cu_t = None if cu is None else torch.tensor(cu, device="cuda", dtype=torch.int64)  # fla's LongTensor
        got = []
        for m in (ours, triton):
            xi = x.clone().requires_grad_()
            m.zero_grad()
            y, _ = m(xi, cu_seqlens=cu_t)
            y.backward(dy)
            got.append((y, xi.grad, m.weight.grad[:, 0], m.bias.grad))
        spans = [(0, T)] if cu is None else list(zip(cu[:-1], cu[1:]))
        leaves = [t.double().requires_grad_() for t in (x.reshape(-1, D), w, b)]
        ref = torch.cat([oracle(leaves[0][r * T:(r + 1) * T], leaves[1], leaves[2], spans) for r in range(B)])
        refs = (ref, *torch.autograd.grad(ref, leaves, dy.reshape(-1, D).double()))
        for i, name in enumerate(("y", "dx", "dweight", "dbias")):
            scale = 1.0 if i < 2 else max(1.0, refs[i].abs().max().item() / 10)
            d_ours = (got[0][i].reshape(refs[i].shape).double() - refs[i]).abs().max().item()
            d_triton = (got[1][i].reshape(refs[i].shape).double() - refs[i]).abs().max().item()
            print(f"{dtype} {label} {name}: ours {d_ours:.3g}, fla triton {d_triton:.3g} (against float64)")
            if d_ours > max(tol * scale, 2 * d_triton):
                bad.append(f"{dtype} {label} {name}")
    with torch.no_grad():  # decoding: a prefill's cache, then steps of one token
        x = torch.randn(2, 26, D, device="cuda", dtype=dtype)
        runs = []
        for m in (ours, triton):
            _, cache = m(x[:, :20], output_final_state=True)
            ys = []
            for t in range(20, 26):
                y, cache = m(x[:, t:t + 1], cache=cache, output_final_state=True)
                ys.append(y)
            runs.append((torch.cat(ys, 1), cache))
        ref = torch.stack([oracle(x[r], w, b, [(0, 26)])[20:] for r in range(2)])
        d_ours, d_triton = ((r[0].double() - ref).abs().max().item() for r in runs)
        print(f"{dtype} decode y: ours {d_ours:.3g}, fla triton {d_triton:.3g}")
        if d_ours > max(tol, 2 * d_triton) or not torch.equal(runs[0][1], runs[1][1]):
            bad.append(f"{dtype} decode")
sys.exit(f"mismatch: {bad}" if bad else 0)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's Triton backend, the reference here, needs a GPU")
def test_fla_short_convolution_cuda_backend_through_the_shim(tmp_path):
    """flash-linear-attention's ShortConvolution(backend="cuda") on the shim, against its Triton
    backend and float64: forward, backward, int64 cu_seqlens and decoding from a prefill's cache
    (fla's calls are also replayed without fla in test_compat_cpp.py, so CI guards them too)."""
    pytest.importorskip("fla")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", FLA_RUN], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


def test_harness_runs_a_test_file_against_the_shim(tmp_path):
    """tools/test_against_causal_conv1d.sh installs the shim before pytest imports the file, from a
    plugin given by -p, which pytest-xdist's workers load too (a shim installed only in the process
    that starts pytest leaves every worker's import of causal_conv1d failing)."""
    test_file = tmp_path / "test_uses_causal_conv1d.py"
    test_file.write_text(
        "from causal_conv1d.cpp_functions import causal_conv1d_fwd_function\n\n"
        "def test_served_by_conv1d_silu(pytestconfig):\n"
        "    assert causal_conv1d_fwd_function.__module__ == 'conv1d_silu.compat.cpp_functions'\n"
        "    assert pytestconfig.pluginmanager.has_plugin('conv1d_silu_as_causal_conv1d')\n"
    )
    harness = ROOT / "tools" / "test_against_causal_conv1d.sh"
    run = subprocess.run([str(harness), str(test_file), "-q"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
    usage = subprocess.run([str(harness)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage" in usage.stderr
