"""Builds nanoGPT's GPT (model.py, same module structure and names) in PyTorch, in float64, from the
weights trident exported, and writes logits, loss and every parameter's gradient for the C++ test
(tests/unit/nn/torch_parity_test.cc) to compare. Usage: torch_parity.py DIR (reads DIR/meta.json and
DIR/params.bin, writes DIR/out.bin as little-endian float64: logits, loss, then grads in meta order)."""
import json
import math
import struct
import sys

import torch
import torch.nn as nn
from torch.nn import functional as F

d = sys.argv[1]
meta = json.load(open(d + "/meta.json"))
cfg = meta["config"]
V, C, L, NH, BS, BIAS = cfg["vocab_size"], cfg["n_embd"], cfg["n_layer"], cfg["n_head"], cfg["block_size"], cfg["bias"]
GELU = "tanh" if cfg["gelu"] == "tanh" else "none"


class LayerNorm(nn.Module):
    def __init__(s, ndim, bias):
        super().__init__()
        s.weight = nn.Parameter(torch.ones(ndim))
        s.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(s, x):
        return F.layer_norm(x, s.weight.shape, s.weight, s.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(s):
        super().__init__()
        s.c_attn = nn.Linear(C, 3 * C, bias=BIAS)
        s.c_proj = nn.Linear(C, C, bias=BIAS)

    def forward(s, x):
        B, T, _ = x.size()
        q, k, v = s.c_attn(x).split(C, dim=2)
        k = k.view(B, T, NH, C // NH).transpose(1, 2)
        q = q.view(B, T, NH, C // NH).transpose(1, 2)
        v = v.view(B, T, NH, C // NH).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return s.c_proj(y)


class MLP(nn.Module):
    def __init__(s):
        super().__init__()
        s.c_fc = nn.Linear(C, 4 * C, bias=BIAS)
        s.gelu = nn.GELU(approximate=GELU)
        s.c_proj = nn.Linear(4 * C, C, bias=BIAS)

    def forward(s, x):
        return s.c_proj(s.gelu(s.c_fc(x)))


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln_1 = LayerNorm(C, BIAS)
        s.attn = CausalSelfAttention()
        s.ln_2 = LayerNorm(C, BIAS)
        s.mlp = MLP()

    def forward(s, x):
        x = x + s.attn(s.ln_1(x))
        return x + s.mlp(s.ln_2(x))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, C), wpe=nn.Embedding(BS, C),
                                           h=nn.ModuleList([Block() for _ in range(L)]), ln_f=LayerNorm(C, BIAS)))
        s.lm_head = nn.Linear(C, V, bias=False)
        s.transformer.wte.weight = s.lm_head.weight

    def forward(s, idx, targets):
        B, T = idx.size()
        x = s.transformer.wte(idx) + s.transformer.wpe(torch.arange(T))
        for block in s.transformer.h:
            x = block(x)
        logits = s.lm_head(s.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1))


model = GPT().double()
params = dict(model.named_parameters())
names = [p["name"] for p in meta["params"]]
assert sorted(names) == sorted(params.keys()), (sorted(names), sorted(params.keys()))
raw = open(d + "/params.bin", "rb").read()
flat = struct.unpack("<%df" % (len(raw) // 4), raw)
off = 0
with torch.no_grad():
    for p in meta["params"]:
        n = math.prod(p["shape"])
        params[p["name"]].copy_(torch.tensor(flat[off:off + n], dtype=torch.float64).view(p["shape"]))
        off += n
B, T = meta["B"], meta["T"]
idx = torch.tensor(meta["inputs"], dtype=torch.long).view(B, T)
tgt = torch.tensor(meta["targets"], dtype=torch.long).view(B, T)
logits, loss = model(idx, tgt)
loss.backward()
out = logits.detach().reshape(-1).tolist() + [loss.item()]
for name in names:
    out += params[name].grad.reshape(-1).tolist()
open(d + "/out.bin", "wb").write(struct.pack("<%dd" % len(out), *out))
print("ok", len(out))
