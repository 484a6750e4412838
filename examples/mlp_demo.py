"""Demo: an nn.Module MLP whose activation is `tex.gelu(x, fp8_quantizer)`, trained forward and backward.

The fused kernel writes GELU's output already quantized to FP8 (one pass over the input, delayed scaling:
amax recorded in place, scale refreshed each step from the amax history). The second Linear consumes the
dequantized activation here; the FP8 GEMMs that take it directly come with the GEMM layer. Runs on the GPU
when one is visible, else on the CPU with the same numerics.
"""
import time

import torch

import transformer_engine_torch as tex


class FP8Gelu(torch.autograd.Function):
    """y = gelu(x) through the fused GELU->FP8 kernel; backward through tex.dgelu."""

    @staticmethod
    def forward(ctx, x, quantizer):
        ctx.save_for_backward(x)
        y_fp8 = tex.gelu(x, quantizer)  # a tex.Float8Tensor: uint8 codes + scale_inv (+ transposed copy)
        return y_fp8.dequantize()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return tex.dgelu(grad.contiguous(), x, None), None


class MLP(torch.nn.Module):
    def __init__(self, hidden, ffn, device, history=16):
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, ffn, device=device)
        self.fc2 = torch.nn.Linear(ffn, hidden, device=device)
        # Delayed-scaling state of the activation: scale, amax history (row 0 is written by the kernel).
        self.register_buffer("scale", torch.ones(1, device=device))
        self.register_buffer("amax_history", torch.zeros(history, 1, device=device))
        self.quantizer = tex.Float8Quantizer(self.scale, self.amax_history[0], tex.DType.kFloat8E4M3,
                                             rowwise=True, columnwise=False)

    def forward(self, x):
        return self.fc2(FP8Gelu.apply(self.fc1(x), self.quantizer))

    def update_scale(self):
        tex.fused_amax_and_scale_update_after_reduction(None, [self.amax_history], [self.scale], "max",
                                                        tex.DType.kFloat8E4M3, 0)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    hidden, ffn, batch, steps = (1024, 4096, 4096, 200) if device == "cuda" else (64, 256, 256, 150)
    model = MLP(hidden, ffn, device)
    teacher = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.Tanh()).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    print(f"device: {device}; MLP {hidden} -> {ffn} -> {hidden}, activation tex.gelu(x, Float8Quantizer E4M3)")
    t0 = time.perf_counter()
    for step in range(steps):
        x = torch.randn(batch, hidden, device=device)
        with torch.no_grad():
            target = teacher(x)
        loss = torch.nn.functional.mse_loss(model(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        model.update_scale()
        if step % 25 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.5f}  fp8 scale {model.scale.item():9.3f}  "
                  f"amax(last) {model.amax_history[-1].item():.3f}")
    dt = (time.perf_counter() - t0) / steps
    x = torch.randn(8, hidden, device=device)
    y_fp8 = tex.gelu(model.fc1(x), model.quantizer)
    print(f"activation as FP8: {y_fp8}, bytes {y_fp8._data.dtype}, scale_inv {y_fp8._scale_inv.item():.6f}")
    print(f"done: {steps} steps, {dt * 1e3:.2f} ms/step, final loss {loss.item():.5f}")


if __name__ == "__main__":
    main()
