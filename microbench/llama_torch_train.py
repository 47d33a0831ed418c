#!/usr/bin/python3
"""PyTorch training of a Llama (Hugging Face's LlamaForCausalLM semantics: rotary embeddings, RMSNorm,
grouped-query attention, SwiGLU, no biases, untied head) on character-level text, the peer of
`trident train --model llama` for a side-by-side tokens/s baseline (scripts/llama_vs_pytorch.sh). Mirrors
../shared/peers/ref_train.py (the GPT peer): same arguments, data reading, AdamW, gradient clipping and
timing (median step time after the first 10 steps, batch sampling outside the timed region); prints
'tokens_per_s <x>' last. The layers are the float64 reference of tests/unit/nn/llama_torch.py (the parity
test's model) converted to float32; only the rotary cos/sin are computed here, once per forward and in
float32, so no float64 enters the step. --dtype bfloat16 runs the forward under
torch.autocast("cpu", dtype=torch.bfloat16) (oneDNN; AVX512-BF16 or AMX where the CPU has them).
Run with the system python (/usr/bin/python3, Debian's python3-torch 1.13)."""
import argparse, os, sys, time

import torch, torch.nn as nn, torch.nn.functional as F

sys.dont_write_bytecode = True  # import the reference without leaving __pycache__ in tests/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "unit", "nn"))
import llama_torch as ref  # noqa: E402


class Llama(ref.LlamaForCausalLM):
    """The reference model with the rotary tables in the parameters' dtype (the reference builds them in
    float64 for its parity checks, which would promote q and k to float64 here)."""

    def __init__(s, cfg):
        super().__init__(cfg)
        s.register_buffer("inv_freq", ref.inv_freq_of(cfg).float(), persistent=False)

    def forward(s, idx, tgt):
        T = idx.shape[1]
        freqs = torch.arange(T, dtype=torch.float32)[:, None] * s.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = s.model.embed_tokens(idx)
        for layer in s.model.layers:
            x = layer(x, cos, sin)
        logits = s.lm_head(s.model.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tgt.reshape(-1))


def init_weights(m):  # Hugging Face's _init_weights (initializer_range 0.02); norms stay 1
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, mean=0.0, std=0.02)


def run(a):
    torch.set_num_threads(a.threads)
    raw = open(a.data, "rb").read()
    chars = sorted(set(raw)); stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in raw[: int(len(raw) * 0.9)]], dtype=torch.long)
    torch.manual_seed(0)
    inter = a.intermediate_size or (8 * a.n_embd // 3 + 31) // 32 * 32  # trident's default (352 at 128)
    cfg = ref.Config(len(chars), a.n_embd, a.n_layer, a.n_head, a.n_kv_head or a.n_head, inter, a.norm_eps,
                     a.rope_theta, None, False)
    model = Llama(cfg).float()
    model.apply(init_weights)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    torch.manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)

    def batch():
        ix = torch.randint(len(data) - a.block_size - 1, (a.batch_size,))
        return (torch.stack([data[i:i + a.block_size] for i in ix]),
                torch.stack([data[i + 1:i + 1 + a.block_size] for i in ix]))

    times = []
    for it in range(a.iters):
        x, y = batch(); t0 = time.perf_counter()
        if a.dtype == "bfloat16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x, y)
        else:
            loss = model(x, y)
        opt.zero_grad(set_to_none=True); loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
        times.append(time.perf_counter() - t0)
    med = sorted(times[10:])[len(times[10:]) // 2]
    n = sum(p.numel() for p in model.parameters())
    print(f"params {n} n_kv_head {cfg.kv_heads} intermediate_size {inter} dtype {a.dtype} "
          f"loss {loss.item():.4f} median_iter_ms {med*1e3:.2f}")
    print(f"tokens_per_s {a.batch_size * a.block_size / med:.0f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True); ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--n_layer", type=int, default=4); ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_kv_head", type=int, default=0, help="key/value heads (0: n_head)")
    ap.add_argument("--n_embd", type=int, default=128); ap.add_argument("--block_size", type=int, default=64)
    ap.add_argument("--intermediate_size", type=int, default=0, help="SwiGLU width (0: trident's default)")
    ap.add_argument("--rope_theta", type=float, default=10000.0)
    ap.add_argument("--norm_eps", type=float, default=1e-5, help="RMSNorm epsilon (trident's default)")
    ap.add_argument("--batch_size", type=int, default=12); ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="bfloat16: the forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    run(ap.parse_args())
