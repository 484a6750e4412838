"""Train a byte-level GPT built from tex.TransformerLayer on real text, in bf16 or any tex recipe, with checkpoints that
resume bit for bit.

    python examples/train_gpt.py --tiny --cpu                    # well under a minute on the CPU
    python examples/train_gpt.py --recipe mxfp8 --steps 2000     # the GPU when one is visible
    torchrun --nproc-per-node 2 examples/train_gpt.py --tiny --cpu --tp 2
    python examples/train_gpt.py --tiny --cpu --save-at 100 --save ck.pt   # then, the same last 50 steps:
    python examples/train_gpt.py --tiny --cpu --resume ck.pt

Model: byte embedding (256) → `--layers` × tex.TransformerLayer (pre-norm, causal self-attention with rotary
position embeddings, no dropout) → final norm → LM head (256 logits; `--tie` shares the embedding's weight). As
NVIDIA's NVFP4 recipe advises, the embedding, final norm and head stay out of `tex.autocast` (plain torch, bf16
under torch.autocast on the GPU); only the transformer layers' GEMMs run in the recipe's format. Data:
examples/stdlib_text.py (the Python standard library's sources as bytes, a fixed held-out split); training batch i
is drawn from a generator seeded with (seed, i), so a resumed run sees the same batches without a data-loader state.

Checkpoint (`--save`): model state_dict (including each tex layer's delayed-scaling scales and amax histories under
`<layer>._extra_state`), AdamW's state_dict, the step, and torch's CPU and CUDA RNG states (NVFP4's stochastic
rounding draws from the device's default generator); the learning rate is a function of the step. Under `--tp` each
rank writes its shard to PATH.rank<r>. The run saves after step `--save-at` (default: the last), after that step's
held-out evaluation if it has one (an evaluation under delayed scaling updates the layers' forward scales), so
`--steps n --save-at k --save ck.pt` then `--steps n --resume ck.pt` reaches the same final losses, bit for bit, as
one uninterrupted run of n steps (keep --steps: the learning-rate schedule depends on it).
"""
import argparse
import contextlib
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stdlib_text  # noqa: E402

import transformer_engine_torch as tex  # noqa: E402

RECIPES = {
    "bf16": lambda: None,
    "delayed": lambda: tex.DelayedScaling(fp8_format=tex.Format.HYBRID, amax_history_len=16),
    "current": lambda: tex.Float8CurrentScaling(),
    "mxfp8": lambda: tex.MXFP8BlockScaling(),
    "nvfp4": lambda: tex.NVFP4BlockScaling(),
    "fp8_block": lambda: tex.Float8BlockScaling(),
}
# --tiny: a model and data the CPU trains in well under a minute (every dim a multiple of 32: any recipe aligns).
TINY = dict(layers=2, hidden=64, heads=4, seq=64, batch=16, steps=150, lr=3e-3, eval_every=50, data_bytes=300_000)
FULL = dict(layers=12, hidden=768, heads=12, seq=1024, batch=16, steps=2000, lr=6e-4, eval_every=200, data_bytes=0)
EVAL_BATCHES = 4
EVAL_SEED = 1234


class GPT(torch.nn.Module):
    """Byte embedding → TransformerLayers (bshd, causal, RoPE) → final norm → head. With `tp_group` each layer is
    tensor-parallel (QKV and fc1 column-, proj and fc2 row-parallel); the embedding, norm and head are replicated (every
    rank computes them on the same, all-reduced activations)."""

    def __init__(self, layers, hidden, heads, seq, norm="LayerNorm", activation="gelu", tie=False, tp_group=None,
                 device=None):
        super().__init__()
        self.embed = torch.nn.Embedding(stdlib_text.VOCAB, hidden, device=device)
        self.layers = torch.nn.ModuleList(
            tex.TransformerLayer(hidden, 4 * hidden, heads, hidden_dropout=0.0, attention_dropout=0.0,
                                 self_attn_mask_type="causal", normalization=norm, activation=activation, bias=False,
                                 attn_input_format="bshd", set_parallel_mode=tp_group is not None, tp_group=tp_group,
                                 device=device)
            for _ in range(layers))
        self.norm = (tex.RMSNorm if norm == "RMSNorm" else tex.LayerNorm)(hidden, device=device)
        self.head = torch.nn.Linear(hidden, stdlib_text.VOCAB, bias=False, device=device)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        if tie:
            self.head.weight = self.embed.weight
        else:
            torch.nn.init.normal_(self.head.weight, std=0.02)
        self.register_buffer("freqs", rope_freqs(seq, hidden // heads, device), persistent=False)

    def forward(self, tokens, recipe):
        """tokens int64 [b, s] → logits [b, s, 256]; the layers inside tex.autocast(recipe) (bf16 when None)."""
        x = self.embed(tokens)
        with tex.autocast(enabled=recipe is not None, recipe=recipe):
            for layer in self.layers:
                x = layer(x, rotary_pos_emb=self.freqs)
        return self.head(self.norm(x))


def rope_freqs(seq, head_dim, device):
    """TE's rotary frequencies [seq, 1, 1, head_dim]: position · 10000^(-2i/head_dim), the halves repeated."""
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    f = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
    return torch.cat((f, f), dim=-1)[:, None, None, :]


def lr_at(step, steps, lr):
    """Linear warm-up over the first 10 % of the steps, then cosine decay to lr/10."""
    warm = max(steps // 10, 1)
    if step < warm:
        return lr * (step + 1) / warm
    t = (step - warm) / max(steps - warm, 1)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train_batch(data, step, args, device):
    rng = np.random.default_rng([args.seed, step])
    x, y = stdlib_text.batch(data, args.batch, args.seq, rng)
    return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


def loss_of(model, x, y, recipe, device):
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(x, recipe)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def heldout_loss(model, heldout, args, recipe, device):
    """Mean loss over EVAL_BATCHES fixed batches of the held-out split (the same ones at every evaluation)."""
    model.eval()
    rng = np.random.default_rng(EVAL_SEED)
    total = 0.0
    for _ in range(EVAL_BATCHES):
        x, y = stdlib_text.batch(heldout, args.batch, args.seq, rng)
        total += loss_of(model, torch.from_numpy(x).to(device), torch.from_numpy(y).to(device), recipe, device).item()
    model.train()
    return total / EVAL_BATCHES


def peak_memory(device):
    if device.type == "cuda":
        return f"{torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB (max_memory_allocated)"
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return f"{rss_mib:.0f} MiB (process peak RSS; no per-tensor peak on the CPU)"


def checkpoint_path(path, tp_group):
    return path if tp_group is None else f"{path}.rank{torch.distributed.get_rank()}"


def save_checkpoint(path, model, opt, step):
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
             "cpu_rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    torch.save(state, path)


def load_checkpoint(path, model, opt, device):
    state = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["cpu_rng"].cpu())
    if state["cuda_rng"]:
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda_rng"]])
    return state["step"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--recipe", choices=sorted(RECIPES), default="bf16", help="format of the transformer layers' GEMMs")
    p.add_argument("--tiny", action="store_true", help="tiny model and data: CPU, well under a minute")
    for name, kind in (("steps", int), ("layers", int), ("hidden", int), ("heads", int), ("seq", int), ("batch", int),
                       ("lr", float), ("eval-every", int), ("data-bytes", int)):
        p.add_argument(f"--{name}", type=kind, default=None, help="default: --tiny's or the full run's")
    p.add_argument("--norm", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    p.add_argument("--activation", default="gelu", help="any tex.MLP activation (gelu, swiglu, ...)")
    p.add_argument("--tie", action="store_true", help="LM head shares the embedding's weight")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (under torchrun; world size = tp)")
    p.add_argument("--save", metavar="PATH", help="checkpoint after step --save-at")
    p.add_argument("--save-at", type=int, default=None, help="the step after which --save writes (default: the last)")
    p.add_argument("--resume", metavar="PATH", help="continue from a checkpoint of the same configuration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is visible")
    p.add_argument("--deterministic", action="store_true",
                   help="GPU: deterministic torch kernels and the math attention backend (a run, and so a resumed\n"
                        "one, then repeats bit for bit; the CPU path is deterministic as it is)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: 1 for --tiny on the CPU, ops too small to share; else torch's)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    for k, v in (TINY if args.tiny else FULL).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def setup_tp(tp, device):
    """The tensor-parallel group (world = tp ranks, started by torchrun) or None."""
    if tp == 1:
        return None, device
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != tp:
        raise SystemExit(f"train_gpt: --tp {tp} needs {tp} processes (torchrun --nproc-per-node {tp}); WORLD_SIZE="
                         f"{world}")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.group.WORLD, device


def main(argv=None):
    """Trains; returns {"train_loss", "heldout_loss", "tokens_per_s", "step"} of the last step."""
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    threads = args.threads or (1 if args.tiny and device.type == "cpu" else None)
    saved_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with deterministic(args.deterministic):
            return run(args, device)
    finally:
        torch.set_num_threads(saved_threads)


@contextlib.contextmanager
def deterministic(on):
    """torch.use_deterministic_algorithms and SDPA's math backend (the fused attention backward kernels may add in a
    run-dependent order); CUBLAS_WORKSPACE_CONFIG as cuBLAS requires for deterministic GEMMs."""
    if not on:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.use_deterministic_algorithms(was)


def run(args, device):
    tp_group, device = setup_tp(args.tp, device)
    rank0 = tp_group is None or torch.distributed.get_rank() == 0
    say = print if rank0 else (lambda *a, **k: None)
    torch.manual_seed(args.seed)
    recipe = RECIPES[args.recipe]()
    train, heldout = stdlib_text.load(args.data_bytes)
    model = GPT(args.layers, args.hidden, args.heads, args.seq, args.norm, args.activation, args.tie, tp_group, device)
    if isinstance(recipe, tex.DelayedScaling):
        tex.init_fp8_state(model, recipe)  # the state exists before compile traces the layers (and before a resume)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    start = load_checkpoint(checkpoint_path(args.resume, tp_group), model, opt, device) if args.resume else 0
    step_fn = torch.compile(model) if args.compile else model
    n_params = sum(p.numel() for p in model.parameters())
    say(f"train_gpt: {args.recipe} on {device}{f' (tp={args.tp})' if tp_group else ''}; {args.layers} layers, hidden "
        f"{args.hidden}, {args.heads} heads, seq {args.seq}, batch {args.batch}, {n_params / 1e6:.2f} M parameters "
        f"per rank; data {len(train) / 1e3:.0f} kB train / {len(heldout) / 1e3:.0f} kB held-out; steps {start} → "
        f"{args.steps}; uniform-byte loss ln(256) = {math.log(256):.3f}")
    tokens = args.batch * args.seq
    timed_tokens, timed_s, loss, held = 0, 0.0, float("nan"), None
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr)
        x, y = train_batch(train, step, args, device)
        loss_t = loss_of(step_fn, x, y, recipe, device)
        opt.zero_grad(set_to_none=True)
        loss_t.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = loss_t.item()  # a sync: the step's time is complete
        if step > start:  # the first step (compilation, warm-up) is not timed
            timed_tokens, timed_s = timed_tokens + tokens, timed_s + time.perf_counter() - t0
        tps = timed_tokens / timed_s if timed_s else float("nan")
        if not args.quiet:
            say(f"\rstep {step + 1:5d}/{args.steps}  loss {loss:.4f}  {tps:,.0f} tok/s ", end="", flush=True)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            held = heldout_loss(step_fn, heldout, args, recipe, device)
            say(f"\rstep {step + 1:5d}/{args.steps}  train loss {loss:.4f}  held-out loss {held:.4f}  {tps:,.0f} tok/s"
                f"  peak memory {peak_memory(device)}")
        if args.save and step + 1 == (args.save_at or args.steps):
            save_checkpoint(checkpoint_path(args.save, tp_group), model, opt, step + 1)
    if held is None:  # resumed at the last step: nothing trained
        held = heldout_loss(step_fn, heldout, args, recipe, device)
    tps = timed_tokens / timed_s if timed_s else float("nan")
    say(f"final: train loss {loss:.4f}, held-out loss {held:.4f} (ln 256 = {math.log(256):.3f}), {tps:,.0f} tokens/s"
        f", peak memory {peak_memory(device)}")
    if tp_group is not None:
        torch.distributed.destroy_process_group()
    return {"train_loss": loss, "heldout_loss": held, "tokens_per_s": tps, "step": args.steps}


if __name__ == "__main__":
    main()
