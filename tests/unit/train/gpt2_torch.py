"""GPT-2 in plain PyTorch (Hugging Face's layout: Conv1D weights [in, out], tanh GELU, learned positions,
tied lm_head), the reference for trident's GPT-2 import and export. No transformers package, no downloads.

  gpt2_torch.py make DIR      random GPT-2 state dict (GPT2Model naming, with the attn.bias mask buffers)
                              -> DIR/hf.safetensors; inputs DIR/x.json; float64 logits -> DIR/logits.bin
  gpt2_torch.py forward DIR F load F (GPT2LMHeadModel naming, as trident exports it) strictly, run DIR/x.json
                              -> DIR/logits_export.bin (float64)
"""
import json
import math
import struct
import sys

import torch

CFG = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab=50257)
B, T = 2, 12


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[b:e]), dtype=torch.float32).reshape(info["shape"]).clone()
    return out


def names(prefix=""):
    L = CFG["n_layer"]
    out = [prefix + "wte.weight", prefix + "wpe.weight"]
    for i in range(L):
        p = f"{prefix}h.{i}."
        out += [p + s for s in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")]
    return out + [prefix + "ln_f.weight", prefix + "ln_f.bias"]


def random_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    C, V, Tm = CFG["n_embd"], CFG["vocab"], CFG["block_size"]
    shapes = {"wte.weight": (V, C), "wpe.weight": (Tm, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(CFG["n_layer"]):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,), p + "attn.c_attn.weight": (C, 3 * C),
                       p + "attn.c_attn.bias": (3 * C,), p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                       p + "ln_2.weight": (C,), p + "ln_2.bias": (C,), p + "mlp.c_fc.weight": (C, 4 * C),
                       p + "mlp.c_fc.bias": (4 * C,), p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
    sd = {}
    for n in names():
        t = torch.randn(shapes[n], generator=g) * 0.2
        if n.endswith("ln_1.weight") or n.endswith("ln_2.weight") or n.endswith("ln_f.weight"):
            t = 1.0 + t
        sd[n] = t
    return sd


def forward(sd, x):
    """Hugging Face GPT2LMHeadModel's forward (eval, no dropout) in float64; sd uses GPT2Model names."""
    sd = {k: v.double() for k, v in sd.items()}
    C, H = CFG["n_embd"], CFG["n_head"]
    b, t = x.shape
    h = sd["wte.weight"][x] + sd["wpe.weight"][torch.arange(t)]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    ln = lambda z, p: torch.nn.functional.layer_norm(z, (C,), sd[p + ".weight"], sd[p + ".bias"], 1e-5)
    conv1d = lambda z, p: z @ sd[p + ".weight"] + sd[p + ".bias"]  # Conv1D: weight is [in, out]
    for i in range(CFG["n_layer"]):
        p = f"h.{i}."
        q, k, v = conv1d(ln(h, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        h = h + conv1d(y, p + "attn.c_proj")
        m = torch.nn.functional.gelu(conv1d(ln(h, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
        h = h + conv1d(m, p + "mlp.c_proj")
    return ln(h, "ln_f") @ sd["wte.weight"].T  # tied lm_head


def main():
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "make":
        sd = random_state()
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, CFG["vocab"], (B, T), generator=g)
        files = dict(sd)
        Tm = CFG["block_size"]
        for i in range(CFG["n_layer"]):  # Hugging Face's causal-mask buffers: not parameters
            files[f"h.{i}.attn.bias"] = torch.tril(torch.ones(Tm, Tm)).view(1, 1, Tm, Tm)
        write_safetensors(f"{d}/hf.safetensors", files)
        json.dump({"x": x.tolist(), "config": CFG}, open(f"{d}/x.json", "w"))
        open(f"{d}/logits.bin", "wb").write(forward(sd, x).numpy().tobytes())
    elif mode == "forward":
        sd = read_safetensors(sys.argv[3])
        want = set(["transformer." + n for n in names()] + ["lm_head.weight"])
        if set(sd) != want:  # strict, as load_state_dict(strict=True)
            sys.exit(f"state dict keys differ: missing {sorted(want - set(sd))}, unexpected {sorted(set(sd) - want)}")
        assert torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"])
        sd = {k[len("transformer."):]: v for k, v in sd.items() if k.startswith("transformer.")}
        x = torch.tensor(json.load(open(f"{d}/x.json"))["x"])
        open(f"{d}/logits_export.bin", "wb").write(forward(sd, x).numpy().tobytes())


if __name__ == "__main__":
    main()
