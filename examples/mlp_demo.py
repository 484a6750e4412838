"""Demo: a small real training run with tex layers, in bf16 and then in each FP8 recipe, losses side by side.

Model: tex.Linear -> tex.MLP(gelu) -> tex.MLP(swiglu) -> tex.Linear, trained with AdamW on a synthetic regression
task (a fixed random teacher network plus noise). The same initial weights and data for every run; inside
`tex.autocast(recipe=...)` every GEMM runs quantized (fprop TN, dgrad NN, wgrad NT through tex.generic_gemm), the
MLP activations come out of the fused kernel already quantized for the next GEMM. Runs on the GPU when one is
visible, else on the CPU (smaller model, same numerics; the CPU GEMM is a reference implementation, not a fast one).
"""
import time

import torch
import torch.nn.functional as F

import transformer_engine_torch as tex


def build(hidden, ffn, device):
    return torch.nn.Sequential(
        tex.Linear(hidden, hidden, device=device),
        tex.MLP(hidden, ffn, activation="gelu", device=device),
        tex.MLP(hidden, ffn, activation="swiglu", device=device),
        tex.Linear(hidden, hidden, device=device),
    )


def run(recipe, init, teacher, cfg, device):
    hidden, ffn, batch, steps = cfg
    model = build(hidden, ffn, device)
    model.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    g = torch.Generator(device=device).manual_seed(1)
    losses = []
    for step in range(steps):
        if step == 2:  # time steady-state steps only
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        x = torch.randn(batch, hidden, device=device, generator=g)
        with torch.no_grad():
            target = teacher(x) + 0.1 * torch.randn(batch, hidden, device=device, generator=g)
        with torch.autocast(device, dtype=torch.bfloat16), tex.autocast(enabled=recipe is not None, recipe=recipe):
            y = model(x)
        loss = F.mse_loss(y.float(), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if device == "cuda":
        torch.cuda.synchronize()
    return losses, (time.perf_counter() - t0) / (steps - 2)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = (1024, 4096, 4096, 300) if device == "cuda" else (64, 128, 64, 60)
    hidden, ffn, batch, steps = cfg
    torch.manual_seed(0)
    init = build(hidden, ffn, device).state_dict()
    teacher = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
                                  torch.nn.Linear(hidden, hidden)).to(device)
    recipes = {
        "bf16": None,
        "FP8 delayed": tex.DelayedScaling(amax_history_len=16),
        "FP8 current": tex.Float8CurrentScaling(),
        "MXFP8": tex.MXFP8BlockScaling(),
    }
    print(f"device {device}; model Linear({hidden}) -> MLP({hidden}, {ffn}, gelu) -> MLP({hidden}, {ffn}, swiglu) -> "
          f"Linear({hidden}); batch {batch}; {steps} steps of AdamW; bf16 autocast")
    results = {}
    for name, recipe in recipes.items():
        results[name] = run(recipe, init, teacher, cfg, device)
    names = list(results)
    print("step  " + "".join(f"{n:>14s}" for n in names))
    every = max(steps // 10, 1)
    for s in list(range(0, steps, every)) + [steps - 1]:
        print(f"{s:4d}  " + "".join(f"{results[n][0][s]:14.5f}" for n in names))
    base = sum(results["bf16"][0][-10:]) / 10
    print("final loss (mean of the last 10 steps), relative to bf16, and time per step:")
    for n in names:
        final = sum(results[n][0][-10:]) / 10
        print(f"  {n:12s} {final:.5f}  ({(final / base - 1) * 100:+6.2f} %)  {results[n][1] * 1e3:8.2f} ms/step")


if __name__ == "__main__":
    main()
