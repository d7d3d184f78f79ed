"""Mixed-precision casts in a training step: bf16 weight copies, a fused fp16 overflow check for
dynamic loss scaling, and stochastic rounding for bf16 master weights.

Run: python examples/mixed_precision_cast.py
"""

import shardwise
import torch


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    params = list(model.parameters())

    # One call casts every fp32 master parameter into its bf16 compute copy.
    copies = [torch.empty_like(p, dtype=torch.bfloat16) for p in params]
    shardwise.multi_cast_([p.detach() for p in params], copies)
    print("bf16 copies:", [tuple(c.shape) for c in copies])

    # Loss scaling: cast gradients to fp16 for communication and learn, in the same pass,
    # whether the scale overflowed them.
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    scale = 2.0**20
    (torch.nn.functional.mse_loss(model(x), y) * scale).backward()
    grads16 = [torch.empty_like(p, dtype=torch.float16) for p in params]
    overflow = shardwise.multi_cast_([p.grad for p in params], grads16)
    print(f"loss scale 2^20: overflow in fp16 gradients = {bool(overflow)}")

    # Stochastic rounding keeps small updates to bf16 weights unbiased on average.
    w = torch.full((100_000,), 1.0)
    update = torch.full_like(w, 1e-3)  # below half a bf16 ulp at 1.0 (2^-8)
    rne = shardwise.cast(w + update, torch.bfloat16).float().mean().item()
    sr = shardwise.cast_stochastic_bf16(w + update, seed=0).float().mean().item()
    print(f"1 + 1e-3 in bf16: round-to-nearest mean {rne:.6f}, stochastic mean {sr:.6f}")


if __name__ == "__main__":
    main()
