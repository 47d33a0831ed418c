#include "trident/parallel/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "trident/core/error.h"
#include "trident/core/timeline.h"
#include "trident/core/log.h"
#include "trident/optim/schedule.h"

namespace trident::parallel {

DataParallel::DataParallel(nn::Model& model, std::shared_ptr<ProcessGroup> pg, DataParallelOptions options)
    : model_(model), options_(options), ctx_{model, std::move(pg), kernels::device_ops(model.device()), 0, 1, 0, 0, CommStats{}} {
  ctx_.rank = ctx_.pg->rank();
  ctx_.world = ctx_.pg->size();
  ctx_.n = model_.num_params();
  ctx_.padded = (ctx_.n + ctx_.world - 1) / ctx_.world * ctx_.world;
  const size_t n = ctx_.n;
  deferred_init_ = !model_.initialized();
  TRIDENT_CHECK(!deferred_init_ || options_.strategy == Strategy::kZero3, InvalidArgument,
                "data parallel {}: the model was built without its initial values (deferred initialization), which "
                "only zero3 fills (each rank its own pieces); build the model initialized for {}",
                strategy_name(options_.strategy), strategy_name(options_.strategy));
  storage_ = make_storage(options_.storage_dtype, ctx_, options_.adamw);  // refuses other dtypes first
  sharding_ = make_sharding(options_.strategy, ctx_);
  // Bucket caps in float32 elements (bf16 storage too: its buckets cover the same ranges).
  const size_t cap = options_.bucket_bytes / sizeof(float);
  const size_t first_cap = options_.first_bucket_bytes > 0 ? options_.first_bucket_bytes / sizeof(float) : cap;
  BucketLayout layout;
  if (zero3()) {
    const BucketLayout units = build_param_units();
    layout = sharding_->layout(first_cap, cap, &units);
  } else {
    layout = sharding_->layout(first_cap, cap, nullptr);
  }
  engine_ = std::make_unique<BucketEngine>(std::move(layout), options_.overlap, [this](size_t i) { launch(i); });
  if (bf16() && !zero3()) {
    if (model_.blocks().empty()) always_materialized_ = true;  // no hooks: the model stays materialised
    else build_param_units();
  }
  model_.set_grad_ready_hook([this](size_t idx) { on_grad_ready(idx); });
  // Gradients in the group's registered memory (host memory: CPU models only): the peers read (and
  // all-reduce writes) them directly.
  const bool share_grads = options_.shared_gradients && ctx_.world > 1 && n > 0 && ctx_.on_cpu();
  std::function<std::shared_ptr<RegisteredBuffer>(size_t)> shared;
  if (share_grads) shared = [this](size_t bytes) { return shared_buffer(bytes); };
  gradients_shared_ = storage_->allocate(*sharding_, shared);
  // Released gradient pages read back as zero: zero_grad need not write (and re-fault) them.
  if (sharding_->shards_gradients() || bf16()) model_.set_zero_grad_releases_pages(true);
  if (block_hooks()) {
    param_state_.assign(punits_.size(), ParamState::kGathered);  // the model's buffer holds everything now
    gather_work_.resize(punits_.size());
    model_.set_block_hook([this](int b, nn::Model::BlockEvent e) { on_block(b, e); });
  }
  if (ctx_.rank == 0) {
    const auto& bs = engine_->buckets();
    log_info("data parallel: {} on {} ranks ({}), {} parameters ({} padded), {} gradient buckets of <= {} MiB{}, {} "
             "storage{}{}",
             strategy_name(options_.strategy), ctx_.world, kernels::device_name(ctx_.ops.device), n,
             sharding_->shards_gradients() ? sharding_->shard_numel() * ctx_.world : ctx_.padded, bs.size(),
             options_.bucket_bytes / double(1 << 20),
             bs.size() > 1 && !sharding_->shards_gradients()
                 ? fmt::format(" (first {:.2f} MiB)", (bs[0].end - bs[0].begin) * 4 / double(1 << 20))
                 : std::string(),
             dtype_name(options_.storage_dtype),
             gradients_shared_ ? ", gradients in shared memory (reduced in place, zero copy)" : "",
             options_.adamw.offload ? ", optimizer offloaded (this rank's moments and master weights in host memory)"
                                    : "");
  }
}

std::shared_ptr<RegisteredBuffer> DataParallel::shared_buffer(size_t bytes) {
  try {
    return ctx_.pg->alloc_shared(bytes);
  } catch (const Error& e) {
    log_warn("data parallel: gradients stay in private memory: {} bytes of registered memory could not be had ({})",
             bytes, e.what());
    return nullptr;
  }
}

// Parameter units: one per run of parameters (in flat order) owned by the same block, a parameter being
// owned by the first block that lists it; punits_ highest offset first (backward's order), tiling [0, n).
BucketLayout DataParallel::build_param_units() {
  const auto& params = model_.parameters();
  const auto blocks = model_.blocks();
  const char* who = zero3() ? "zero3" : "bfloat16 storage";
  TRIDENT_CHECK(!blocks.empty(), InvalidArgument,
                "zero3: model kind '{}' does not describe its blocks (nn::Model::blocks()); use zero2, or implement "
                "blocks() and set_block_hook() for it",
                model_.kind());
  const size_t n = model_.num_params();
  std::vector<int> owner(params.size(), -1);
  for (size_t b = 0; b < blocks.size(); ++b)
    for (size_t k : blocks[b].params) {
      TRIDENT_CHECK(k < params.size(), InvalidArgument, "{}: block {} lists parameter {} of {}", who, blocks[b].name, k,
                    params.size());
      if (owner[k] < 0) owner[k] = static_cast<int>(b);
    }
  for (size_t k = 0; k < params.size(); ++k)
    TRIDENT_CHECK(owner[k] >= 0 || params[k].numel == 0, InvalidArgument,
                  "{}: parameter '{}' is in none of the model's blocks, so nothing would materialise it before use; "
                  "list it in the block that reads it (nn::Model::blocks())",
                  who, params[k].name);
  std::vector<size_t> order(params.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return params[a].offset < params[b].offset; });
  // Ascending runs first.
  struct Run {
    size_t begin;
    int owner;
    std::vector<size_t> params;
  };
  std::vector<Run> runs;
  for (size_t k : order) {
    if (runs.empty() || runs.back().owner != owner[k]) runs.push_back({params[k].offset, owner[k], {}});
    runs.back().params.push_back(k);
  }
  const size_t U = runs.size();
  punits_.clear();
  std::vector<int> punit_params;
  std::vector<int> unit_of(params.size(), -1);
  for (size_t i = U; i-- > 0;) {  // reverse: punits_[0] is the highest range
    punits_.emplace_back(i == 0 ? 0 : runs[i].begin, i + 1 == U ? n : runs[i + 1].begin);
    punit_params.push_back(static_cast<int>(runs[i].params.size()));
    for (size_t k : runs[i].params) unit_of[k] = static_cast<int>(punits_.size() - 1);
  }
  block_units_.assign(blocks.size(), {});
  last_fwd_.assign(U, -1);
  last_bwd_.assign(U, -1);
  for (size_t b = 0; b < blocks.size(); ++b) {
    auto& us = block_units_[b];
    for (size_t k : blocks[b].params) us.push_back(static_cast<size_t>(unit_of[k]));
    std::sort(us.begin(), us.end());
    us.erase(std::unique(us.begin(), us.end()), us.end());
    for (size_t u : us) {
      last_fwd_[u] = std::max(last_fwd_[u], static_cast<int>(b));
      if (last_bwd_[u] < 0) last_bwd_[u] = static_cast<int>(b);  // lowest block index reading u
    }
  }
  return unit_buckets(punits_, punit_params, unit_of);
}

DataParallel::~DataParallel() {
  model_.set_grad_ready_hook(nullptr);
  if (block_hooks()) model_.set_block_hook(nullptr);
  if (sharding_->shards_gradients() || bf16()) model_.set_zero_grad_releases_pages(false);
  engine_->drain();
  for (auto& w : gather_work_)
    if (w) {
      try {
        w->wait();
      } catch (const std::exception&) {
      }
    }
}

std::vector<std::pair<size_t, size_t>> DataParallel::bucket_ranges() const {
  std::vector<std::pair<size_t, size_t>> r;
  for (const auto& b : engine_->buckets()) r.emplace_back(b.begin, b.end);
  return r;
}

void DataParallel::broadcast_parameters() {
  const size_t n = ctx_.n;
  if (deferred_init_ && !sharded_) {
    // Nothing to send: every rank draws the pieces it owns from the same per-tensor streams.
    ensure_sharded();
    return;
  }
  const bool owns_state = zero3() || bf16();
  if (owns_state && sharded_) {
    // Parameters live in the shards (bf16: the master copy): rank 0's full model is gathered first, then
    // broadcast.
    gather_full_parameters();
  }
  ctx_.pg->broadcast(model_.param_data(), n, DType::kFloat32, 0);
  ctx_.account(OpKind::kBroadcast, static_cast<double>(n) * 4);
  if (owns_state) {
    sharded_ = false;  // re-take the shards from the broadcast values
    materialized_ = false;
    ensure_sharded();
  }
}

// ---- gradients: bucket collectives during backward ----

void DataParallel::launch(size_t i) {
  GradBucket& b = engine_->buckets()[i];
  b.work = sharding_->reduce(i, b, *storage_);
}

// zero2/3: hands back the full-gradient pages of every bucket whose reduce-scatter has finished (waiting
// for all of them when `wait`).
void DataParallel::release_finished_grads(bool wait) {
  engine_->release_finished(wait, [this](const GradBucket& b) { ctx_.release(model_.grad_data() + b.begin, b.end - b.begin); });
}

void DataParallel::on_grad_ready(size_t idx) {
  if (!require_sync_) return;
  engine_->on_grad_ready(idx);
  if (sharding_->shards_gradients()) release_finished_grads(false);
}

void DataParallel::finish_gradient_sync() {
  if (!require_sync_) return;
  // One rank with float32 ddp/zero1 has nothing to run; every other combination converts or shards.
  const bool launch_rest = ctx_.world > 1 || sharding_->shards_gradients() || bf16();
  if (sharding_->shards_gradients()) engine_->finish(launch_rest, [this] { release_finished_grads(true); });
  else engine_->finish(launch_rest);
}

double DataParallel::clip_grad_norm(float max_norm) {
  const double norm = std::sqrt(sharding_->grad_sq_norm(*storage_));
  storage_->clip(optim::clip_coefficient(norm, max_norm));
  return norm;
}

void DataParallel::step(float lr) {
  ++storage_->step();
  ensure_sharded();
  if (block_hooks()) release_all_units();  // materialised float32 copies are stale after the update
  sharding_->update(*storage_, lr);
  storage_->clip(1.0f);
  if (always_materialized_) storage_->materialize(0, ctx_.n);
  last_stats_ = ctx_.stats;
  ctx_.stats = CommStats{};
}

// ---- parameter units: zero3 shards and bf16 materialisation, driven by the block schedule ----

void DataParallel::ensure_sharded() {
  if (sharded_ || (!zero3() && !bf16())) return;
  if (deferred_init_) {
    // A model built without its initial values: this rank draws only the pieces it owns (into the model's
    // buffer, whose pages the release below hands back), so it never holds the whole model.
    for (const auto& p : sharding_->owned()) model_.initialize_range(p.flat_begin, p.flat_begin + p.count);
    deferred_init_ = false;
  }
  storage_->take_params(*sharding_);
  sharded_ = true;
  materialized_ = false;
  if (always_materialized_) {
    storage_->materialize(0, ctx_.n);  // the model reads the bf16 values
    return;
  }
  for (auto& s : param_state_) s = ParamState::kGathered;
  gathered_ = ctx_.n;
  release_all_units();
  peak_gathered_ = gathered_;
}

void DataParallel::gather_unit(size_t ui) {
  if (param_state_[ui] != ParamState::kReleased) return;
  if (!zero3()) return;  // local bf16 source: widened when waited for
  gather_work_[ui] = sharding_->gather_param_unit(ui, *storage_);
  set_unit_state(ui, ParamState::kInFlight);
}

void DataParallel::set_unit_state(size_t ui, ParamState to) {
  const bool was = param_state_[ui] != ParamState::kReleased, now = to != ParamState::kReleased;
  const size_t n = punits_[ui].second - punits_[ui].first;
  if (now && !was) {
    gathered_ += n;
    peak_gathered_ = std::max(peak_gathered_, gathered_);
  } else if (was && !now) {
    gathered_ -= n;
  }
  param_state_[ui] = to;
}

void DataParallel::wait_unit(size_t ui) {
  gather_unit(ui);
  const auto [b, e] = punits_[ui];
  if (param_state_[ui] == ParamState::kInFlight) {
    {
      ScopedSpan span(SpanKind::kComm, "all_gather(zero3 unit)");
      gather_work_[ui]->wait();
    }
    gather_work_[ui].reset();
    storage_->after_param_gather(b, e);
    set_unit_state(ui, ParamState::kGathered);
  } else if (param_state_[ui] == ParamState::kReleased) {
    storage_->materialize(b, e);  // bf16 ddp/zero1/zero2: from the local bf16 copy
    set_unit_state(ui, ParamState::kGathered);
  }
}

void DataParallel::release_unit(size_t ui) {
  if (param_state_[ui] == ParamState::kReleased) return;
  if (param_state_[ui] == ParamState::kInFlight) wait_unit(ui);
  const auto [b, e] = punits_[ui];
  ctx_.release(model_.param_data() + b, e - b);
  set_unit_state(ui, ParamState::kReleased);
}

void DataParallel::release_all_units() {
  for (size_t u = 0; u < punits_.size(); ++u) release_unit(u);
  materialized_ = false;
}

void DataParallel::write_master_to_model() {
  for (size_t u = 0; u < punits_.size(); ++u)  // no gather may still be writing into the buffer
    if (param_state_[u] == ParamState::kInFlight) wait_unit(u);
  if (storage_->offloaded() && !ctx_.on_cpu()) {  // a host master: gathered on the host, then uploaded
    std::vector<float> full(ctx_.n);
    sharding_->gather_state(storage_->state_ops(), storage_->master(), full.data());
    ctx_.ops.to_device(model_.param_data(), full.data(), ctx_.n * sizeof(float));
    return;
  }
  sharding_->gather_state(ctx_.ops, storage_->master(), model_.param_data());
}

void DataParallel::gather_full_parameters() {
  if (bf16()) {
    // The float32 master weights, materialised for forward-only passes until the next backward or step().
    ensure_sharded();
    write_master_to_model();
    for (size_t u = 0; u < punits_.size(); ++u)
      if (param_state_[u] == ParamState::kReleased) set_unit_state(u, ParamState::kGathered);
    materialized_ = !punits_.empty();
    return;
  }
  if (!zero3()) return;
  ensure_sharded();
  for (size_t u = 0; u < punits_.size(); ++u) gather_unit(u);
  for (size_t u = 0; u < punits_.size(); ++u) wait_unit(u);
  materialized_ = true;
}

void DataParallel::on_block(int b, nn::Model::BlockEvent e) {
  using E = nn::Model::BlockEvent;
  ensure_sharded();
  const int K = static_cast<int>(block_units_.size());
  if (b < 0 || b >= K) return;
  const auto& mine = block_units_[b];
  switch (e) {
    case E::kBeforeForward:
      if (materialized_) return;
      for (size_t u : mine) wait_unit(u);
      if (b + 1 < K)
        for (size_t u : block_units_[b + 1]) gather_unit(u);  // prefetch
      return;
    case E::kAfterForward:
      if (materialized_) return;
      for (size_t u : mine)
        if (last_fwd_[u] == b) release_unit(u);
      return;
    case E::kBeforeRecompute:
    case E::kBeforeBackward:
      if (materialized_) {
        // A backward pass after a checkpoint's full gather: back to shards, keeping what this block reads
        // (bf16: the buffer holds the master weights, so this block re-materialises its bf16 values too).
        materialized_ = false;
        for (size_t u = 0; u < punits_.size(); ++u)
          if (bf16() || std::find(mine.begin(), mine.end(), u) == mine.end()) release_unit(u);
      }
      for (size_t u : mine) wait_unit(u);
      if (b > 0)
        for (size_t u : block_units_[b - 1]) gather_unit(u);  // prefetch the next block of the backward pass
      return;
    case E::kAfterRecompute:
      return;
    case E::kAfterBackward:
      if (materialized_) return;
      for (size_t u : mine)
        if (last_bwd_[u] == b) release_unit(u);
      return;
  }
}

// ---- accounting ----

MemoryReport DataParallel::memory() const {
  MemoryReport m;
  double gathered = 0;  // float32 working copies of stored parameters materialised now
  if (!sharded_ || always_materialized_) gathered = static_cast<double>(ctx_.n);
  else
    for (size_t u = 0; u < punits_.size(); ++u)
      if (param_state_[u] != ParamState::kReleased) gathered += static_cast<double>(punits_[u].second - punits_[u].first);
  storage_->memory(m, gathered);
  return m;
}

MemoryReport DataParallel::resident_memory() const {
  MemoryReport m;
  storage_->resident(m);
  return m;
}

nlohmann::json DataParallel::report() const {
  nlohmann::json j;
  j["strategy"] = strategy_name(options_.strategy);
  j["storage_dtype"] = dtype_name(options_.storage_dtype);
  j["device"] = kernels::device_name(ctx_.ops.device);
  j["world"] = ctx_.world;
  j["buckets"] = engine_->buckets().size();
  j["first_bucket_bytes"] = engine_->buckets().empty()
                                ? 0.0
                                : static_cast<double>(engine_->buckets()[0].end - engine_->buckets()[0].begin) * 4;
  j["gradients_shared"] = gradients_shared_;
  j["offload"] = options_.adamw.offload ? "optimizer" : "none";
  const MemoryReport held = memory(), res = resident_memory();
  for (auto& [k, v] : held.bytes) j["memory_bytes"][k] = v;
  for (auto& [k, v] : res.bytes) j["resident_bytes"][k] = v;
  for (auto& [k, v] : held.host_bytes) j["host_memory_bytes"][k] = v;
  for (auto& [k, v] : res.host_bytes) j["host_resident_bytes"][k] = v;
  for (auto& [k, v] : last_stats_.bytes) j["comm_bytes_per_step"][k] = v;
  for (auto& [k, v] : last_stats_.calls) j["comm_calls_per_step"][k] = v;
  // Gradient collectives against backward, means over the synced steps (fraction: of the summed times).
  const OverlapStats& t = engine_->overlap_totals();
  const double n = std::max(1, t.steps);
  j["overlap"] = {{"steps", t.steps},
                  {"comm_hidden_fraction", t.hidden_fraction()},
                  {"comm_s", t.comm_s / n},
                  {"comm_hidden_s", t.hidden_s / n},
                  {"comm_exposed_s", t.exposed_s / n},
                  {"backward_window_s", t.backward_s / n}};
  return j;
}

// ---- checkpoints ----

bool DataParallel::streams_checkpoints() const { return zero3() && !bf16() && ctx_.on_cpu(); }

int64_t DataParallel::optimizer_step() const { return storage_->step(); }

void DataParallel::read_checkpoint_range(int which, size_t begin, size_t count, float* dst) {
  TRIDENT_CHECK(streams_checkpoints(), InvalidArgument,
                "data parallel {}: checkpoints are gathered whole (read_checkpoint_range is zero3's, float32, CPU)",
                strategy_name(options_.strategy));
  TRIDENT_CHECK(which >= 0 && which <= 2, InvalidArgument, "read_checkpoint_range: which {} is not 0, 1 or 2", which);
  ensure_sharded();  // the shards are the parameters' truth (a model never stepped is sharded here first)
  const float* state = which == 0   ? static_cast<const float*>(storage_->params_shard())
                       : which == 1 ? storage_->exp_avg()
                                    : storage_->exp_avg_sq();
  sharding_->gather_state_range(state, begin, count, dst);
}

void DataParallel::gather_state_to_host(const float* state, std::vector<float>* out) {
  out->assign(ctx_.n, 0.0f);
  if (ctx_.on_cpu() || storage_->offloaded()) {  // the state is host memory
    sharding_->gather_state(storage_->state_ops(), state, out->data());
    return;
  }
  kernels::DeviceArray<float> full(ctx_.ops, ctx_.n);
  sharding_->gather_state(ctx_.ops, state, full.data());
  ctx_.ops.to_host(out->data(), full.data(), ctx_.n * sizeof(float));
}

void DataParallel::gather_optimizer_state(std::vector<float>* m, std::vector<float>* v, int64_t* step) {
  *step = storage_->step();
  gather_state_to_host(storage_->exp_avg(), m);
  gather_state_to_host(storage_->exp_avg_sq(), v);
  if (bf16()) {
    // The float32 master weights into the model's buffer for the save that follows. The units stay marked
    // released (their pages hold the master weights until the next pass re-materialises the bf16 values
    // and releases them), so training after the save runs exactly as without it.
    ensure_sharded();
    write_master_to_model();
    for (size_t u = 0; u < punits_.size(); ++u)
      if (param_state_[u] == ParamState::kGathered) set_unit_state(u, ParamState::kReleased);
    materialized_ = false;
    return;
  }
  if (zero3()) gather_full_parameters();  // the save writes the whole model
}

void DataParallel::load_optimizer_state(const std::vector<float>& m, const std::vector<float>& v, int64_t step) {
  const size_t n = ctx_.n;
  if (m.size() != n || v.size() != n)
    TRIDENT_THROW(InvalidArgument, "optimizer state has {} / {} elements; the model has {} parameters", m.size(),
                  v.size(), n);
  for (auto [src, dst] : {std::pair{&m, storage_->exp_avg()}, std::pair{&v, storage_->exp_avg_sq()}}) {
    if (ctx_.on_cpu() || storage_->offloaded()) {  // the state is host memory
      sharding_->scatter_state(storage_->state_ops(), src->data(), dst);
    } else {
      kernels::DeviceArray<float> full(ctx_.ops, n);
      ctx_.ops.to_device(full.data(), src->data(), n * sizeof(float));
      sharding_->scatter_state(ctx_.ops, full.data(), dst);
    }
  }
  storage_->step() = step;
}

}  // namespace trident::parallel
