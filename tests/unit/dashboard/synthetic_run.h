// A synthetic run folder for the dashboard's tests: what `trident train --nproc 2` writes to metrics.jsonl
// (a run record, the prediction, step and eval records), with one slow link (rank 0 -> rank 1) and one late
// rank in the health records when asked (and the health monitor's rounds in health.jsonl that go with them),
// and a checkpoint's checkpoint.json; and a hung job's flight-recorder dumps.
#pragma once

#include <filesystem>
#include <fstream>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace trident::dashboard::test {

inline std::string synthetic_step(int s, double loss) {
  return nlohmann::json{{"type", "step"},      {"step", s},          {"loss", loss},
                        {"lr", 1e-3},          {"elapsed", 0.05 * (s + 1)}, {"tokens_per_s", 20000.0 + 10 * s},
                        {"grad_norm", 1.5},    {"peak_rss_bytes", 8e7},     {"peak_rss_bytes_max_rank", 9e7},
                        {"comm_exposed_s", 0.002}}
             .dump() +
         "\n";
}

// One health round (train/health.h's health.jsonl line) of 2 ranks: link 0 -> 1 at 0.3x its 1 GB/s baseline
// from round 12 on (a warning at 12), link 1 -> 0 at its baseline, rank 1 180 ms late from 15 on (a warning
// there); no baselines before round 3.
inline std::string synthetic_round(int s) {
  const auto base = [s](double x) { return s < 3 ? nlohmann::json() : nlohmann::json(x); };
  nlohmann::json j = {{"step", s},
                      {"time", 1.7e9 + 0.05 * s},
                      {"links", {{{"src", 0}, {"dst", 1}, {"gbps", s >= 12 ? 0.3 : 1.0}, {"baseline_gbps", base(1.0)}},
                                 {{"src", 1}, {"dst", 0}, {"gbps", 1.0}, {"baseline_gbps", base(1.0)}}}},
                      {"ranks", {{{"rank", 0}, {"late_ms", 0.0}, {"baseline_ms", base(0.0)}},
                                 {{"rank", 1}, {"late_ms", s >= 15 ? 180.0 : 1.0}, {"baseline_ms", base(1.0)}}}}};
  if (s == 12) j["events"] = {{{"kind", "slow_link"}, {"src", 0}, {"dst", 1}, {"ratio", 0.3}, {"since_step", 12}}};
  if (s == 15) j["events"] = {{{"kind", "straggler"}, {"rank", 1}, {"late_ms", 180.0}, {"since_step", 15}}};
  return j.dump() + "\n";
}

// Writes `steps` step records (and evals every 10 steps) to dir/metrics.jsonl; with `slow_link`, the step
// records at 12 and 15 carry a slow-link warning for 0 -> 1 and a late rank 1, health.jsonl holds a round
// per step, and the run records its mesh (2 ranks of dp).
inline void write_synthetic_run(const std::filesystem::path& dir, int steps, bool slow_link) {
  std::filesystem::create_directories(dir / "ckpt-00000010");
  std::ofstream m(dir / "metrics.jsonl", std::ios::trunc);
  m << R"({"type":"run","cpu_isa":"avx2","threads":1})" "\n";
  m << R"({"type":"prediction","parallel":"ddp","world":2,"step_s":0.04,"peak_rss_bytes":7.5e7,"model_flops_per_step":4e9})" "\n";
  if (slow_link) {
    m << R"({"type":"mesh","tp":1,"pp":1,"dp":2,"order":"tp-dp-pp","ranks":[{"rank":0,"tp":0,"pp":0,"dp":0},{"rank":1,"tp":0,"pp":0,"dp":1}]})" "\n";
    std::ofstream h(dir / "health.jsonl", std::ios::trunc);
    for (int s = 0; s < steps; ++s) h << synthetic_round(s);
  }
  for (int s = 0; s < steps; ++s) {
    if (s % 10 == 0) m << nlohmann::json{{"type", "eval"}, {"step", s}, {"train_loss", 4.0 - 0.02 * s}, {"val_loss", 4.1 - 0.02 * s}}.dump() << "\n";
    if (slow_link && (s == 12 || s == 15)) {
      auto rec = nlohmann::json::parse(synthetic_step(s, 4.0 - 0.02 * s));
      if (s == 12)
        rec["health"] = {{{"kind", "slow_link"}, {"src", 0}, {"dst", 1}, {"ratio", 0.31}, {"since_step", 5},
                          {"message", "link host1/rank 0 -> host2/rank 1 at 0.31x its bandwidth since step 5"}}};
      else
        rec["health"] = {{{"kind", "straggler"}, {"rank", 1}, {"late_ms", 180.0}, {"late_fraction", 0.9},
                          {"since_step", 9}, {"message", "host2/rank 1 arrives 180 ms late at 90% of collectives"}}};
      m << rec.dump() << "\n";
    } else {
      m << synthetic_step(s, 4.0 - 0.02 * s);
    }
  }
  std::ofstream(dir / "latest") << "ckpt-00000010\n";
  std::ofstream(dir / "ckpt-00000010" / "checkpoint.json")
      << R"({"format":"trident-checkpoint","step":10,"model":{"kind":"gpt","n_layer":4,"n_embd":128,"n_head":4,"block_size":64,"dtype":"float32"},)"
         R"("sampler":{"global_batch":24,"accumulation":1,"kind":"random"},"optimizer":{"kind":"adamw","step":10}})";
}

// A hung job's flight-recorder dumps (rank 2 never entered all_reduce #3, ranks 0 and 1 timed out in it).
inline void write_hang_dumps(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const int64_t t0 = 1'700'000'000'000'000;
  for (int r = 0; r < 3; ++r) {
    nlohmann::json calls = nlohmann::json::array();
    const int n = r < 2 ? 3 : 2;
    for (int s = 1; s <= n; ++s) {
      const bool stuck = s == 3;
      nlohmann::json c = {{"id", s}, {"seq", s}, {"op", "all_reduce"}, {"count", 1024}, {"bytes", 4096},
                          {"dtype", "float32"}, {"redop", "sum"}, {"root", -1}, {"peer", -1}, {"tag", 0},
                          {"algo", "ring"}, {"state", stuck ? "failed" : "completed"}, {"enqueue_us", t0 + s * 1000},
                          {"start_us", t0 + s * 1000}, {"end_us", t0 + s * 1000 + (stuck ? 20'000'000 : 500)}};
      if (stuck) c["error_type"] = "TimeoutError", c["error"] = "deadline of 20 s expired";
      calls.push_back(c);
    }
    nlohmann::json d = {{"format", "trident-flight-recorder"}, {"version", 1}, {"rank", r}, {"pid", 100 + r},
                        {"host", "h"}, {"reason", "test"}, {"dump_time_us", t0 + 30'000'000},
                        {"groups", {{{"name", "world"}, {"generation", 0}, {"rank", r}, {"size", 3},
                                     {"ranks", {0, 1, 2}}, {"backend", "native"}, {"capacity", 2048},
                                     {"issued", calls.size()}, {"records", calls}}}}};
    std::ofstream(dir / ("rank_" + std::to_string(r) + ".json")) << d.dump();
  }
}

}  // namespace trident::dashboard::test
