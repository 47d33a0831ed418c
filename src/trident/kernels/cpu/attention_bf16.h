// Internal: causal attention with bfloat16 operands, flash-style, on AVX512-BF16 (attention_bf16.cc), behind
// kernels::cpu::attention_forward/backward with Precision::kBFloat16 (attention.cc picks it). Same contract
// as those (ops.h): qkv[B,T,3C], out[B,T,C], lse[B,NH,T]; dqkv overwritten. Ownership: thread-local tile
// scratch only. Blocking: runs on the kernels' pool, split by shape alone, so results are bitwise the same
// on any thread count. Thread-safety: concurrent calls on disjoint outputs are safe. No timeouts.
// Only call at ISA level avx512bf16 or higher.
#pragma once

namespace trident::kernels::cpu::detail {

// The forward: out and lse (lse = running max + log of the running sum of each score row).
void flash_bf16_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
// The backward from the saved lse; D[(b NH + h) T + t] = dO . O of each row and head (float32, laid out
// as lse), computed by the caller.
void flash_bf16_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D, int B,
                         int T, int C, int NH);

// The shortest sequence the kernel runs on (attention.cc's choice; shorter ones run the float32 kernel):
// 65 by default, more than one 64-key tile. At T 64 the float32 kernel measured as fast or faster (AMD EPYC
// Zen 5: 76 against 73 GFLOP/s forward, 112 against 95 backward at nanoGPT's shapes; at T 128 the
// bfloat16 kernel leads, 97 against 73 and 158 against 116). Testability knob: tests lower it to 1 to run
// the kernel at every T; values below 1 read as 1. Not to race kernel calls.
int flash_bf16_min_t();
void set_flash_bf16_min_t(int t);

}  // namespace trident::kernels::cpu::detail
