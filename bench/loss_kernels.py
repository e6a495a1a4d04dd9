"""The loss of one rocmft step at its own shape, four ways, on one GPU (issue 32's "chunked/fused loss"; not a test).

Run from the repository root on a GPU host (the peer's wheels on PYTHONPATH add Unsloth's and cut_cross_entropy's
rows; without them those rows say why they are missing)::

    python3 bench/loss_kernels.py --out OUT [--tokens 8192] [--hidden 3584] [--vocab 152064] [--labels 0.6]

The step's shape: ``tokens`` hidden states (rocmft's planned 4 rows x 2048 on the 7B shape; bench/throughput.py),
``hidden`` x ``vocab`` lm_head (Qwen2-7B), bf16, lm_head frozen as under LoRA (only the hidden states' gradient is
computed), a share ``labels`` of the tokens with labels (the others -100: prompts and padding), the loss the mean
over labelled tokens. For each way, forward + backward of the loss alone: the median of ``--repeats`` timings
(CUDA events, after 3 warm-up calls that also compile Triton kernels), the peak memory above the inputs, and the
loss and gradient against an fp32 reference (torch on fp32 logits):

* ``torch``: ``lm_head`` then ``F.cross_entropy`` on fp32 logits (what runs without Liger: the T x V logits);
* ``liger``: liger-kernel's ``LigerFusedLinearCrossEntropyLoss`` (what LLaMA-Factory 0.9.5's ``enable_liger_kernel``
  applies to Qwen2 for SFT, the planner's choice: rocmft.render.planner);
* ``cce``: cut_cross_entropy's ``linear_cross_entropy`` (Apple's Cut Cross-Entropy; in Unsloth's wheel set);
* ``unsloth``: unsloth_zoo's ``unsloth_fused_ce_loss`` (what Unsloth 2026.10.9 calls for Qwen2 in training:
  unsloth/models/llama.py line 2122), ``shift_labels=False`` since the labels here are already aligned.

Writes OUT/loss_kernels.json; exit 1 without a GPU (the message says so), 0 otherwise (a way that fails to import
or run is a row with its error).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def _ways():
    """name -> (hidden, weight, labels) -> mean loss; imports happen at the call (a missing package is a row)."""
    import torch

    def plain(h, w, y):
        return torch.nn.functional.cross_entropy((h @ w.T).float(), y, ignore_index=-100)

    def liger(h, w, y):
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        return LigerFusedLinearCrossEntropyLoss(ignore_index=-100)(w, h, y)

    def cce(h, w, y):
        from cut_cross_entropy import linear_cross_entropy

        return linear_cross_entropy(h, w, y, ignore_index=-100)

    def unsloth(h, w, y):
        from unsloth_zoo.fused_losses.cross_entropy_loss import unsloth_fused_ce_loss

        return unsloth_fused_ce_loss(None, h.unsqueeze(0), w, None, y.unsqueeze(0), shift_labels=False)

    return {"torch": plain, "liger": liger, "cce": cce, "unsloth": unsloth}


def measure(way, h, w, y, reference, repeats: int) -> dict:
    """Median ms of forward + backward, peak MiB above the inputs, |loss - reference| and the gradient's largest
    relative difference from the reference's (fp32)."""
    import torch

    def once():
        h.grad = None
        loss = way(h, w, y)
        loss.backward()
        return loss

    for _ in range(3):
        loss = once()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = once()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    loss_ref, grad_ref = reference
    grad_err = ((h.grad.float() - grad_ref).abs().max() / grad_ref.abs().max()).item()
    return {"ms": round(statistics.median(times), 3), "ms_min": round(min(times), 3),
            "peak_mib_above_inputs": round((torch.cuda.max_memory_allocated() - base) / 2**20, 1),
            "loss": round(loss.item(), 5), "loss_abs_diff": abs(loss.item() - loss_ref),
            "grad_max_rel_diff": grad_err}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=3584)
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--labels", type=float, default=0.6, help="share of tokens with a label (0 < x <= 1)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--ways", default="torch,liger,cce,unsloth")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench/loss_kernels.py: no GPU (torch.cuda.is_available() is False); run it on a GPU host",
              file=sys.stderr)  # fmt: skip
        return 1
    if not 0 < args.labels <= 1:
        parser.error(f"--labels {args.labels}: give the share of labelled tokens, 0 < x <= 1")
    generator = torch.Generator(device="cuda").manual_seed(0)
    h = (torch.randn(args.tokens, args.hidden, device="cuda", generator=generator) * 1.0).bfloat16()
    w = (torch.randn(args.vocab, args.hidden, device="cuda", generator=generator) * 0.02).bfloat16()
    y = torch.randint(0, args.vocab, (args.tokens,), device="cuda", generator=generator)
    y[torch.rand(args.tokens, device="cuda", generator=generator) >= args.labels] = -100
    ref_h = h.float().requires_grad_()
    ref_loss = torch.nn.functional.cross_entropy(ref_h @ w.float().T, y, ignore_index=-100)
    ref_loss.backward()
    reference = (ref_loss.item(), ref_h.grad.detach())
    del ref_h, ref_loss
    torch.cuda.empty_cache()
    h.requires_grad_()
    rows = {}
    for name in args.ways.split(","):
        try:
            rows[name] = measure(_ways()[name], h, w, y, reference, args.repeats)
        except Exception as err:  # a benchmark row, not the product: say what failed and go on
            rows[name] = {"error": f"{type(err).__name__}: {err}"[:400]}
        torch.cuda.empty_cache()
        print(name, json.dumps(rows[name]), flush=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": args.tokens,
              "hidden": args.hidden, "vocab": args.vocab, "labelled_share": args.labels, "reference_loss":
              reference[0], "ways": rows}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loss_kernels.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
