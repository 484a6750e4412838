#!/usr/bin/env python3
"""Model-level training step (issue 36 item 2): a Llama-style decoder (RMSNorm pre-norm, causal attention with RoPE,
SwiGLU MLP, no biases, vocab 32000 embedding and bf16 LM head), sequence 2048, at two sizes, one training step
(forward, mean cross entropy of the float32 logits, backward, AdamW) per call.

  size   hidden  layers  heads  ffn   batch  parameters (embedding and LM head untied)
  125m   768     12      12     2048  8      134,105,856
  1b     2048    16      16     6144  4      1,003,554,816

Torch variants, every one from the same bf16 weights, in one run, timed interleaved (round i runs each variant's step
once, the order reversed on odd rounds; CUDA events around each step; speed-ups are medians of the per-round ratios):
  bf16 eager          baselines.TorchDecoder: torch.nn.Linear, F.scaled_dot_product_attention, torch.nn.RMSNorm;
  bf16 torch.compile  the same module compiled per block (each layer, and the final norm + LM head + loss, one
                      graph each, as torchtitan does: identical layers share one compiled graph, so compiling costs
                      one layer's time) — every compiled variant below is compiled the same way;
  torchao float8      torchao.float8.convert_to_float8_training on the plain model (every Linear but the LM head),
                      tensorwise and rowwise configs, compiled (as torchao recommends);
  ours                the same architecture with tex.TransformerLayer(normalization="RMSNorm", activation="swiglu",
                      bias=False, rotary_pos_emb) layers, under each recipe (FP8 delayed, FP8 current, FP8 block, MXFP8,
                      NVFP4), eager and compiled. The embedding, final norm and LM head are the same plain bf16
                      modules as the baseline's, outside tex.autocast.
Every variant uses torch.optim.AdamW(lr 3e-4, betas (0.9, 0.95), weight decay 0.01; fused on CUDA), and sees the same
batch every step (random tokens: the loss falls as the model memorises it).
Per variant: tokens/s, speed-up vs bf16 eager, bf16 torch.compile and torchao tensorwise, peak memory
(torch.cuda.max_memory_allocated from a reset before the variant is built to the end of its warm-up, above what was
allocated before: its weights, gradients, optimizer state, activations, quantized copies), and the loss of the first
and the last step. Validation (every variant runs the same steps on the same batch from the same weights): the first
loss, one forward from equal weights, within 1 % of the baseline's first (2 % MXFP8, 5 % NVFP4: the quantization
error alone), and the last loss finite and at least half as far below the first as the baseline's (the variant
learns). The last losses themselves are not compared: memorising one batch, the loss falls from 10.8 to ~1-5 in
twenty steps and two bf16 runs that differ only in rounding (eager and compiled) end tens of percent apart. A
variant that cannot run prints "skipped: <reason>" and the run goes on.

JAX (`--frameworks jax`, or the default run's second section): the same decoder from tej.flax.TransformerLayer
against plain Flax NNX bf16 (jax_model_peers.py: nnx.Linear, jax.nn.dot_product_attention, nnx.RMSNorm), one nnx.jit
train step (AdamW), ours under FP8 current and delayed scaling, MXFP8 and NVFP4. Each variant runs in a process of
its own (XLA's peak-memory counter cannot be reset, and torch and XLA must not share the GPU's memory), so these are
timed one after another, not interleaved: median of rounds of back-to-back steps and one wait.

Targets (H100's, stated for the 1B model): ours FP8 current scaling >= 1.3x bf16 torch.compile tokens/s (also shown
against eager) and >= 1.1x torchao float8 tensorwise; Flax FP8 (current, delayed) >= 1.3x plain Flax bf16.
Report: --out-dir (default benchmarks/results/model/) model.json, model.md, model.png.

Exit status: 0 when every variant ran and agreed with its baseline, 1 when one did not, 2 when the run could not start.
    python3 benchmarks/bench_model.py [--quick] [--sizes 125m 1b] [--frameworks torch jax] [--sequential]
                                      [--cpu-smoke]
"""
import argparse
import contextlib
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the JAX children share the GPU with this process
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # up to 14 models resident at once:
#                                                                                 no fragmentation between them

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402
from baselines import TorchDecoder, torch_decoder  # noqa: E402

VOCAB, SEQ, EPS = 32000, 2048, 1e-5
SIZES = {"125m": dict(hidden=768, layers=12, heads=12, ffn=2048, batch=8),
         "1b": dict(hidden=2048, layers=16, heads=16, ffn=6144, batch=4)}
SMOKE = dict(hidden=128, layers=2, heads=4, ffn=256, batch=2, vocab=512, seq=64)  # every dim a multiple of 32
RECIPES = {"fp8 delayed": "DelayedScaling", "fp8 current": "Float8CurrentScaling", "fp8 block": "Float8BlockScaling",
           "mxfp8": "MXFP8BlockScaling", "nvfp4": "NVFP4BlockScaling"}  # the formats sm_90 emulates last: built
#                                                                           last, they find the least memory left
NATIVE = {"mxfp8": "MXFP8Tensor", "nvfp4": "NVFP4Tensor"}  # the formats whose GEMM may be emulated (sm_90)
JAX_RECIPES = ("fp8 current", "fp8 delayed", "mxfp8", "nvfp4")
QUICK_JAX_RECIPES = ("fp8 current", "fp8 delayed")
EMULATED = "*"  # GEMMs dequantized to bf16 on devices without the format's native GEMM (SPEC 6.7): correct, not fast
ADAMW = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
LOSS_TOL = {"nvfp4": 0.05, "mxfp8": 0.02}  # relative distance of the first loss from the baseline's; 0.01 others
TARGETS = {"vs_compile": 1.3, "vs_eager": 1.3, "vs_torchao": 1.1, "flax": 1.3}
BASE_EAGER, BASE_COMPILE, BASE_TORCHAO = "bf16 eager", "bf16 torch.compile", "torchao float8 tensorwise (compile)"
BASELINES = (BASE_EAGER, BASE_COMPILE, BASE_TORCHAO)  # run whatever --only selects: the speed-ups need them
FLAX_BF16 = "flax bf16"


def size_config(size, args):
    """The decoder of `size` with this run's batch / sequence (tiny shapes under --cpu-smoke)."""
    cfg = dict(SIZES[size], vocab=VOCAB, seq=args.seq, eps=EPS)
    if args.cpu_smoke:
        cfg.update(SMOKE)
    if args.batch:
        cfg["batch"] = args.batch
    return cfg


def loss_tol(variant):
    return next((t for k, t in LOSS_TOL.items() if k in variant), 0.01)


# ----------------------------------------------------------------------------------------------------------
# Torch variants
# ----------------------------------------------------------------------------------------------------------
def emulated_star(key, device, smoke):
    """EMULATED when the device has no native GEMM for the recipe `key`'s format (MXFP8, NVFP4 on sm_90), else ''."""
    if key not in NATIVE or smoke or device != "cuda":
        return ""
    from transformer_engine_torch import _device

    return "" if NATIVE[key] in _device.native_gemm_formats(torch.cuda.current_device()) else EMULATED


def variants(device, smoke):
    """[(name, kind, recipe key or torchao recipe, compiled)] in the order they are built and reported."""
    out = [(BASE_EAGER, "bf16", None, False), (BASE_COMPILE, "bf16", None, True),
           (BASE_TORCHAO, "torchao", "tensorwise", True),
           ("torchao float8 rowwise (compile)", "torchao", "rowwise", True)]
    for key in RECIPES:
        star = emulated_star(key, device, smoke)
        for compiled in (False, True):
            out.append((f"ours {key}{star}" + (" (compile)" if compiled else ""), "ours", key, compiled))
    return out


def quick_skip(name, kind, key, compiled):
    """Why --quick (and --cpu-smoke) leave a variant out (None: it runs): the formats the device emulates, and our
    compiled forms but FP8 current's (the target's)."""
    if name.replace(" (compile)", "").endswith(EMULATED):
        return "skipped: --quick leaves out the formats this device emulates"
    if kind == "ours" and compiled and key != "fp8 current":
        return "skipped: --quick and --cpu-smoke compile only FP8 current of ours"
    return None


def ours_decoder(tex, ref, cfg, device):
    """TorchDecoder with tex.TransformerLayer layers ("bshd", causal, no dropout) holding `ref`'s weights; the
    embedding, final norm and LM head are copies of ref's."""
    layers = [tex.TransformerLayer(cfg["hidden"], cfg["ffn"], cfg["heads"], layernorm_epsilon=cfg["eps"],
                                   hidden_dropout=0.0, attention_dropout=0.0, self_attn_mask_type="causal",
                                   params_dtype=torch.bfloat16, bias=False, activation="swiglu",
                                   normalization="RMSNorm", device=device, attn_input_format="bshd")
              for _ in range(cfg["layers"])]
    model = TorchDecoder(cfg["vocab"], cfg["hidden"], cfg["heads"], cfg["seq"], layers, cfg["eps"], torch.bfloat16,
                         device)
    with torch.no_grad():
        for name in ("embed.weight", "norm.weight", "lm_head.weight"):
            model.get_parameter(name).copy_(ref.get_parameter(name))
        for ours, theirs in zip(model.layers, ref.layers):
            for dst, src in ((ours.self_attention.layernorm_qkv.layer_norm_weight, theirs.attn_norm.weight),
                             (ours.self_attention.layernorm_qkv.weight, theirs.qkv.weight),
                             (ours.self_attention.proj.weight, theirs.proj.weight),
                             (ours.layernorm_mlp.layer_norm_weight, theirs.mlp_norm.weight),
                             (ours.layernorm_mlp.fc1_weight, theirs.fc1.weight),
                             (ours.layernorm_mlp.fc2_weight, theirs.fc2.weight)):
                dst.copy_(src)
    return model


def torchao_decoder(ref, recipe_name, smoke):
    """A copy of the plain decoder with torchao's Float8Linear in place of every Linear but the LM head (kept in bf16,
    as ours). On the CPU torchao's emulated GEMM (its _scaled_mm is CUDA only)."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe_name)
    if smoke:
        config = dataclasses.replace(config, emulate=True)
    model = copy.deepcopy(ref)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    return model


class Contender:
    """One variant's model, optimizer and step. step() runs forward (inside tex.autocast for ours), backward,
    AdamW and zero_grad(set_to_none) so no gradient stays between steps; the loss of the latest step is kept on the
    device (read once, at the end)."""

    def __init__(self, tex, model, recipe, tokens, targets, device):
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), fused=str(device).startswith("cuda"), **ADAMW)
        self.context = (lambda: tex.autocast(recipe=recipe)) if recipe is not None else contextlib.nullcontext
        self.tokens, self.targets = tokens, targets
        self.last = None

    def step(self):
        with self.context():
            loss = self.model(self.tokens, self.targets)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.last = loss.detach()


def build(tex, spec, ref, cfg, args, device, ao_why):
    """The Contender of one variant spec (raises what building it raised)."""
    name, kind, key, compiled = spec
    recipe = None
    if kind == "bf16":
        model = copy.deepcopy(ref)
    elif kind == "torchao":
        if ao_why:
            raise RuntimeError(ao_why)
        model = torchao_decoder(ref, key, args.cpu_smoke)
    else:
        recipe = getattr(tex, RECIPES[key])()
        model = ours_decoder(tex, ref, cfg, device)
    if compiled:
        # --cpu-smoke: dynamo's trace only (backend "eager"): Inductor's CPU compile is minutes on a small host
        model.compile_blocks(dynamic=False, **({"backend": "eager"} if args.cpu_smoke else {}))
    return Contender(tex, model, recipe, *args.batch_tokens, device)


def empty_row(size, cfg, name, params):
    tokens = cfg["batch"] * cfg["seq"]
    return {"framework": "torch", "size": size, "variant": name, "params": params, "batch": cfg["batch"],
            "tokens_per_step": tokens, "step_ms": None, "tok_s": None, "vs_eager": None, "vs_compile": None,
            "vs_torchao": None, "peak_gb": None, "loss_first": None, "loss_last": None, "loss_rel": None,
            "valid": True, "status": ""}


def prepare(tex, spec, ref, cfg, args, device, row, ao_why):
    """Build one variant, run its warm-up steps (compiling) and record its first loss and peak memory. Returns the
    Contender, or None after marking the row skipped."""
    base = H.cuda_memory_reset(device)
    c = None
    try:
        c = build(tex, spec, ref, cfg, args, device, ao_why)
        c.step()
        row["loss_first"] = c.last.item()
        for _ in range(args.warmup - 1):
            c.step()
        peak = H.cuda_memory_peak(device, base)
        row["peak_gb"] = None if peak is None else peak / 1e9
        if not torch.isfinite(c.last).item():
            raise FloatingPointError(f"loss {c.last.item()} after {args.warmup} steps")
        return c
    except Exception as e:
        oom = isinstance(e, torch.cuda.OutOfMemoryError)
        why = (("out of memory" + ("" if args.sequential else " with the earlier variants resident (--sequential "
                                   "times each alone)")) if oom else f"{type(e).__name__}: {first_line(e)}")
        # an environment limit (no torchao) is not a failure of ours; anything else raised by a variant is
        row["valid"] = spec[1] == "torchao" and ao_why is not None
        row["status"] = f"skipped: {why}"
        H.log(f"SKIP  {row['size']} {spec[0]}: {why}")
        del c
        H.release(device)
        return None


def first_line(e):
    return (str(e).strip().splitlines() or [""])[0][:200]


def run_size(tex, size, args, device):
    """Rows of the torch variants of one size."""
    cfg = size_config(size, args)
    ref = torch_decoder(cfg, torch.bfloat16, device)
    params = sum(p.numel() for p in ref.parameters())
    g = torch.Generator(device="cpu").manual_seed(1)
    data = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g).to(device)
    args.batch_tokens = (data[:, :-1].contiguous(), data[:, 1:].contiguous())
    _, ao_why = H.import_torchao()
    if ao_why:
        ao_why = f"torchao unavailable: {ao_why}"
    H.log(f"{size}: {params:,} parameters, batch {cfg['batch']} x seq {cfg['seq']}")
    rows, ready = [], {}
    for spec in variants(device, args.cpu_smoke):
        if args.only and spec[0] not in BASELINES and not any(s in spec[0] for s in args.only):
            continue
        row = empty_row(size, cfg, spec[0], params)
        rows.append(row)
        why = quick_skip(*spec) if args.quick or args.cpu_smoke else None
        if why:
            row["status"] = why
            continue
        c = prepare(tex, spec, ref, cfg, args, device, row, ao_why)
        if c is None:
            continue
        if args.sequential:
            row["step_ms"] = H.step_ms(c.step, args.iters, device, warmup=0)
            row["loss_last"] = c.last.item()
            del c
            H.release(device)
        else:
            ready[spec[0]] = c
        H.log(f"ready {size} {spec[0]}: first loss {row['loss_first']:.4f}"
              + ("" if row["peak_gb"] is None else f", peak {row['peak_gb']:.2f} GB")
              + ("" if row["step_ms"] is None else f", {row['step_ms']:.2f} ms"))
    times, oom = {}, False
    if ready:
        H.log(f"{size}: timing {len(ready)} variants interleaved, {args.iters} rounds")
        try:
            times = H.interleaved({n: c.step for n, c in ready.items()}, args.iters, warmup=0, device=device,
                                  flush=False)
        except torch.cuda.OutOfMemoryError:
            oom = True
        for r in rows:
            if r["variant"] in ready and not oom:
                r["step_ms"] = statistics.median(times[r["variant"]]) / 1e3
                r["loss_last"] = ready[r["variant"]].last.item()
    ready.clear()
    del ref, data
    args.batch_tokens = None
    H.release(device)
    if oom:  # every variant fitted alongside the others while it was built, but not all of them while timing
        H.log(f"{size}: out of memory while timing interleaved: building and timing each variant alone instead")
        args.sequential = True
        return run_size(tex, size, args, device)
    finish_rows(rows, times)
    return rows


def finish_rows(rows, times):
    """tokens/s, the speed-ups (medians of per-round ratios when timed interleaved, else ratios of the medians) and
    the loss check against bf16 eager."""
    by = {r["variant"]: r for r in rows}
    eager = by.get(BASE_EAGER)
    for r in rows:
        if r["step_ms"] is None:
            continue
        r["tok_s"] = r["tokens_per_step"] / (r["step_ms"] / 1e3)
        for key, base in (("vs_eager", BASE_EAGER), ("vs_compile", BASE_COMPILE), ("vs_torchao", BASE_TORCHAO)):
            b = by.get(base)
            if b is None or b["step_ms"] is None:
                continue
            if r["variant"] in times and base in times:
                r[key] = statistics.median(H.pair_ratios(times, r["variant"], base))
            else:
                r[key] = b["step_ms"] / r["step_ms"]
        check_loss(r, eager)


def check_loss(r, base):
    """The first loss within loss_tol of the baseline's (one forward from the same weights: the quantization error);
    the last loss finite and at least half as far below the first as the baseline's (the variant learns)."""
    import math
    if r["loss_last"] is None:
        return
    if not math.isfinite(r["loss_last"]):
        r["valid"], r["status"] = False, f"FAILED: last loss {r['loss_last']}"
        return
    if base is None or base["loss_last"] is None or r is base:
        r["status"] = r["status"] or "ok"
        return
    r["loss_rel"] = abs(r["loss_first"] - base["loss_first"]) / abs(base["loss_first"])
    tol = loss_tol(r["variant"])
    drop, base_drop = r["loss_first"] - r["loss_last"], base["loss_first"] - base["loss_last"]
    if r["loss_rel"] > tol:
        r["valid"] = False
        r["status"] = f"FAILED: first loss {100 * r['loss_rel']:.2f} % from the baseline's (allowed {100 * tol:.0f} %)"
    elif drop < 0.5 * base_drop:
        r["valid"] = False
        r["status"] = f"FAILED: the loss fell by {drop:.3f}, under half the baseline's {base_drop:.3f}"
    else:
        r["status"] = "ok"


# ----------------------------------------------------------------------------------------------------------
# JAX section: one child process per variant
# ----------------------------------------------------------------------------------------------------------
def jax_variants(args):
    keys = QUICK_JAX_RECIPES if args.quick or args.cpu_smoke else JAX_RECIPES
    return [FLAX_BF16] + [f"ours {k}" for k in keys]


def jax_child(args):
    """Run the JAX variants of --jax-child (names joined by ',') of --sizes[0], one after another, and write their
    rows (a JSON list) to --child-out."""
    if args.cpu_smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"
    rows = [jax_variant(name, args) for name in args.jax_child.split(",")]
    with open(args.child_out, "w") as f:
        json.dump(rows, f)
    return 0


def jax_variant(name, args):
    """The row of one JAX variant: build, warm up (the first step compiles), time, read the peak memory."""
    import jax

    size = args.sizes[0]
    cfg = size_config(size, args)
    dev = jax.devices()[0]

    def in_use():
        stats = dev.memory_stats() or {}
        return stats.get("bytes_in_use"), stats.get("peak_bytes_in_use")

    base, _ = in_use()
    row = {"framework": "jax", "size": size, "variant": name, "batch": cfg["batch"],
           "tokens_per_step": cfg["batch"] * cfg["seq"], "valid": True, "status": "ok"}
    call, state, row["params"] = jax_build(name, cfg)
    row["loss_first"] = float(call())
    for _ in range(args.warmup - 1):
        call()
    jax.block_until_ready(state["loss"])
    rounds = 3
    per_round = max(1, args.iters // rounds)
    us = [H.stream_us(call, jax.block_until_ready, per_round) for _ in range(rounds)]
    row["step_ms"] = statistics.median(us) / 1e3
    row["loss_last"] = float(state["loss"])
    _, peak = in_use()
    row["peak_gb"] = None if peak is None or base is None else (peak - base) / 1e9
    row["jax"] = jax.__version__
    return row


def jax_build(name, cfg):
    """(call, state, parameter count) of one JAX variant: call() runs one training step (nnx.jit, AdamW) on a fixed
    batch and returns its loss; state["loss"] holds the latest. Also tools/prof_model_jax.py's builder."""
    import jax
    import jax.numpy as jnp
    import jax_model_peers as PM
    from flax import nnx

    plain = PM.plain_decoder(cfg)
    params = int(sum(v.get_value().size for _, v in nnx.to_flat_state(nnx.state(plain, nnx.Param))))
    if name == FLAX_BF16:
        model, step = plain, PM.train_step()
    else:
        if H.REPO_ROOT not in sys.path:
            sys.path.insert(0, H.REPO_ROOT)  # the in-place build
        import transformer_engine_jax as tej
        recipe = getattr(tej, RECIPES[name[len("ours "):]])()
        model = tej_decoder(tej, nnx, jnp, PM, recipe, plain, cfg)
        del plain
        delayed = isinstance(recipe, tej.DelayedScaling)
        step = PM.train_step(context=lambda: tej.autocast(recipe=recipe),
                             which=nnx.Any(nnx.Param, tej.flax.FP8Meta) if delayed else nnx.Param,
                             after_grad=tej.flax.update_fp8_meta if delayed else None)
    opt = PM.adamw_init(nnx.state(model, nnx.Param))
    data = jax.random.randint(jax.random.PRNGKey(1), (cfg["batch"], cfg["seq"] + 1), 0, cfg["vocab"])
    x, y = data[:, :-1], data[:, 1:]
    state = {"opt": opt, "loss": None}

    def call():
        state["loss"], state["opt"] = step(model, state["opt"], x, y)
        return state["loss"]

    return call, state, params


def tej_decoder(tej, nnx, jnp, PM, recipe, plain, cfg):
    """jax_model_peers.Decoder with tej.flax.TransformerLayer layers (RMSNorm, SwiGLU = ("silu", "linear"), RoPE with
    the "alternate" pairing, logits scaled by 1/sqrt(head_dim), no biases) built under the recipe (so that delayed
    scaling's FP8Meta exists), holding the plain model's weights."""
    h, f = cfg["hidden"], cfg["ffn"]
    with tej.autocast(recipe=recipe):
        layers = [tej.flax.TransformerLayer(h, f, cfg["heads"], layernorm_type="rmsnorm", layernorm_epsilon=cfg["eps"],
                                            mlp_activations=("silu", "linear"), use_bias=False,
                                            self_attn_mask_type="causal", enable_rotary_pos_emb=True,
                                            rotary_pos_emb_group_method="alternate", scale_attn_logits=True,
                                            scaled_query_init=False, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                                            rngs=nnx.Rngs(0))
                  for _ in range(cfg["layers"])]
    model = PM.Decoder(cfg["vocab"], h, cfg["eps"], layers, nnx.Rngs(0))
    model.embed.embedding.set_value(plain.embed.embedding.get_value())
    model.norm.scale.set_value(plain.norm.scale.get_value())
    model.lm_head.kernel.set_value(plain.lm_head.kernel.get_value())
    for ours, theirs in zip(model.layers, plain.layers):
        ours.attention.qkv.scale.set_value(theirs.attn_norm.scale.get_value())
        ours.attention.qkv.kernel.set_value(theirs.qkv.kernel.get_value().reshape(h, 3, h))
        ours.attention.out.kernel.set_value(theirs.out.kernel.get_value())
        ours.mlp.scale.set_value(theirs.mlp_norm.scale.get_value())
        ours.mlp.wi_kernel.set_value(theirs.wi.kernel.get_value().reshape(h, 2, f))
        ours.mlp.wo_kernel.set_value(theirs.wo.kernel.get_value())
    return model


def run_jax(size, args, device):
    """Rows of the JAX variants of one size, each from a child process of this script (under --cpu-smoke, where no
    peak memory is read, one child runs them all); the formats the device emulates marked as on the torch side."""
    rows = []
    names = [n for n in jax_variants(args) if not args.only or n == FLAX_BF16 or any(s in n for s in args.only)]
    for name in [",".join(names)] if args.cpu_smoke else names:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--jax-child", name, "--sizes", size, "--child-out", out,
                   "--iters", str(args.iters), "--warmup", str(args.warmup), "--seq", str(args.seq)]
            cmd += (["--batch", str(args.batch)] if args.batch else []) + (["--cpu-smoke"] if args.cpu_smoke else [])
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [H.REPO_ROOT,
                                                                            os.environ.get("PYTHONPATH")])))
            H.log(f"jax {size} {name}: child process")
            try:
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.child_timeout)
                if r.returncode == 0 and os.path.exists(out):
                    with open(out) as f:
                        rows += json.load(f)
                    continue
                tail = [ln for ln in (r.stderr or r.stdout).strip().splitlines() if ln.strip()][-1:] or ["no output"]
                why = f"child exited {r.returncode}: {tail[0][:200]}"
            except subprocess.TimeoutExpired:
                why = f"child ran past {args.child_timeout} s"
        for n in name.split(","):
            H.log(f"SKIP  jax {size} {n}: {why}")
            rows.append({"framework": "jax", "size": size, "variant": n, "step_ms": None,
                         "valid": "No module named 'flax'" in why, "status": f"skipped: {why}"})
    for r in rows:
        r["variant"] += emulated_star(r["variant"][len("ours "):], device, args.cpu_smoke)
    base = next((r for r in rows if r["variant"] == FLAX_BF16), None)
    for r in rows:
        if r.get("step_ms"):
            r["tok_s"] = r["tokens_per_step"] / (r["step_ms"] / 1e3)
            if base is not None and base.get("step_ms"):
                r["vs_flax"] = base["step_ms"] / r["step_ms"]
            check_loss(r, base)
    return rows


# ----------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------
TORCH_COLUMNS = [("size", "size", "{}"), ("variant", "variant", "{}"), ("step ms", "step_ms", "{:.1f}"),
                 ("tokens/s", "tok_s", "{:,.0f}"), ("vs eager", "vs_eager", "{:.2f}x"),
                 ("vs compile", "vs_compile", "{:.2f}x"), ("vs torchao tw", "vs_torchao", "{:.2f}x"),
                 ("peak GB", "peak_gb", "{:.2f}"), ("loss first", "loss_first", "{:.4f}"),
                 ("loss last", "loss_last", "{:.4f}"), ("status", "status", "{}")]
JAX_COLUMNS = [("size", "size", "{}"), ("variant", "variant", "{}"), ("step ms", "step_ms", "{:.1f}"),
               ("tokens/s", "tok_s", "{:,.0f}"), ("vs flax bf16", "vs_flax", "{:.2f}x"),
               ("peak GB", "peak_gb", "{:.2f}"), ("loss first", "loss_first", "{:.4f}"),
               ("loss last", "loss_last", "{:.4f}"), ("status", "status", "{}")]


def evaluate_targets(report, sizes_run):
    """The 1B targets; NOT MEASURED when the 1B model did not run (--quick)."""
    rows = [r for r in report.rows if r["size"] == "1b"]
    ours = [r for r in rows if r["framework"] == "torch" and r["variant"].startswith("ours fp8 current")
            and r.get("step_ms")]
    best = min(ours, key=lambda r: r["step_ms"]) if ours else None
    which = f" ({best['variant']}, the faster form)" if best else ""
    why = None if "1b" in sizes_run else "1b not run"
    for key, peer in (("vs_compile", "bf16 torch.compile"), ("vs_eager", "bf16 eager"),
                      ("vs_torchao", "torchao float8 tensorwise")):
        label = f"1b: ours fp8 current{which} tokens/s >= {TARGETS[key]}x {peer}"
        if why:
            report.target(label, "NOT MEASURED", why, f">= {TARGETS[key]}x")
        else:
            report.at_least(label, best and best.get(key), TARGETS[key], "{:.2f}x", f">= {TARGETS[key]}x")
    for k in QUICK_JAX_RECIPES:
        r = next((r for r in rows if r["framework"] == "jax" and r["variant"] == f"ours {k}"), None)
        label = f"1b: Flax ours {k} tokens/s >= {TARGETS['flax']}x plain Flax bf16"
        if why:
            report.target(label, "NOT MEASURED", why, f">= {TARGETS['flax']}x")
        else:
            report.at_least(label, r and r.get("vs_flax"), TARGETS["flax"], "{:.2f}x", f">= {TARGETS['flax']}x")


def queue_plot(report):
    done = [r for r in report.rows if r.get("step_ms")]
    if not done:
        return
    names = list(dict.fromkeys(f"{r['framework']}: {r['variant']}" for r in done))
    sizes = list(dict.fromkeys(r["size"] for r in done))
    by = {(f"{r['framework']}: {r['variant']}", r["size"]): r for r in done}

    def series(key, unit):
        return {s: [by[(n, s)][key] / unit if (n, s) in by and by[(n, s)].get(key) is not None else None
                    for n in names] for s in sizes}

    def draw(fig):
        for i, (key, unit, label) in enumerate((("tok_s", 1e3, "thousand tokens/s (higher is better)"),
                                                ("peak_gb", 1.0, "peak memory, GB (above what the run held "
                                                                 "before the variant)"))):
            ax = fig.add_subplot(1, 2, i + 1)
            H.grouped_bars(ax, names, series(key, unit), horizontal=True, value_fmt="{:.1f}")
            ax.set_xlabel(label, fontsize=8)
            ax.grid(axis="x", alpha=0.3)
            if i == 0:
                ax.legend(fontsize=7)
            else:
                ax.set_yticklabels([])
        fig.suptitle(f"Llama-style decoder training step (seq {report.meta['seq']}); {EMULATED} = GEMMs emulated "
                     f"(no native kernel on this device)", fontsize=10)

    report.plot("model", draw, figsize=(14, 0.3 * len(names) * max(1, len(sizes)) + 2))


def report_name(args):
    """'model' for the full run, else what part it is ('model_quick', 'model_1b_torch', ...), so that the parts of a
    run split over several commands do not overwrite each other."""
    parts = ["model"] + (["quick"] if args.quick else [])
    if not args.quick and not args.cpu_smoke and args.sizes != list(SIZES):
        parts += args.sizes
    if len(args.frameworks) == 1:
        parts += args.frameworks
    return "_".join(parts)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="125m only, 8 timed steps; leaves out emulated formats and compiles only ours' FP8 current; "
                        "JAX: FP8 current and delayed")
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    p.add_argument("--frameworks", nargs="+", choices=("torch", "jax"), default=["torch", "jax"])
    p.add_argument("--jax", action="store_true", help="the JAX section only (--frameworks jax)")
    p.add_argument("--batch", type=int, help="sequences per step for every size (default: 8 for 125m, 4 for 1b)")
    p.add_argument("--seq", type=int, default=SEQ)
    p.add_argument("--iters", type=int, default=20, help="timed steps per variant (torch: interleaved rounds)")
    p.add_argument("--warmup", type=int, default=3, help="steps before timing (the first one compiles)")
    p.add_argument("--sequential", action="store_true",
                   help="torch: build, time and free each variant in turn (not interleaved; for when every variant "
                        "of a size does not fit in memory at once)")
    p.add_argument("--only", action="append", default=[], metavar="SUBSTR",
                   help="variants whose name holds SUBSTR, and the baselines (repeatable)")
    p.add_argument("--child-timeout", type=int, default=900, help="seconds for each JAX child process")
    p.add_argument("--jax-child", metavar="VARIANT", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    H.add_output_args(p)
    args = p.parse_args(argv)
    if args.jax:
        args.frameworks = ["jax"]
    if args.quick:
        args.sizes, args.iters = ["125m"], min(args.iters, 8)
    if args.cpu_smoke:  # --quick's variants (but the formats it emulates on sm_90), tiny shapes, 1 + 2 steps
        args.sizes, args.iters, args.warmup = ["125m"], 2, 1
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.jax_child:
        return jax_child(args)
    t_start = time.perf_counter()
    device, tex = H.start(args, "bench_model")
    if tex is None:
        return 2
    # Every compiled variant adds entries to the same code objects' caches (TorchDecoderLayer.forward,
    # TransformerLayer.forward, TorchDecoder.tail: per variant, size, and per layer where modules are not inlined);
    # past dynamo's limits (8 per code object) the later ones would silently run eagerly.
    for limit, value in (("cache_size_limit", 256), ("recompile_limit", 256), ("accumulated_cache_size_limit", 2048),
                         ("accumulated_recompile_limit", 2048)):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, value)
    name = H.device_name(device)
    seq = SMOKE["seq"] if args.cpu_smoke else args.seq
    report = H.Report(report_name(args), {"device": name, "sizes": args.sizes, "frameworks": args.frameworks,
                                          "seq": seq,
                                "iters": args.iters, "warmup": args.warmup, "quick": args.quick,
                                "sequential": args.sequential, "cpu_smoke": args.cpu_smoke,
                                "optimizer": f"AdamW {ADAMW}",
                                "configs": {s: size_config(s, args) for s in args.sizes}})
    H.log(f"device {name}, torch {torch.__version__}, sizes {args.sizes}, frameworks {args.frameworks}")
    for size in args.sizes:
        if "torch" in args.frameworks:
            report.rows += run_size(tex, size, args, device)
        if "jax" in args.frameworks:
            report.rows += run_jax(size, args, device)
    torch_rows = [r for r in report.rows if r["framework"] == "torch"]
    jax_rows = [r for r in report.rows if r["framework"] == "jax"]
    report.emit()
    report.emit(f"Llama-style decoder training step (forward, cross entropy, backward, AdamW), seq {seq}, {name}. "
                f"Parameters: " + ", ".join(f"{s} {n:,}" for s, n in dict.fromkeys(
                    (r["size"], r["params"]) for r in report.rows if r.get("params"))))
    if torch_rows:
        report.emit(f"\nTorch ({'each variant alone' if args.sequential else 'interleaved'}: step ms = median of "
                    f"{args.iters} steps, speed-ups = median of the per-round ratios; peak GB = "
                    f"torch.cuda.max_memory_allocated above what was allocated before the variant; {EMULATED} = "
                    f"GEMMs emulated):")
        report.table(TORCH_COLUMNS, torch_rows, valid_key="shown")
    if jax_rows:
        report.emit("\nJAX (one process per variant, timed one after another: step ms = median of 3 rounds of "
                    "back-to-back steps; peak GB = the device's peak_bytes_in_use in that process):")
        report.table(JAX_COLUMNS, jax_rows, valid_key="shown")
    evaluate_targets(report, args.sizes)
    report.print_targets(f"Targets (issue 36; H100's targets, this run on {name}):")
    report.summary("variants", time.perf_counter() - t_start, args.cpu_smoke)
    queue_plot(report)
    report.meta["sequential"] = args.sequential  # set by an interleaved timing that ran out of memory
    default = os.path.join(H.RESULTS_ROOT, "cpu" if args.cpu_smoke else "model")
    out_dir = None if args.no_save else args.out_dir or (None if args.only and not args.cpu_smoke else default)
    report.save(out_dir, json_path=args.json)
    return 0 if all(r["valid"] for r in report.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
