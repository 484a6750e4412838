#!/usr/bin/env python3
"""RoPE inside a decoder layer's attention, forward + backward, per formulation (pure torch, CUDA): where the 1B
model step's 0.43 ms per layer of RoPE backward goes (tools/prof_model.py). Each variant maps the packed QKV GEMM
output [b, s, h, 3, d] to SDPA's q, k, v, runs causal SDPA and a backward from a fixed gradient, eager and compiled;
prints ms per call and the max difference of dqkv from variant A (eager).

    python tools/rope_probe.py [--b 4] [--s 2048] [--h 16] [--d 128]
"""
import argparse

import torch
import torch.nn.functional as F


def rot(t):
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat((-t2, t1), dim=-1)


def rot_t(t):  # the transpose of rot: rot_t(rot(x)) = x
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat((t2, -t1), dim=-1)


def tables(freqs, s, dtype):  # [1, s, 1, d] cos and sin in t's dtype (bshd)
    f = freqs[:s].transpose(0, 1)
    return f.cos().to(dtype), f.sin().to(dtype)


def attn(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)


def var_a(qkv, freqs):  # today's tex.transformer.apply_rotary_pos_emb
    q, k, v = qkv.unbind(3)
    cos, sin = tables(freqs, qkv.shape[1], qkv.dtype)
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    return attn(q, k, v)


class Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, cos, sin):
        ctx.save_for_backward(cos, sin)
        return t * cos + rot(t) * sin

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return g * cos + rot_t(g * sin), None, None


def var_b(qkv, freqs):  # autograd.Function, tables from freqs inside
    q, k, v = qkv.unbind(3)
    cos, sin = tables(freqs, qkv.shape[1], qkv.dtype)
    return attn(Rope.apply(q, cos, sin), Rope.apply(k, cos, sin), v)


def var_c(qkv, cos, sin):  # tables computed outside the compiled region
    q, k, v = qkv.unbind(3)
    return attn(Rope.apply(q, cos, sin), Rope.apply(k, cos, sin), v)


class RopeQKV(torch.autograd.Function):
    """Packed qkv [b, s, h, 3, d] -> rotated q, k and v; backward writes dqkv in one torch.stack."""

    @staticmethod
    def forward(ctx, qkv, cos, sin):
        ctx.save_for_backward(cos, sin)
        q, k, v = qkv.unbind(3)
        return q * cos + rot(q) * sin, k * cos + rot(k) * sin, v

    @staticmethod
    def backward(ctx, gq, gk, gv):
        cos, sin = ctx.saved_tensors
        return torch.stack((gq * cos + rot_t(gq * sin), gk * cos + rot_t(gk * sin), gv), dim=3), None, None


def var_d(qkv, cos, sin):
    return attn(*RopeQKV.apply(qkv, cos, sin))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--s", type=int, default=2048)
    ap.add_argument("--h", type=int, default=16)
    ap.add_argument("--d", type=int, default=128)
    a = ap.parse_args()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    base = torch.randn(a.b, a.s, a.h * 3 * a.d, device=dev, dtype=torch.bfloat16, generator=g)
    gout = torch.randn(a.b, a.h, a.s, a.d, device=dev, dtype=torch.bfloat16, generator=g)
    inv = 10000.0 ** (-torch.arange(0, a.d, 2, dtype=torch.float32, device=dev) / a.d)
    f = torch.outer(torch.arange(a.s, dtype=torch.float32, device=dev), inv)
    freqs = torch.cat((f, f), dim=-1)[:, None, None, :]
    cos, sin = tables(freqs, a.s, torch.bfloat16)
    cases = {"A today": (var_a, freqs), "B Function": (var_b, freqs), "C Function, tables outside": (var_c, None),
             "D packed Function, tables outside": (var_d, None)}

    def run(fn, extra):
        x = base.detach().requires_grad_(True)
        qkv = x.view(a.b, a.s, a.h, 3, a.d)
        out = fn(qkv, extra) if extra is not None else fn(qkv, cos, sin)
        out.backward(gout)
        return x.grad

    ref = run(var_a, freqs)
    for name, (fn, extra) in cases.items():
        for compiled in (False, True):
            f_ = torch.compile(fn) if compiled else fn
            try:
                for _ in range(3):
                    dq = run(f_, extra)
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(10):
                    run(f_, extra)
                e.record()
                torch.cuda.synchronize()
                diff = (dq.float() - ref.float()).abs().max().item()
                print(f"{name:36s} {'compile' if compiled else 'eager  '} {s.elapsed_time(e) / 10:8.3f} ms "
                      f"(max |dqkv - A eager| {diff:.3g})", flush=True)
            except Exception as ex:  # noqa: BLE001
                print(f"{name:36s} {'compile' if compiled else 'eager'} failed: {type(ex).__name__}: {ex}"[:300])
    # SDPA alone, for the floor
    q = torch.randn(a.b, a.h, a.s, a.d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn_like(q).requires_grad_(True) for _ in range(2))
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(gout)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(gout)
    e.record()
    torch.cuda.synchronize()
    print(f"{'SDPA alone (no RoPE, no packing)':36s} eager   {s.elapsed_time(e) / 10:8.3f} ms")


if __name__ == "__main__":
    main()
