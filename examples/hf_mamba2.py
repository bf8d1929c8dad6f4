"""Swap conv1d_silu into a Hugging Face Mamba2 model and compare a training step.

    python examples/hf_mamba2.py [--cuda]

Builds a tiny Mamba2ForCausalLM from a config (no download), makes a copy, routes the copy's
short convolution through conv1d_silu, runs one training step on both with the same batch, and
prints the two losses and the largest gradient differences.

What is replaced, exactly:

* transformers whose ``Mamba2Mixer.forward`` calls the module-level function
  ``transformers.models.mamba2.modeling_mamba2.causal_conv1d_fn`` (and ``causal_conv1d_update``
  for decoding): those two names are rebound to ``conv1d_silu.compat`` (a one-line change; the
  SiLU is fused into our kernel);
* older transformers whose ``torch_forward`` runs ``self.act(self.conv1d(x)[..., :L])``: each
  mixer's ``conv1d`` (an ``nn.Conv1d(C, C, K, groups=C, padding=K-1)``) becomes a
  ``CausalConv1dSiLU(..., activation=None, layout="BCL")`` holding the same parameters, and the
  mixer keeps applying its own SiLU.
"""

from __future__ import annotations

import argparse
import copy
import inspect

import torch

from conv1d_silu import CausalConv1dSiLU
from conv1d_silu import compat


def _hf_conv_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
    """transformers' causal_conv1d_fn signature on top of compat.causal_conv1d_fn."""
    return compat.causal_conv1d_fn(hidden_states, weight, bias, seq_idx=kwargs.get("seq_idx"), activation=activation)


def _hf_update_fn(hidden_states, conv_state, weight, bias=None, activation=None, **kwargs):
    return compat.causal_conv1d_update(hidden_states, conv_state, weight, bias, activation=activation)


def swap_in_conv1d_silu(model: torch.nn.Module):
    """Route the model's Mamba2 short convolutions through conv1d_silu. Returns (how, undo)."""
    import transformers.models.mamba2.modeling_mamba2 as hf

    if "causal_conv1d_fn(" in inspect.getsource(hf.Mamba2Mixer.forward):
        saved = hf.causal_conv1d_fn, hf.causal_conv1d_update
        hf.causal_conv1d_fn, hf.causal_conv1d_update = _hf_conv_fn, _hf_update_fn

        def undo():
            hf.causal_conv1d_fn, hf.causal_conv1d_update = saved

        return "rebound modeling_mamba2.causal_conv1d_fn / causal_conv1d_update to conv1d_silu.compat", undo
    for mixer in model.modules():
        if isinstance(mixer, hf.Mamba2Mixer):
            mixer.conv1d = CausalConv1dSiLU.from_conv1d(mixer.conv1d, activation=None, layout="BCL")
    return "replaced every Mamba2Mixer.conv1d by CausalConv1dSiLU(activation=None, layout='BCL')", lambda: None


def train_step(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=batch, labels=batch)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), grads


def main() -> dict:
    from transformers import Mamba2Config, Mamba2ForCausalLM

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cuda", action="store_true")
    args = p.parse_args()
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    config = Mamba2Config(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, state_size=16, head_dim=16, num_heads=8,
        n_groups=1, expand=2, conv_kernel=4, chunk_size=16,
    )
    reference = Mamba2ForCausalLM(config).to(device).train()
    swapped = copy.deepcopy(reference)
    batch = torch.randint(0, config.vocab_size, (2, 48), device=device)

    loss_ref, grads_ref = train_step(reference, batch)
    how, undo = swap_in_conv1d_silu(swapped)
    try:
        loss_ours, grads_ours = train_step(swapped, batch)
    finally:
        undo()
    worst = max(grads_ours, key=lambda n: (grads_ours[n] - grads_ref[n].view_as(grads_ours[n])).abs().max().item())
    diff = (grads_ours[worst] - grads_ref[worst].view_as(grads_ours[worst])).abs().max().item()
    print(f"swap: {how}")
    print(f"loss with nn.Conv1d / transformers' path: {loss_ref.item():.6f}")
    print(f"loss with conv1d_silu:                    {loss_ours.item():.6f}")
    print(f"max |grad difference| over {len(grads_ours)} parameters: {diff:.3g} ({worst})")
    return {"loss_ref": loss_ref.item(), "loss_ours": loss_ours.item(), "max_grad_diff": diff}


if __name__ == "__main__":
    main()
