// Throughput of the reduction kernel (comm/reduce.h) that every all-reduce, reduce and reduce-scatter
// runs: reduce_into(dst, src) for float32 and bfloat16 sum from 64 KiB to 64 MiB per buffer. GB/s counts
// the bytes the kernel touches (read dst, read src, write dst = 3 x buffer), so it compares directly
// with memcpy bandwidth (2 x buffer per copy; reported as BM_Memcpy for reference).
//
//   build-*/microbench/bench_reduce --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "trident/comm/reduce.h"

namespace {

void fill_bf16(std::vector<uint16_t>& v) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = trident::float_to_bf16(static_cast<float>(i % 7));
}

void BM_ReduceInto(benchmark::State& state, trident::DType dtype) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t es = trident::dtype_size(dtype), n = bytes / es;
  std::vector<uint16_t> dst(bytes / 2), src(bytes / 2);
  if (dtype == trident::DType::kBFloat16) {
    fill_bf16(dst);
    fill_bf16(src);
  } else {
    auto* d = reinterpret_cast<float*>(dst.data());
    auto* s = reinterpret_cast<float*>(src.data());
    for (size_t i = 0; i < n; ++i) d[i] = 0, s[i] = static_cast<float>(i % 7);
  }
  for (auto _ : state) {
    trident::reduce_into(dst.data(), src.data(), n, dtype, trident::ReduceOp::kSum);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * static_cast<int64_t>(bytes));
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<char> dst(bytes, 1), src(bytes, 2);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * static_cast<int64_t>(bytes));
}

}  // namespace

BENCHMARK_CAPTURE(BM_ReduceInto, float32_sum, trident::DType::kFloat32)->RangeMultiplier(4)->Range(64 << 10, 64 << 20);
BENCHMARK_CAPTURE(BM_ReduceInto, bfloat16_sum, trident::DType::kBFloat16)->RangeMultiplier(4)->Range(64 << 10, 64 << 20);
BENCHMARK(BM_Memcpy)->RangeMultiplier(4)->Range(64 << 10, 64 << 20);

BENCHMARK_MAIN();
