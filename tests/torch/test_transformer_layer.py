"""tex.TransformerLayer (issue 35; docs/torch.md "TransformerLayer").

The reference is the layer's math written out again in float64 with its parameters (ref_layer: the norm of
tests/ref/normalization.py, the fused QKV rows split per head [q; k; v], RoPE pair by pair, softmax attention with
the mask built from its definition, the residuals): forward and every gradient, plain FP32 tightly and under the
recipes within the format's tolerance (normwise, as test_norm_layers.py). Also: TE's parameter names and init,
compile fullgraph = eager, dropout only in training, the argument errors, CUDA-graph replay of a training step
(cuda), and the tensor-parallel layer (with and without sequence parallelism) against the unsharded float64
reference: check_tp_transformer, run on gloo and NCCL by test_collective_gemm.py's ranks.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from tests.torch.helpers import tex_module
from tests.torch.test_layers import ref_act
from tests.torch.test_norm_layers import NORMWISE, RECIPES, check_graph_replay, close_all, norm64
from tests.torch.test_recipe_modes import assert_identical, snapshot

tex = tex_module()
H, FFN, HEADS, S, B = 64, 128, 2, 8, 4  # hidden, ffn, heads, seq, batch (tokens = 32)
FP32_TOL = dict(rtol=1e-4, atol=2e-5)


def make_layer(seed=0, num_attention_heads=HEADS, **kw):
    torch.manual_seed(seed)
    kw = dict(dict(hidden_dropout=0.0, attention_dropout=0.0), **kw)
    layer = tex.TransformerLayer(H, FFN, num_attention_heads, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # O(1/sqrt(fan-in)) weights and non-trivial norms, so every term matters
        for name, p in layer.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            else:
                p.add_((torch.rand(p.shape, generator=g) - 0.5) * 0.4)
    return layer


def rope64(t, freqs):
    """TE's non-interleaved rotation, pair by pair: channels i and i + d_rot/2 of each head rotate by the angles
    freqs[..., i] and freqs[..., i + d_rot/2] (t [s, b, heads, d], float64)."""
    d_rot = freqs.shape[-1]
    half = d_rot // 2
    f = freqs[:t.shape[0]].double()
    out = t.clone()
    a, b = t[..., :half], t[..., half:d_rot]
    out[..., :half] = a * torch.cos(f[..., :half]) - b * torch.sin(f[..., :half])
    out[..., half:d_rot] = b * torch.cos(f[..., half:]) + a * torch.sin(f[..., half:])
    return out


def ref_layer(layer, x, mask_type="causal", attention_mask=None, freqs=None):
    """float64 forward of `layer` on x (sbhd or bshd as the layer), parameters as float64 leaves {name: tensor}."""
    p = {n: t.detach().double().requires_grad_() for n, t in layer.named_parameters()}
    a, m = "self_attention.layernorm_qkv.", "layernorm_mlp."
    kind = layer.layernorm_mlp.normalization
    eps, zcg = layer.layernorm_mlp.eps, layer.layernorm_mlp.zero_centered_gamma
    bshd = layer.attn_input_format == "bshd"
    xs = x.transpose(0, 1) if bshd else x  # [s, b, h] from here on
    ln = norm64(kind, xs, p[a + "layer_norm_weight"], p.get(a + "layer_norm_bias"), eps, zcg)
    qkv = F.linear(ln, p[a + "weight"], p.get(a + "bias"))
    s, b, heads, d = xs.shape[0], xs.shape[1], layer.num_attention_heads, layer.head_dim
    qkv = qkv.reshape(s, b, heads, 3 * d)
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    if freqs is not None:
        q, k = rope64(q, freqs), rope64(k, freqs)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / math.sqrt(d)
    allowed = torch.ones(b, heads, s, s, dtype=torch.bool)
    if "causal" in mask_type:
        allowed &= torch.arange(s)[None, :] <= torch.arange(s)[:, None]  # key t <= query s
    if mask_type in ("padding", "padding_causal", "arbitrary"):
        allowed &= ~attention_mask
    probs = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
    ctx = torch.einsum("bhst,tbhd->sbhd", probs, v).reshape(s, b, heads * d)
    h = xs + F.linear(ctx, p["self_attention.proj.weight"], p.get("self_attention.proj.bias"))
    ln2 = norm64(kind, h, p[m + "layer_norm_weight"], p.get(m + "layer_norm_bias"), eps, zcg)
    y = F.linear(ref_act(layer.layernorm_mlp.activation, F.linear(ln2, p[m + "fc1_weight"], p.get(m + "fc1_bias"))),
                 p[m + "fc2_weight"], p.get(m + "fc2_bias"))
    out = h + y
    return (out.transpose(0, 1) if bshd else out), p


def rope_freqs(s, d_rot, base=10000.0):
    """TE's RotaryPositionEmbedding output: [s, 1, 1, d_rot], the angles of each half repeated."""
    inv = 1.0 / base ** (torch.arange(0, d_rot, 2, dtype=torch.float32) / d_rot)
    f = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    return torch.cat([f, f], dim=-1)[:, None, None, :]


def run(layer, x, dy, recipe=None, reference=False, **fw):
    """(outputs, [dx, parameter grads in named_parameters() order])."""
    if reference:
        xd = x.detach().double().requires_grad_()
        y, p = ref_layer(layer, xd, fw.get("self_attn_mask_type", layer.self_attn_mask_type),
                         fw.get("attention_mask"), fw.get("rotary_pos_emb"))
        y.backward(dy.double())
        return [y.detach()], [xd.grad] + [p[n].grad for n, _ in layer.named_parameters()]
    xi = x.detach().clone().requires_grad_()
    for q in layer.parameters():
        q.grad = None
    with tex.autocast(enabled=recipe is not None, recipe=recipe):
        y = layer(xi, **fw)
    y.backward(dy)
    grads = [xi.grad] + [q.grad for q in layer.parameters()]
    for q in layer.parameters():
        q.grad = None
    return [y.detach()], grads


def inputs(shape, dtype=torch.float32, seed=7):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g)).to(dtype), (torch.randn(shape, generator=g) * 0.05).to(dtype)


# ---- plain precision against float64 -----------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["causal", "rope-rmsnorm-swiglu", "bshd-no_mask", "padding", "arbitrary-zcg"])
def test_plain_matches_float64(case):
    kw, fw = {}, {}
    if case == "rope-rmsnorm-swiglu":
        kw = dict(normalization="RMSNorm", activation="swiglu")
        fw = dict(rotary_pos_emb=rope_freqs(S + 3, 16))  # longer than the sequence, rotating 16 of 32 channels
    elif case == "bshd-no_mask":
        kw = dict(attn_input_format="bshd", self_attn_mask_type="no_mask")
    elif case == "padding":
        lengths = torch.tensor([8, 5, 3, 1])
        fw = dict(self_attn_mask_type="padding",
                  attention_mask=(torch.arange(S)[None, :] >= lengths[:, None])[:, None, None, :])
    elif case == "arbitrary-zcg":
        kw = dict(zero_centered_gamma=True, self_attn_mask_type="arbitrary")
        g = torch.Generator().manual_seed(3)
        mask = torch.rand(B, 1, S, S, generator=g) < 0.4
        mask[..., torch.arange(S), torch.arange(S)] = False  # every query keeps a key
        fw = dict(attention_mask=mask)
    layer = make_layer(**kw)
    shape = (B, S, H) if case.startswith("bshd") else (S, B, H)
    x, dy = inputs(shape)
    got = run(layer, x, dy, **fw)
    close_all(got, run(layer, x, dy, reference=True, **fw), FP32_TOL, FP32_TOL)
    with pytest.raises(AssertionError):
        close_all(got, run(layer, -x, dy, reference=True, **fw), FP32_TOL, FP32_TOL)
    if case == "causal":  # and the mask matters: the reference without it fails
        with pytest.raises(AssertionError):
            close_all(got, run(layer, x, dy, reference=True, self_attn_mask_type="no_mask"), FP32_TOL, FP32_TOL)
    if case.startswith("rope"):  # and the rotation matters
        with pytest.raises(AssertionError):
            close_all(got, run(layer, x, dy, reference=True), FP32_TOL, FP32_TOL)


@pytest.mark.parametrize("recipe", ["current", "delayed", "mxfp8", "nvfp4"])
def test_recipe_matches_float64(recipe):
    layer = make_layer(params_dtype=torch.bfloat16)
    x, dy = inputs((S, B, H), torch.bfloat16)
    torch.manual_seed(5)
    got = run(layer, x, dy, RECIPES[recipe]())
    close_all(got, run(layer, x, dy, reference=True), *NORMWISE[recipe])
    assert got[0][0].dtype == torch.bfloat16
    assert not torch.equal(got[0][0], run(layer, x, dy)[0][0])
    with pytest.raises(AssertionError):
        close_all(got, run(layer, -x, dy, reference=True), *NORMWISE[recipe])


def test_names_init_and_dropout():
    torch.manual_seed(0)
    layer = tex.TransformerLayer(H, FFN, HEADS)
    assert [n for n, _ in layer.named_parameters()] == [
        "self_attention.layernorm_qkv.layer_norm_weight", "self_attention.layernorm_qkv.layer_norm_bias",
        "self_attention.layernorm_qkv.weight", "self_attention.layernorm_qkv.bias", "self_attention.proj.weight",
        "self_attention.proj.bias", "layernorm_mlp.layer_norm_weight", "layernorm_mlp.layer_norm_bias",
        "layernorm_mlp.fc1_weight", "layernorm_mlp.fc1_bias", "layernorm_mlp.fc2_weight", "layernorm_mlp.fc2_bias"]
    assert isinstance(layer.self_attention.layernorm_qkv, tex.LayerNormLinear)
    assert isinstance(layer.self_attention.proj, tex.Linear) and isinstance(layer.layernorm_mlp, tex.LayerNormMLP)
    assert layer.self_attention.layernorm_qkv.weight.shape == (3 * H, H)
    assert (layer.hidden_dropout, layer.attention_dropout) == (0.1, 0.1)  # TE's defaults
    for name, p in layer.named_parameters():
        if p.dim() == 2:  # TE's init_method / output_layer_init_method: normal(0, 0.023)
            assert abs(p.std().item() - 0.023) < 0.002, name
        elif name.endswith("layer_norm_weight"):
            assert bool((p == 1).all()), name
        else:
            assert not p.any(), name
    scaled = tex.TransformerLayer(H, FFN, HEADS, output_layer_init_method=torch.nn.init.zeros_)
    assert not scaled.self_attention.proj.weight.any() and not scaled.layernorm_mlp.fc2_weight.any()
    # dropout: in training only
    x = torch.randn(S, B, H)
    layer.eval()
    y0 = layer(x)
    nodrop = tex.TransformerLayer(H, FFN, HEADS, hidden_dropout=0.0, attention_dropout=0.0)
    nodrop.load_state_dict(layer.state_dict())
    assert torch.equal(y0, nodrop(x))
    layer.train()
    assert not torch.equal(layer(x), y0)


def test_compile_fullgraph_equals_eager():
    torch._dynamo.reset()
    recipe = tex.Float8CurrentScaling()
    eager, comp = make_layer(params_dtype=torch.bfloat16), make_layer(params_dtype=torch.bfloat16)
    compiled = torch.compile(comp, fullgraph=True, backend="aot_eager")
    freqs = rope_freqs(S, 32)
    for k in range(2):
        x, dy = inputs((S, B, H), torch.bfloat16, seed=50 + k)
        outs = []
        for fn, model in ((eager, eager), (compiled, comp)):
            xi = x.clone().requires_grad_()
            with tex.autocast(recipe=recipe):
                y = fn(xi, rotary_pos_emb=freqs)
            y.backward(dy)
            outs.append(snapshot(model, xi, y))
        assert_identical(outs[1], outs[0], f"compiled step {k}")


def test_rope_tables_op_and_packed_rope_match_apply_rotary_pos_emb():
    """The opaque te_layers::rope_tables op passes opcheck (schema, fake, autograd registration), and the packed
    RoPE of q and k (one table pair, or separate q / k freqs) gives apply_rotary_pos_emb's bytes, forward and
    backward."""
    from transformer_engine_torch import transformer as T

    freqs = rope_freqs(S + 3, 16)
    torch.library.opcheck(T._rope_tables, (freqs, S, torch.bfloat16))
    qkv = torch.randn(S, B, 2, 3, 32, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(7))
    for kf in (freqs, rope_freqs(S, 16, base=500.0)):
        x1, x2 = qkv.clone().requires_grad_(), qkv.clone().requires_grad_()
        q, k, v = x1.unbind(3)
        ref = (T.apply_rotary_pos_emb(q, freqs), T.apply_rotary_pos_emb(k, kf), v)
        got = T._rope_qkv(x2, freqs, kf, "sbhd")
        grads = [torch.randn_like(t) for t in ref]
        torch.autograd.backward(ref, grads)
        torch.autograd.backward(got, grads)
        assert all(torch.equal(a, b) for a, b in zip(ref, got)) and torch.equal(x1.grad, x2.grad)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="hidden_size=64 must be a multiple of num_attention_heads=3"):
        tex.TransformerLayer(H, FFN, 3)
    with pytest.raises(ValueError, match="eps must be a finite number > 0, got 0"):
        tex.TransformerLayer(H, FFN, HEADS, layernorm_epsilon=0)
    with pytest.raises(ValueError, match="normalization must be one of"):
        tex.TransformerLayer(H, FFN, HEADS, normalization="layernorm")
    with pytest.raises(ValueError, match="hidden_dropout must be in"):
        tex.TransformerLayer(H, FFN, HEADS, hidden_dropout=1.0)
    with pytest.raises(ValueError, match="self_attn_mask_type must be one of"):
        tex.TransformerLayer(H, FFN, HEADS, self_attn_mask_type="causal_bottom_right")
    with pytest.raises(ValueError, match="set_parallel_mode=True needs tp_group"):
        tex.TransformerLayer(H, FFN, HEADS, set_parallel_mode=True)
    with pytest.raises(ValueError, match="attn_input_format must be"):
        tex.TransformerLayer(H, FFN, HEADS, attn_input_format="thd")
    layer = make_layer()
    x = torch.randn(S, B, H)
    with pytest.raises(ValueError, match=r"hidden_states must be 3-D \(sbhd: \[seq, batch, hidden\]\)"):
        layer(x[0])
    with pytest.raises(ValueError, match="input last dim must equal hidden_size=64"):
        layer(torch.randn(S, B, H + 1))
    with pytest.raises(TypeError, match="input dtype must be float32"):
        layer(torch.ones(S, B, H, dtype=torch.int64))
    with pytest.raises(ValueError, match="'padding' .*needs attention_mask"):
        layer(x, self_attn_mask_type="padding")
    with pytest.raises(ValueError, match="attention_mask is used with"):
        layer(x, attention_mask=torch.zeros(B, 1, 1, S, dtype=torch.bool))
    with pytest.raises(TypeError, match="attention_mask must be a bool tensor"):
        layer(x, self_attn_mask_type="padding", attention_mask=torch.zeros(B, 1, 1, S))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \[4, 1, 1, 8\]"):
        layer(x, self_attn_mask_type="padding", attention_mask=torch.zeros(B, 1, S, S, dtype=torch.bool))
    with pytest.raises(ValueError, match="'arbitrary' attention_mask must broadcast"):
        layer(x, self_attn_mask_type="arbitrary", attention_mask=torch.zeros(B, 1, S, S + 1, dtype=torch.bool))
    for bad in (rope_freqs(S - 1, 16), rope_freqs(S, 64), rope_freqs(S, 16)[:, 0]):
        with pytest.raises(ValueError, match="rotary_pos_emb must have shape"):
            layer(x, rotary_pos_emb=bad)
    with pytest.raises(TypeError, match="rotary_pos_emb must be a float tensor"):
        layer(x, rotary_pos_emb=torch.zeros(S, 1, 1, 16, dtype=torch.int32))
    with tex.autocast(recipe=tex.MXFP8BlockScaling()), pytest.raises(ValueError, match="in_features=48"):
        tex.TransformerLayer(48, 64, 2)(torch.randn(S, B, 48))


# ---- tensor parallel ------------------------------------------------------------------------------------------------
def _shard_into(tp_layer, full, rank, tp):
    """Copies this rank's shards of `full`'s parameters: QKV rows of its heads (per head [q; k; v] rows, so a
    contiguous block), fc1 rows, proj and fc2 columns; norms and row-parallel biases whole."""
    src = dict(full.named_parameters())
    with torch.no_grad():
        for name, p in tp_layer.named_parameters():
            t = src[name]
            if name.endswith(("layernorm_qkv.weight", "layernorm_qkv.bias", "fc1_weight", "fc1_bias")):
                n = t.shape[0] // tp
                t = t[rank * n:(rank + 1) * n]
            elif name.endswith(("proj.weight", "fc2_weight")):
                n = t.shape[1] // tp
                t = t[:, rank * n:(rank + 1) * n]
            p.copy_(t)


def check_tp_transformer(rank, tp, device):
    """The tensor-parallel TransformerLayer (QKV / fc1 column-, proj / fc2 row-parallel; max(2, tp) heads, RoPE),
    with and without sequence parallelism: FP32 against the unsharded float64 reference (forward, input and parameter
    gradients: the sharded ones against the reference's shards, the replicated ones whole, the norms' summed over the
    group under sequence parallelism), and under Float8CurrentScaling in bf16 within the format's tolerance (where
    hidden/tp keeps the GEMM alignment). Run by test_collective_gemm.py's ranks (gloo: tp 2 and 4; NCCL), which
    spawn their processes once for all the tensor-parallel checks."""
    import torch.distributed as dist

    group = dist.group.WORLD
    heads = max(HEADS, tp)
    full = make_layer(seed=3, normalization="RMSNorm", num_attention_heads=heads)
    x, dy = inputs((S, B, H), seed=9)
    freqs = rope_freqs(S, min(16, H // heads))
    (y64,), g64 = run(full, x, dy, reference=True, rotary_pos_emb=freqs)
    names = [n for n, _ in full.named_parameters()]
    cases = [(torch.float32, None)] + ([(torch.bfloat16, tex.Float8CurrentScaling())] if (H // tp) % 16 == 0 else [])
    for sp in (False, True):
        for dtype, recipe in cases:
            layer = tex.TransformerLayer(H, FFN, heads, hidden_dropout=0.0, attention_dropout=0.0,
                                         normalization="RMSNorm", tp_group=group, set_parallel_mode=True,
                                         sequence_parallel=sp, params_dtype=dtype, device=device)
            _shard_into(layer, full, rank, tp)
            rows = slice(rank * S // tp, (rank + 1) * S // tp) if sp else slice(None)
            (y,), grads = run(layer, x[rows].to(device, dtype), dy[rows].to(device, dtype), recipe,
                              rotary_pos_emb=freqs.to(device))
            what = f"rank {rank} TP TransformerLayer sp={sp} {dtype}"
            mine = dict(layer.named_parameters())
            sharded = [g64[0][rows]]  # the reference's gradients, cut as this rank's parameters are
            for name, g in zip(names, g64[1:]):
                shape = mine[name].shape
                if g.shape != shape:
                    axis = 0 if g.shape[0] != shape[0] else 1
                    g = g.narrow(axis, rank * shape[axis], shape[axis])
                sharded.append(g)
            tol = (FP32_TOL, FP32_TOL) if recipe is None else NORMWISE["current"]
            close_all(([y.cpu()], [t.cpu() for t in grads]), ([y64[rows]], sharded), *tol)
            assert y.shape == (S // tp if sp else S, B, H), what


# ---- GPU ------------------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("recipe_name", ["none", "current", "delayed", "mxfp8"])
def test_cuda_graph_training_step_replays_bit_identically(recipe_name):
    """A captured forward+backward of the layer (RoPE, causal attention) replays like its eager twin, step after
    step: output, every gradient, the delayed state."""
    recipe = None if recipe_name == "none" else RECIPES[recipe_name]()
    model = make_layer(params_dtype=torch.bfloat16).cuda()
    twin = make_layer(params_dtype=torch.bfloat16).cuda()
    freqs = rope_freqs(S, 32).cuda()

    def step(m, x, dy):
        with tex.autocast(enabled=recipe is not None, recipe=recipe):
            y = m(x, rotary_pos_emb=freqs)
        y.backward(dy)
        return y

    check_graph_replay(model, twin, step, lambda k: tuple(
        t.cuda() for t in inputs((S, B, H), torch.bfloat16, seed=60 + k)), recipe_name)
