"""Swap conv1d_silu into a Hugging Face Mamba2 model: the same loss, gradients and decoding.

    python examples/hf_mamba2.py [--cuda]

Builds a tiny Mamba2ForCausalLM from a config (no download), makes a copy, routes the copy's
short convolution through conv1d_silu, then runs on both one training step on the same batch and
a few greedy decoding steps, and prints the loss, the largest gradient and logit differences, and
how many calls went through conv1d_silu. On the CPU the comparison is our CPU path against
transformers' PyTorch fallback; with ``--cuda``, our kernels against whatever transformers runs.

How the copy is routed (transformers 4.57 and 5.x):

* every ``Mamba2Mixer.conv1d`` (``nn.Conv1d(C, C, K, groups=C, padding=K-1)``) becomes a
  ``CausalConv1dSiLU(..., activation=None, layout="BCL")`` holding the same parameters. It carries
  nn.Conv1d's attributes, which transformers reads (``conv1d.weight``, ``conv1d.bias``,
  ``conv1d.kernel_size[0]``); releases whose PyTorch path runs ``self.act(self.conv1d(x)[..., :L])``
  call it, and the mixer keeps applying its own SiLU.
* the modeling module's functions ``causal_conv1d_fn`` / ``causal_conv1d_update`` are rebound to
  ``conv1d_silu.compat``'s (which fuse the SiLU). transformers 5.x looks them up as module globals
  at each call, on every device; its hub-kernel decorator, which the rebinding replaces, passes an
  implementation only the keyword arguments its signature names, and so does the rebound one.
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import inspect

import torch

from conv1d_silu import CausalConv1dSiLU, compat

CONV_FUNCTIONS = ("causal_conv1d_fn", "causal_conv1d_update")


def _called_like_a_hub_kernel(fn, calls: collections.Counter):
    """``fn`` taking only the keywords its signature names (transformers passes its model kwargs,
    e.g. ``position_ids``, to every implementation), counting its calls."""
    names = inspect.signature(fn).parameters

    @functools.wraps(fn)
    def call(*args, **kwargs):
        calls[fn.__name__] += 1
        return fn(*args, **{k: v for k, v in kwargs.items() if k in names})

    return call


def swap_in_conv1d_silu(model: torch.nn.Module, calls: collections.Counter):
    """Route the model's Mamba2 short convolutions through conv1d_silu, counting the calls into
    ``calls``. Returns (what was done, undo)."""
    import transformers.models.mamba2.modeling_mamba2 as hf

    def count_module_call(module, args, output):
        calls["CausalConv1dSiLU"] += 1

    done = []
    for mixer in model.modules():
        if isinstance(mixer, hf.Mamba2Mixer):
            mixer.conv1d = CausalConv1dSiLU.from_conv1d(mixer.conv1d, activation=None, layout="BCL")
            mixer.conv1d.register_forward_hook(count_module_call)
            done.append("Mamba2Mixer.conv1d -> CausalConv1dSiLU(activation=None, layout='BCL')")
    saved = {name: getattr(hf, name) for name in CONV_FUNCTIONS if hasattr(hf, name)}
    for name in saved:
        setattr(hf, name, _called_like_a_hub_kernel(getattr(compat, name), calls))
        done.append(f"modeling_mamba2.{name} -> conv1d_silu.compat.{name}")

    def undo():
        for name, fn in saved.items():
            setattr(hf, name, fn)

    return sorted(set(done)), undo


def train_step(model, batch):
    model.train().zero_grad(set_to_none=True)
    out = model(input_ids=batch, labels=batch)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), grads


def decode(model, prompt, steps):
    """Greedy decoding: the tokens and the logits of the prefill and of each decoding step."""
    out = model.eval().generate(
        prompt, max_new_tokens=steps, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    return out.sequences, torch.stack(out.logits)


def main() -> dict:
    import transformers
    from transformers import Mamba2Config, Mamba2ForCausalLM

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cuda", action="store_true")
    args = p.parse_args()
    transformers.logging.set_verbosity_error()  # its notes on PyTorch fallbacks of the reference
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    config = Mamba2Config(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, state_size=16, head_dim=16, num_heads=8,
        n_groups=1, expand=2, conv_kernel=4, chunk_size=16, pad_token_id=0,
    )
    reference = Mamba2ForCausalLM(config).to(device)
    swapped = copy.deepcopy(reference)
    batch = torch.randint(1, config.vocab_size, (2, 48), device=device)
    prompt, steps = batch[:, :6], 4

    loss_ref, grads_ref = train_step(reference, batch)
    tokens_ref, logits_ref = decode(reference, prompt, steps)
    calls = collections.Counter()
    done, undo = swap_in_conv1d_silu(swapped, calls)
    try:
        loss_ours, grads_ours = train_step(swapped, batch)
        calls_train = dict(calls)
        calls.clear()
        tokens_ours, logits_ours = decode(swapped, prompt, steps)
    finally:
        undo()

    def diff(a, b):
        return (a - b.view_as(a)).abs().max().item()

    assert grads_ours.keys() == grads_ref.keys()
    worst = max(grads_ours, key=lambda n: diff(grads_ours[n], grads_ref[n]))
    result = {
        "loss_ref": loss_ref.item(),
        "loss_ours": loss_ours.item(),
        "max_grad_diff": diff(grads_ours[worst], grads_ref[worst]),
        "same_tokens": torch.equal(tokens_ours, tokens_ref),
        "max_logit_diff": diff(logits_ours, logits_ref),
        "calls_train": calls_train,
        "calls_decode": dict(calls),
    }
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {device}")
    print("swap: " + "; ".join(done))
    print(f"loss with transformers' convolution: {result['loss_ref']:.6f}")
    print(f"loss with conv1d_silu:               {result['loss_ours']:.6f}")
    print(f"max |grad difference| over {len(grads_ours)} parameters: {result['max_grad_diff']:.3g} ({worst})")
    print(f"greedy decoding of {steps} tokens: same tokens {result['same_tokens']}, "
          f"max |logit difference| {result['max_logit_diff']:.3g}")
    print(f"calls through conv1d_silu: training {result['calls_train']}, decoding {result['calls_decode']}")
    return result


if __name__ == "__main__":
    main()
