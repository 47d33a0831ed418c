"""A reference Llama in PyTorch (float64), written from Hugging Face's LlamaForCausalLM semantics (modeling_llama.py:
LlamaRMSNorm, LlamaRotaryEmbedding with the default and 'llama3' frequencies, rotate_half, repeat_kv, eager causal
attention, LlamaMLP's down(silu(gate(x)) * up(x))), with Hugging Face's module names, so its named_parameters() are
the tensor names of a Hugging Face checkpoint and of trident's Llama.

Two uses:
  llama_torch.py DIR
      parity with trident (tests/unit/nn/llama_parity_test.cc): reads DIR/meta.json (config as trident's
      model config, B, T, inputs, targets, params [{name, shape}]) and DIR/params.bin (float32, meta order), writes
      DIR/out.bin as little-endian float64: logits [B*T*V], loss, then every parameter's gradient in meta order.
  llama_torch.py --hf FOLDER --tokens FILE --block T
      evaluation of a Hugging Face folder (config.json + model.safetensors, or shards with
      model.safetensors.index.json; F32, F16 or BF16): FILE holds whitespace-separated token ids; the mean
      cross-entropy of predicting each next token over consecutive windows of T + 1 ids is printed as
      "loss <value>".
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
from torch.nn import functional as F


class Config:
    def __init__(s, vocab, hidden, layers, heads, kv_heads, inter, eps, theta, scaling, tied):
        s.vocab, s.hidden, s.layers, s.heads, s.kv_heads, s.inter = vocab, hidden, layers, heads, kv_heads, inter
        s.eps, s.theta, s.scaling, s.tied = eps, theta, scaling, tied
        s.head_dim = hidden // heads


def inv_freq_of(cfg):
    hd = cfg.head_dim
    inv = 1.0 / (cfg.theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    sc = cfg.scaling
    if sc:
        kind = sc.get("rope_type", sc.get("type"))
        assert kind == "llama3", kind
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > lo_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wl < hi_wl) & ~(wl > lo_wl)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    def __init__(s, n, eps):
        super().__init__()
        s.weight = nn.Parameter(torch.ones(n, dtype=torch.float64))
        s.eps = eps

    def forward(s, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return s.weight * (x * torch.rsqrt(var + s.eps))


class Attention(nn.Module):
    def __init__(s, cfg):
        super().__init__()
        s.cfg = cfg
        hd = cfg.head_dim
        s.q_proj = nn.Linear(cfg.hidden, cfg.heads * hd, bias=False)
        s.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=False)
        s.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=False)
        s.o_proj = nn.Linear(cfg.heads * hd, cfg.hidden, bias=False)

    def forward(s, x, cos, sin):
        c = s.cfg
        B, T, _ = x.shape
        hd = c.head_dim
        q = s.q_proj(x).view(B, T, c.heads, hd).transpose(1, 2)
        k = s.k_proj(x).view(B, T, c.kv_heads, hd).transpose(1, 2)
        v = s.v_proj(x).view(B, T, c.kv_heads, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = c.heads // c.kv_heads  # repeat_kv
        k = k[:, :, None].expand(B, c.kv_heads, rep, T, hd).reshape(B, c.heads, T, hd)
        v = v[:, :, None].expand(B, c.kv_heads, rep, T, hd).reshape(B, c.heads, T, hd)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, c.heads * hd)
        return s.o_proj(y)


class Mlp(nn.Module):
    def __init__(s, cfg):
        super().__init__()
        s.gate_proj = nn.Linear(cfg.hidden, cfg.inter, bias=False)
        s.up_proj = nn.Linear(cfg.hidden, cfg.inter, bias=False)
        s.down_proj = nn.Linear(cfg.inter, cfg.hidden, bias=False)

    def forward(s, x):
        return s.down_proj(F.silu(s.gate_proj(x)) * s.up_proj(x))


class Layer(nn.Module):
    def __init__(s, cfg):
        super().__init__()
        s.self_attn = Attention(cfg)
        s.mlp = Mlp(cfg)
        s.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        s.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)

    def forward(s, x, cos, sin):
        x = x + s.self_attn(s.input_layernorm(x), cos, sin)
        return x + s.mlp(s.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(s, cfg):
        super().__init__()
        s.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        s.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.layers)])
        s.norm = RMSNorm(cfg.hidden, cfg.eps)


class LlamaForCausalLM(nn.Module):
    def __init__(s, cfg):
        super().__init__()
        s.cfg = cfg
        s.model = Model(cfg)
        s.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tied:
            s.lm_head.weight = s.model.embed_tokens.weight

    def forward(s, idx, targets=None):
        T = idx.shape[1]
        freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq_of(s.cfg)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = s.model.embed_tokens(idx)
        for layer in s.model.layers:
            x = layer(x, cos, sin)
        logits = s.lm_head(s.model.norm(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, s.cfg.vocab), targets.reshape(-1))
        return logits, loss


def parity(d):
    meta = json.load(open(d + "/meta.json"))
    c = meta["config"]
    cfg = Config(c["vocab_size"], c["n_embd"], c["n_layer"], c["n_head"], c["n_kv_head"] or c["n_head"],
                 c["intermediate_size"], c["norm_eps"], c["rope_theta"], c.get("rope_scaling"), c["tie_embeddings"])
    model = LlamaForCausalLM(cfg).double()
    params = dict(model.named_parameters())
    names = [p["name"] for p in meta["params"]]
    assert sorted(names) == sorted(params.keys()), (sorted(names), sorted(params.keys()))
    raw = open(d + "/params.bin", "rb").read()
    flat = torch.tensor(struct.unpack("<%df" % (len(raw) // 4), raw), dtype=torch.float64)
    off = 0
    with torch.no_grad():
        for p in meta["params"]:
            n = math.prod(p["shape"])
            assert list(params[p["name"]].shape) == p["shape"], (p["name"], params[p["name"]].shape, p["shape"])
            params[p["name"]].copy_(flat[off:off + n].view(p["shape"]))
            off += n
    B, T = meta["B"], meta["T"]
    idx = torch.tensor(meta["inputs"], dtype=torch.long).view(B, T)
    tgt = torch.tensor(meta["targets"], dtype=torch.long).view(B, T)
    logits, loss = model(idx, tgt)
    loss.backward()
    out = [logits.detach().reshape(-1), loss.detach().reshape(1)]
    out += [params[name].grad.reshape(-1) for name in names]
    torch.cat(out).numpy().astype("<f8").tofile(d + "/out.bin")
    print("ok")


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    kinds = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=kinds[info["dtype"]]) if e > b else torch.zeros(0)
        out[name] = t.to(torch.float64).view(info["shape"])
    return out


def evaluate_hf(folder, tokens_file, block):
    c = json.load(open(os.path.join(folder, "config.json")))
    assert c["model_type"] in ("llama", "mistral"), c["model_type"]
    cfg = Config(c["vocab_size"], c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                 c.get("num_key_value_heads") or c["num_attention_heads"], c["intermediate_size"],
                 c.get("rms_norm_eps", 1e-6), c.get("rope_theta", 10000.0), c.get("rope_scaling"),
                 c.get("tie_word_embeddings", False))
    index = os.path.join(folder, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    state = {}
    for f in files:
        state.update(read_safetensors(os.path.join(folder, f)))
    model = LlamaForCausalLM(cfg).double()
    params = dict(model.named_parameters())
    want = set(params) - ({"lm_head.weight"} if cfg.tied else set())
    assert want <= set(state), sorted(want - set(state))
    with torch.no_grad():
        for name in want:
            params[name].copy_(state[name])
    ids = [int(x) for x in open(tokens_file).read().split()]
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids) - block, block):
            w = torch.tensor(ids[i:i + block + 1], dtype=torch.long)
            _, loss = model(w[None, :-1], w[None, 1:])
            total += loss.item() * block
            count += block
    print("loss %.12g" % (total / count))


if __name__ == "__main__":
    if sys.argv[1] == "--hf":
        a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
        evaluate_hf(a["--hf"], a["--tokens"], int(a["--block"]))
    else:
        parity(sys.argv[1])
