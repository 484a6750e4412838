"""Trains a byte-level GPT end to end in Flax NNX with tej's layers, on the Python standard library's sources
(examples/stdlib_text.py: real text, no download, a fixed held-out split).

The model: a token embedding [256, hidden], `--layers` × `tej.flax.TransformerLayer` (pre-norm, causal self attention
through jax.nn.dot_product_attention, rotary positions, GELU MLP of 4·hidden), a final `tej.flax.LayerNorm` and an
LM head in bf16 that no recipe quantizes (an nnx.Linear, or the embedding transposed with --tie). The transformer
layers compute in bf16 and quantize their GEMMs as `--recipe` says (tej.autocast, entered while the step is traced
and while the model is built, so that delayed scaling's FP8Meta state exists from the start). One nnx.jit'ed step:
loss and gradients of parameters and FP8Meta, `tej.flax.update_fp8_meta`, optax AdamW.

Checkpoints: `--save PATH` writes model (parameters + FP8Meta) and optimizer (moments + step) with
`tej.flax.save_state`; `--resume PATH` restores them and continues at the saved step. Step i's batch is drawn from
`np.random.default_rng((seed, i))`, so a resumed run sees the same data and its steps are bit-identical to an
uninterrupted run's.

`--tp N`: a ("dp", "tp") mesh over the visible devices (N along tp); the attention's qkv and the MLP's wi kernels are
sharded column parallel on "tp", out's and wo's row parallel, the batch along "dp". On the CPU:
XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/train_gpt_jax.py --tiny --tp 2

    python examples/train_gpt_jax.py --tiny                          # CPU, well under a minute
    python examples/train_gpt_jax.py --recipe delayed --steps 2000   # GPU
"""
import argparse
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import stdlib_text  # noqa: E402
import transformer_engine_jax as tej  # noqa: E402

RECIPES = {"bf16": None, "delayed": tej.DelayedScaling(), "current": tej.Float8CurrentScaling(),
           "mxfp8": tej.MXFP8BlockScaling(), "nvfp4": tej.NVFP4BlockScaling(), "fp8_block": tej.Float8BlockScaling()}
# Tensor-parallel layout of a TransformerLayer's kernels (state path suffix -> spec); everything else is replicated.
TP_SPECS = {("attention", "qkv", "kernel"): P(None, None, "tp"), ("attention", "out", "kernel"): P("tp", None),
            ("mlp", "wi_kernel"): P(None, None, "tp"), ("mlp", "wo_kernel"): P("tp", None)}
TINY = dict(steps=100, layers=2, hidden=32, heads=2, seq=64, batch=8, lr=1e-2)
EVAL_BATCHES = 4


class GPT(nnx.Module):
    """tokens int [B, T] -> logits float32 [B, T, 256]."""

    def __init__(self, layers, hidden, heads, *, tie, rngs):
        self.embed = nnx.Embed(stdlib_text.VOCAB, hidden, embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
        self.layers = nnx.List([tej.flax.TransformerLayer(hidden, 4 * hidden, heads, mlp_activations=("gelu",),
                                                          enable_rotary_pos_emb=True, dtype=jnp.bfloat16, rngs=rngs)
                                for _ in range(layers)])
        self.norm = tej.flax.LayerNorm(hidden, rngs=rngs)
        self.head = None if tie else nnx.Linear(hidden, stdlib_text.VOCAB, use_bias=False, dtype=jnp.bfloat16,
                                                rngs=rngs)

    def __call__(self, tokens):
        h = self.embed(tokens).astype(jnp.bfloat16)
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h).astype(jnp.bfloat16)
        if self.head is None:   # tied: the embedding transposed, in bf16
            return (h @ self.embed.embedding.get_value().astype(jnp.bfloat16).T).astype(jnp.float32)
        return self.head(h).astype(jnp.float32)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="bf16")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--tie", action="store_true", help="LM head = the token embedding transposed")
    ap.add_argument("--tiny", action="store_true", help=f"a CPU-sized run: {TINY} (explicit flags override)")
    ap.add_argument("--tp", type=int, default=1, help="devices along the tensor-parallel mesh axis")
    ap.add_argument("--save", metavar="PATH", help="write a checkpoint (.npz) at the end")
    ap.add_argument("--resume", metavar="PATH", help="continue from a checkpoint that --save wrote")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=0, help="progress line every N steps (default: steps / 10)")
    args = ap.parse_args(argv)
    if args.tiny:   # the tiny sizes, except for flags given explicitly
        given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in (argv or sys.argv[1:]) if a.startswith("--")}
        for k, v in TINY.items():
            if k not in given:
                setattr(args, k, v)
    return args


def make_mesh(tp: int, batch: int) -> Mesh:
    devices = jax.devices()
    if tp < 1 or len(devices) % tp:
        raise SystemExit(f"--tp {tp}: the {len(devices)} visible devices must split evenly into tp groups")
    dp = len(devices) // tp
    if batch % dp:
        raise SystemExit(f"--batch {batch} must be a multiple of the data-parallel size {dp} "
                         f"({len(devices)} devices / --tp {tp})")
    return Mesh(np.array(devices).reshape(dp, tp), ("dp", "tp"))


def shard(model: nnx.Module, mesh: Mesh) -> None:
    """Places every variable of `model` on `mesh`: TP_SPECS's kernels sharded on "tp", the rest replicated."""
    placed = []
    for path, var in nnx.to_flat_state(nnx.state(model)):
        spec = next((s for suffix, s in TP_SPECS.items() if tuple(map(str, path[-len(suffix):])) == suffix), P())
        placed.append((path, var.replace(jax.tree_util.tree_map(
            lambda a: jax.device_put(a, NamedSharding(mesh, spec if a.ndim == len(spec) else P())),
            var.get_value()))))
    nnx.update(model, nnx.from_flat_state(placed))


def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def make_step(recipe):
    diff = nnx.DiffState(0, nnx.Any(nnx.Param, tej.flax.FP8Meta))

    @nnx.jit
    def train_step(model, optimizer, x, y):
        with tej.autocast(enabled=recipe is not None, recipe=recipe):
            loss, grads = nnx.value_and_grad(loss_fn, argnums=diff)(model, x, y)
        grads = tej.flax.update_fp8_meta(model, grads)
        optimizer.update(model, grads)
        return loss

    @nnx.jit
    def eval_loss(model, x, y):
        with tej.autocast(enabled=recipe is not None, recipe=recipe):
            return loss_fn(model, x, y)

    return train_step, eval_loss


def peak_memory() -> str:
    stats = jax.devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
    return f"{stats['peak_bytes_in_use'] / 2**20:.0f} MiB" if stats and "peak_bytes_in_use" in stats else "n/a"


def main(argv=None) -> dict:
    """Trains; returns {"train_loss", "heldout_loss", "tokens_per_s", "losses"} (losses: this run's per step)."""
    args = parse(argv)
    recipe = RECIPES[args.recipe]
    mesh = make_mesh(args.tp, args.batch)
    train, heldout = stdlib_text.load(max_bytes=1 << 20 if args.tiny else 0)
    put = lambda a: jax.device_put(jnp.asarray(a, jnp.int32), NamedSharding(mesh, P("dp")))  # noqa: E731
    eval_rng = np.random.default_rng((args.seed, 1 << 30))
    eval_set = [tuple(map(put, stdlib_text.batch(heldout, args.batch, args.seq, eval_rng)))
                for _ in range(EVAL_BATCHES)]

    with tej.autocast(enabled=recipe is not None, recipe=recipe):   # delayed scaling's FP8Meta from the start
        model = GPT(args.layers, args.hidden, args.heads, tie=args.tie, rngs=nnx.Rngs(args.seed))
    shard(model, mesh)
    optimizer = nnx.Optimizer(model, optax.adamw(args.lr, weight_decay=0.01), wrt=nnx.Param)
    if args.resume:
        tej.flax.load_state(args.resume, model=model, optimizer=optimizer)
    start = int(optimizer.step.get_value())
    train_step, eval_loss = make_step(recipe)
    n_params = sum(p.size for p in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
    print(f"train_gpt_jax on {len(jax.devices())} x {jax.devices()[0].platform} (dp {len(jax.devices()) // args.tp}, "
          f"tp {args.tp}): recipe {args.recipe}, {args.layers} layers, hidden {args.hidden}, {args.heads} heads, "
          f"seq {args.seq}, batch {args.batch}, {n_params / 1e6:.2f} M params; "
          f"{len(train) / 1e6:.1f} MB train / {len(heldout) / 1e6:.1f} MB held-out; steps {start} -> {args.steps}")

    log_every = args.log_every or max(1, (args.steps - start) // 10)
    losses, t0, timed_tokens = [], None, 0
    for step in range(start, args.steps):
        x, y = map(put, stdlib_text.batch(train, args.batch, args.seq, np.random.default_rng((args.seed, step))))
        loss = train_step(model, optimizer, x, y)
        losses.append(loss)
        if t0 is None:   # the first step compiles: time from the end of it
            jax.block_until_ready(loss)
            t0 = time.perf_counter()
        else:
            timed_tokens += args.batch * args.seq
        if (step + 1) % log_every == 0 or step + 1 == args.steps:
            print(f"  step {step + 1:5d}/{args.steps}  train loss {float(loss):.4f}", flush=True)
    jax.block_until_ready(losses)
    elapsed = time.perf_counter() - t0 if t0 is not None else 0.0
    tokens_per_s = timed_tokens / elapsed if elapsed > 0 else float("nan")
    held = float(np.mean([float(eval_loss(model, x, y)) for x, y in eval_set]))
    train_loss = float(losses[-1]) if losses else float("nan")
    print(f"train loss {train_loss:.4f}  held-out loss {held:.4f} (ln 256 = {math.log(256):.4f})  "
          f"{tokens_per_s:,.0f} tokens/s  peak memory {peak_memory()}")
    if args.save:
        tej.flax.save_state(args.save, model=model, optimizer=optimizer)
        print(f"saved {args.save} at step {args.steps}")
    return {"train_loss": train_loss, "heldout_loss": held, "tokens_per_s": tokens_per_s,
            "losses": [np.asarray(v) for v in losses]}


if __name__ == "__main__":
    main()
