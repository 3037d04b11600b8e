"""Tiny FLUX.1 and SD3 transformers, and their weights in the original single-file layout.

Used by single_file_check.py. The original layout is written by this module's own key map, read
from Black Forest Labs' and Stability's model code as diffusers' single-file conversion documents
it, and checked against that conversion (`diffusers_reading`): the fused q/k/v (and FLUX.1's
q/k/v/MLP) projections are concatenated rows, the final adaLN projections (and SD3's last
context one) give shift before scale where Diffusers gives scale before shift.
"""

import inspect

import torch

# FLUX.1's heads are 128 wide (the rotary axes 16 + 56 + 56): one head keeps the model tiny.
FLUX = dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=128,
            num_attention_heads=1, joint_attention_dim=32, pooled_projection_dim=24, guidance_embeds=True)
# SD3.5-like: q/k norms (which give the head width) and a dual-attention first block.
SD3 = dict(sample_size=16, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=32,
           num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=64, pooled_projection_dim=20,
           out_channels=4, pos_embed_max_size=16, dual_attention_layers=(0,), qk_norm="rms_norm")


def _shift_first(t):
    """A Diffusers adaLN projection (scale rows, then shift) as the original has it."""
    scale, shift = t.chunk(2, dim=0)
    return torch.cat([shift, scale], dim=0)


def _linears(out, sd, pairs):
    for original, ours in pairs:
        for w in ("weight", "bias"):
            out[f"{original}.{w}"] = sd[f"{ours}.{w}"]


def _fused(out, sd, original, parts):
    for w in ("weight", "bias"):
        out[f"{original}.{w}"] = torch.cat([sd[f"{p}.{w}"] for p in parts])


def flux_original(model):
    """A FluxTransformer2DModel's weights under the original (Black Forest Labs) keys."""
    sd, c, out = model.state_dict(), model.config, {}
    _linears(out, sd, [("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1"),
                       ("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2"),
                       ("vector_in.in_layer", "time_text_embed.text_embedder.linear_1"),
                       ("vector_in.out_layer", "time_text_embed.text_embedder.linear_2"),
                       ("txt_in", "context_embedder"), ("img_in", "x_embedder"), ("final_layer.linear", "proj_out")])
    if c.guidance_embeds:
        _linears(out, sd, [("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"),
                           ("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2")])
    for w in ("weight", "bias"):
        out[f"final_layer.adaLN_modulation.1.{w}"] = _shift_first(sd[f"norm_out.linear.{w}"])
    for i in range(c.num_layers):
        o, b = f"double_blocks.{i}", f"transformer_blocks.{i}"
        _linears(out, sd, [(f"{o}.{x}", f"{b}.{y}") for x, y in (
            ("img_mod.lin", "norm1.linear"), ("txt_mod.lin", "norm1_context.linear"),
            ("img_attn.proj", "attn.to_out.0"), ("txt_attn.proj", "attn.to_add_out"),
            ("img_mlp.0", "ff.net.0.proj"), ("img_mlp.2", "ff.net.2"),
            ("txt_mlp.0", "ff_context.net.0.proj"), ("txt_mlp.2", "ff_context.net.2"))])
        _fused(out, sd, f"{o}.img_attn.qkv", [f"{b}.attn.to_{x}" for x in "qkv"])
        _fused(out, sd, f"{o}.txt_attn.qkv", [f"{b}.attn.add_{x}_proj" for x in "qkv"])
        for x, y in (("img_attn.norm.query_norm", "norm_q"), ("img_attn.norm.key_norm", "norm_k"),
                     ("txt_attn.norm.query_norm", "norm_added_q"), ("txt_attn.norm.key_norm", "norm_added_k")):
            out[f"{o}.{x}.scale"] = sd[f"{b}.attn.{y}.weight"]
    for i in range(c.num_single_layers):
        o, b = f"single_blocks.{i}", f"single_transformer_blocks.{i}"
        _linears(out, sd, [(f"{o}.modulation.lin", f"{b}.norm.linear"), (f"{o}.linear2", f"{b}.proj_out")])
        _fused(out, sd, f"{o}.linear1", [f"{b}.attn.to_{x}" for x in "qkv"] + [f"{b}.proj_mlp"])
        out[f"{o}.norm.query_norm.scale"] = sd[f"{b}.attn.norm_q.weight"]
        out[f"{o}.norm.key_norm.scale"] = sd[f"{b}.attn.norm_k.weight"]
    return out


def sd3_original(model):
    """An SD3Transformer2DModel's weights under the original (Stability MMDiT) keys."""
    sd, c, out = model.state_dict(), model.config, {}
    out["pos_embed"] = sd["pos_embed.pos_embed"]
    _linears(out, sd, [("x_embedder.proj", "pos_embed.proj"),
                       ("t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1"),
                       ("t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2"),
                       ("y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1"),
                       ("y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2"),
                       ("context_embedder", "context_embedder"), ("final_layer.linear", "proj_out")])
    for w in ("weight", "bias"):
        out[f"final_layer.adaLN_modulation.1.{w}"] = _shift_first(sd[f"norm_out.linear.{w}"])
    for i in range(c.num_layers):
        o, b = f"joint_blocks.{i}", f"transformer_blocks.{i}"
        pairs = [("x_block.adaLN_modulation.1", "norm1.linear"), ("x_block.attn.proj", "attn.to_out.0"),
                 ("x_block.mlp.fc1", "ff.net.0.proj"), ("x_block.mlp.fc2", "ff.net.2")]
        if i + 1 < c.num_layers:
            pairs += [("context_block.adaLN_modulation.1", "norm1_context.linear"),
                      ("context_block.attn.proj", "attn.to_add_out"),
                      ("context_block.mlp.fc1", "ff_context.net.0.proj"), ("context_block.mlp.fc2", "ff_context.net.2")]
        else:  # the context stream ends here: an adaLN of its own order, no projection, no MLP
            for w in ("weight", "bias"):
                out[f"{o}.context_block.adaLN_modulation.1.{w}"] = _shift_first(sd[f"{b}.norm1_context.linear.{w}"])
        if i in c.dual_attention_layers:
            pairs.append(("x_block.attn2.proj", "attn2.to_out.0"))
            _fused(out, sd, f"{o}.x_block.attn2.qkv", [f"{b}.attn2.to_{x}" for x in "qkv"])
        _linears(out, sd, [(f"{o}.{x}", f"{b}.{y}") for x, y in pairs])
        _fused(out, sd, f"{o}.x_block.attn.qkv", [f"{b}.attn.to_{x}" for x in "qkv"])
        _fused(out, sd, f"{o}.context_block.attn.qkv", [f"{b}.attn.add_{x}_proj" for x in "qkv"])
        for x, y in (("x_block.attn.ln_q", "attn.norm_q"), ("x_block.attn.ln_k", "attn.norm_k"),
                     ("context_block.attn.ln_q", "attn.norm_added_q"), ("context_block.attn.ln_k", "attn.norm_added_k"),
                     ("x_block.attn2.ln_q", "attn2.norm_q"), ("x_block.attn2.ln_k", "attn2.norm_k")):
            if f"{b}.{y}.weight" in sd:
                out[f"{o}.{x}.weight"] = sd[f"{b}.{y}.weight"]
    return out


def diffusers_reading(kind, checkpoint, width):
    """What diffusers' own single-file conversion makes of `checkpoint` (original keys). Its
    FLUX.1 conversion splits the single blocks' fused projection at FLUX.1's width, 3072, written
    into the function: the tiny model's width replaces that one constant, nothing else."""
    import diffusers.loaders.single_file_utils as sfu

    if kind == "sd3":
        return sfu.convert_sd3_transformer_checkpoint_to_diffusers(dict(checkpoint))
    source = inspect.getsource(sfu.convert_flux_transformer_checkpoint_to_diffusers)
    if source.count("inner_dim = 3072") != 1:
        raise RuntimeError("diffusers' FLUX.1 conversion no longer fixes its width as this shim expects")
    scope = dict(vars(sfu))
    exec(source.replace("inner_dim = 3072", f"inner_dim = {width}"), scope)  # noqa: S102
    return scope["convert_flux_transformer_checkpoint_to_diffusers"](dict(checkpoint))


def build(kind, seed):
    """A tiny transformer of `kind` (`flux` or `sd3`), with every tensor's bytes distinct."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(**FLUX) if kind == "flux" else SD3Transformer2DModel(**SD3)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    if kind == "flux":  # as FLUX.1 ships
        model = model.to(torch.bfloat16)
    return model.eval()


def forward(model):
    """One forward pass on fixed inputs."""
    c = model.config
    g = torch.Generator().manual_seed(7)
    dtype = next(model.parameters()).dtype

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    with torch.no_grad():
        if "guidance_embeds" in c:  # FLUX: packed latents, 4 + 6 tokens, their positions
            ids = torch.zeros(4, 3)
            ids[:, 1], ids[:, 2] = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])
            return model(hidden_states=rand(1, 4, c.in_channels), encoder_hidden_states=rand(1, 6, c.joint_attention_dim),
                         pooled_projections=rand(1, c.pooled_projection_dim), timestep=torch.tensor([0.5]).to(dtype),
                         img_ids=ids, txt_ids=torch.zeros(6, 3),
                         guidance=torch.tensor([3.5]).to(dtype) if c.guidance_embeds else None).sample
        return model(hidden_states=rand(1, c.in_channels, 8, 8), encoder_hidden_states=rand(1, 6, c.joint_attention_dim),
                     pooled_projections=rand(1, c.pooled_projection_dim), timestep=torch.tensor([500])).sample
