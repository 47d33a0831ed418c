#include "trident/train/trainer.h"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "trident/comm/store/rendezvous.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/core/timeline.h"
#include "trident/data/file_io.h"
#include "trident/data/rng.h"
#include "trident/kernels/cpu/isa.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/device.h"
#include "trident/nn/arch/architecture.h"
#include "trident/nn/models.h"
#include "trident/optim/schedule.h"
#include "trident/train/generate.h"
#include "trident/train/prediction.h"
#include "trident/train/run_plan.h"

namespace trident::train {
namespace fs = std::filesystem;

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Where one training step's time went on this rank. Every instant of the step falls in exactly one segment
// (lap() measures from the previous mark), so the parts add up to the step time. All five are measured:
//   data       sampling the step's batches;
//   compute    forward and backward (the micro-steps), less the waits inside them;
//   comm       exposed communication: the time this thread waited on collectives, namely the whole
//              after_backward hook (finishing the gradient all-reduces that backward did not hide), the loss
//              average, and the collectives' kComm spans inside compute and the optimizer (tensor-parallel
//              all-reduces, ZeRO gathers, the clip norm's all-reduce; core/timeline.h take_thread_waits());
//              collectives that run while this thread computes are hidden, not counted;
//   bubble     the pipeline's sends and receives waited on inside the micro-steps: under a pipeline schedule
//              a stage waits on its neighbour mostly while it has no work, which is the bubble;
//   optimizer  zeroing gradients, clipping and the update, less the waits inside them.
class StepSplit {
 public:
  enum Part { kCompute, kComm, kBubble, kData, kOptimizer, kParts };
  static constexpr const char* kNames[kParts] = {"compute", "comm", "bubble", "data", "optimizer"};

  explicit StepSplit(Clock::time_point t0) : mark_(t0) { take_thread_waits(); }
  // The time since the last lap is `part`'s, except this thread's waits inside it, which go to comm and
  // bubble (a comm segment is comm whole).
  void lap(Part part) {
    const Clock::time_point now = Clock::now();
    const double d = std::chrono::duration<double>(now - mark_).count();
    mark_ = now;
    const ThreadWaits w = take_thread_waits();
    if (part == kComm) {
      s_[kComm] += d;
      return;
    }
    const double coll = std::min(d, 1e-9 * static_cast<double>(w.collective_ns));
    const double pipe = std::min(d - coll, 1e-9 * static_cast<double>(w.pipeline_ns));
    s_[kComm] += coll;
    s_[kBubble] += pipe;
    s_[part] += d - coll - pipe;
  }
  double total() const {
    double t = 0;
    for (double x : s_) t += x;
    return t;
  }
  // {step, compute, comm, bubble, data, optimizer} in milliseconds from [total, parts...] in seconds.
  static nlohmann::json to_json_ms(const double* v) {
    nlohmann::json j = {{"step", 1e3 * v[0]}};
    for (int p = 0; p < kParts; ++p) j[kNames[p]] = 1e3 * v[1 + p];
    return j;
  }
  std::vector<double> values() const {
    std::vector<double> v = {total()};
    v.insert(v.end(), s_, s_ + kParts);
    return v;
  }

 private:
  Clock::time_point mark_;
  double s_[kParts] = {};
};

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string fmt_rate(double r) {
  if (r >= 1e6) return fmt::format("{:.2f}M", r / 1e6);
  if (r >= 1e3) return fmt::format("{:.1f}k", r / 1e3);
  return fmt::format("{:.0f}", r);
}

// TRIDENT_TEST_KILL_AT=RANK:STEP (tests only): the step at whose start this process SIGKILLs itself, when it
// is world rank RANK in the first round of its job; -1 otherwise.
int64_t test_kill_step() {
  const std::string v = env::param_string("TRIDENT_TEST_KILL_AT");
  if (v.empty() || env::restart_count() != 0) return -1;
  const size_t colon = v.find(':');
  int rank = -1;
  int64_t step = -1;
  const bool ok = colon != std::string::npos &&
                  std::from_chars(v.data(), v.data() + colon, rank).ptr == v.data() + colon &&
                  std::from_chars(v.data() + colon + 1, v.data() + v.size(), step).ptr == v.data() + v.size() &&
                  rank >= 0 && step >= 0;
  TRIDENT_CHECK(ok, InvalidArgument, "TRIDENT_TEST_KILL_AT='{}': expected RANK:STEP, e.g. 2:7", v);
  return rank == rendezvous_from_env().rank ? step : -1;
}

// Keys whose change makes a checkpoint unusable for --resume (the model and what defines the batches).
void check_resume_compatible(const TrainConfig& cfg, const nlohmann::json& saved, const std::string& dir) {
  if (!saved.is_object()) return;
  nlohmann::json now = cfg.to_json();
  // batch_size is per data-parallel rank: a resume under another layout may change it as long as the global
  // batch stays (the data sampler's check_state compares that).
  for (const char* key : {"model", "n_layer", "n_head", "n_embd", "block_size", "bias", "gelu", "tokenizer",
                          "gradient_accumulation_steps", "seed", "sampler", "dtype"}) {
    if (saved.contains(key) && saved[key] != now[key]) {
      TRIDENT_THROW(InvalidArgument,
                    "--resume: this run has {}={} but the checkpoint {} was trained with {}={}; use the same value "
                    "(or a new out_dir to start over)",
                    key, now[key].dump(), dir, key, saved[key].dump());
    }
  }
}
}  // namespace

void Trainer::check_gpu_memory(const nlohmann::json& model_config) {
  const std::string described = kernels::device_ops(kernels::Device::kCuda).describe();
  const std::string gpu = plan::gpu_for_device_name(described);
  if (gpu.empty()) {
    if (writer())
      log_info("device memory not checked before allocating: '{}' is not a GPU of the hardware catalog", described);
    return;
  }
  const int vocab = model_config.value("valid_vocab_size", 0) > 0 ? model_config["valid_vocab_size"].get<int>()
                                                                   : model_config.value("vocab_size", 0);
  if (!plan_model_spec(cfg_, vocab).transformer) {
    if (writer()) log_info("device memory not checked before allocating: the planner models transformers only");
    return;
  }
  try {
    const plan::MemoryCheck mc = check_device_memory(cfg_, vocab, hooks_.world, hooks_.zero_stage, gpu);
    if (writer()) log_info("{} ({})", mc.str(), gpu);
  } catch (const InvalidArgument& e) {  // a layout the planner cannot evaluate still trains (OutOfMemory passes)
    if (writer()) log_info("device memory not checked before allocating: the planner refused the layout: {}", e.what());
  }
}

std::unique_ptr<nn::Model> model_from_checkpoint(
    const LoadedCheckpoint& ckpt, const std::function<std::unique_ptr<nn::Model>(const nlohmann::json&)>& make) {
  auto model = make ? make(ckpt.meta.model_config) : nn::make_model(ckpt.meta.model_config);
  load_weights(*model, ckpt.weights, ckpt.dir);
  return model;
}

Trainer::Trainer(TrainConfig cfg, TrainerHooks hooks) : cfg_(std::move(cfg)), hooks_(std::move(hooks)) {
  cfg_.validate();
  // Fails at once (before any data is read) when the device cannot be used: DeviceUnavailable says why.
  kernels::device_ops(kernels::parse_device(cfg_.model.device));
  const bool default_model = !hooks_.make_model;
  if (default_model) hooks_.make_model = [](const nlohmann::json& j) { return nn::make_model(j); };
  if (!hooks_.average) hooks_.average = [](double v) { return v; };
  if (hooks_.out == nullptr) hooks_.out = stdout;
  tty_ = !cfg_.json && ::isatty(::fileno(hooks_.out)) != 0;
  if (cfg_.threads > 0) kernels::cpu::set_num_threads(cfg_.threads);

  std::optional<LoadedCheckpoint> ckpt;
  if (cfg_.resume != Resume::kNo) {
    std::string dir = fs::is_directory(cfg_.out_dir) ? find_checkpoint(cfg_.out_dir) : std::string();
    if (dir.empty() && cfg_.resume == Resume::kYes) {
      TRIDENT_THROW(InvalidArgument,
                    "--resume: no checkpoint in out_dir '{}'; train without --resume first (or --resume auto to "
                    "start fresh when there is none)",
                    cfg_.out_dir);
    }
    if (!dir.empty()) {
      ckpt = load_checkpoint(dir, true);
      check_resume_compatible(cfg_, ckpt->meta.train_config, dir);
    }
  }
  resumed_ = ckpt.has_value();
  // init_from: only the weights (and the model's padded vocabulary) of another checkpoint.
  std::optional<LoadedCheckpoint> init;
  if (!cfg_.init_from.empty() && !ckpt) {
    std::string dir = find_checkpoint(cfg_.init_from);
    if (dir.empty()) TRIDENT_THROW(InvalidArgument, "--init_from '{}': no checkpoint there", cfg_.init_from);
    init = load_checkpoint(dir, false);
    init->meta.has_optimizer = false;
    init->optimizer.clear();
  }

  data::DatasetOptions dopts;
  dopts.source = cfg_.data;
  dopts.tokenizer = data::parse_tokenizer_kind(cfg_.tokenizer);
  dopts.tokenizer_path = cfg_.tokenizer_path();
  if (ckpt) dopts.tokenizer_override = data::Tokenizer::from_json(ckpt->meta.tokenizer);
  dopts.cache_dir = cfg_.cache_dir.empty() ? (fs::path(cfg_.out_dir) / "cache").string() : cfg_.cache_dir;
  dataset_ = data::TokenDataset::open(dopts);

  const int vocab = dataset_->tokenizer().vocab_size();
  nlohmann::json mcfg = model_config_json(cfg_, vocab);
  // On resume the checkpoint's (possibly padded) vocabulary wins: it may come from another layout.
  // The same for the ids the model predicts (its valid vocabulary): the model's, whatever this run's tokenizer.
  for (const LoadedCheckpoint* from : {ckpt ? &*ckpt : nullptr, init ? &*init : nullptr}) {
    if (from == nullptr || !from->meta.model_config.contains("vocab_size")) continue;
    mcfg["vocab_size"] = from->meta.model_config["vocab_size"];
    mcfg["valid_vocab_size"] = from->meta.model_config.value("valid_vocab_size", nlohmann::json(0));
  }
  const int predicted = mcfg.value("valid_vocab_size", 0) > 0 ? mcfg["valid_vocab_size"].get<int>()
                                                               : mcfg["vocab_size"].get<int>();
  TRIDENT_CHECK(vocab <= predicted, InvalidArgument,
                "the tokenizer ({}) has {} ids but the model of {} predicts {}; use the checkpoint's tokenizer (or "
                "one with at most {} ids)",
                cfg_.tokenizer, vocab, ckpt ? ckpt->dir : init ? init->dir : std::string("this run"), predicted,
                predicted);
  // The initializing model's context (learned positions are that long); training windows may be shorter.
  if (init && init->meta.model_config.contains("block_size")) mcfg["block_size"] = init->meta.model_config["block_size"];
  // On a GPU, the planner's device memory for this rank against the device's, before anything is allocated
  // there: a run that cannot fit stops here, naming the bytes and the flags that would fit.
  if (kernels::parse_device(cfg_.model.device) == kernels::Device::kCuda) check_gpu_memory(mcfg);
  const bool defer = hooks_.defer_initialization && default_model && !ckpt && !init;
  model_ = defer ? nn::make_model(mcfg, false) : hooks_.make_model(mcfg);
  optim::AdamWConfig ac;
  ac.lr = static_cast<float>(cfg_.learning_rate);
  ac.beta1 = static_cast<float>(cfg_.beta1);
  ac.beta2 = static_cast<float>(cfg_.beta2);
  ac.weight_decay = static_cast<float>(cfg_.weight_decay);
  // With data parallelism DataParallel keeps (and offloads) each rank's shard; this AdamW steps the model
  // itself in one process and with tensor/pipeline parallelism (each rank's own slices).
  ac.offload = cfg_.offload == "optimizer";
  opt_ = std::make_unique<optim::AdamW>(*model_, ac);

  const int global_batch = cfg_.batch_size * hooks_.world;
  sampler_ = std::make_unique<data::TrainSampler>(data::parse_sampler_kind(cfg_.sampler),
                                                   dataset_->span(data::Split::kTrain), cfg_.model.block_size,
                                                   cfg_.model.seed,
                                                   cfg_.gradient_accumulation_steps, global_batch);
  eval_train_ = std::make_unique<data::RandomWindowSampler>(dataset_->span(data::Split::kTrain), cfg_.model.block_size,
                                                            cfg_.model.seed, data::kStreamEvalTrain);
  eval_val_ = std::make_unique<data::RandomWindowSampler>(dataset_->span(data::Split::kVal), cfg_.model.block_size,
                                                          cfg_.model.seed, data::kStreamEvalVal);

  if (init) {
    if (hooks_.load_checkpoint) hooks_.load_checkpoint(*model_, *opt_, *init);
    else load_weights(*model_, init->weights, init->dir);
    if (writer()) log_info("initialized from {}", init->dir);
  }
  if (ckpt) {
    if (hooks_.load_checkpoint) {
      hooks_.load_checkpoint(*model_, *opt_, *ckpt);
    } else {
      load_weights(*model_, ckpt->weights, ckpt->dir);
      if (ckpt->meta.has_optimizer) {
        std::vector<float> m, v;
        load_optimizer_moments(*model_, ckpt->optimizer, m, v, ckpt->dir);
        opt_->load_state(m, v, ckpt->meta.optimizer_step);
      }
    }
    sampler_->check_state(ckpt->meta.sampler);
    start_step_ = ckpt->meta.step;
    const auto& t = ckpt->meta.trainer;
    evaluated_at_ = t.value("evaluated_at", int64_t{-1});
    best_val_ = t.value("best_val_loss", 1e9);
    elapsed_before_ = t.value("train_seconds", 0.0);
    tokens_before_ = t.value("train_tokens", 0.0);
    if (writer()) log_info("resuming from {} at step {}", ckpt->dir, start_step_);
  }

  if (writer()) {
    std::error_code ec;
    fs::create_directories(cfg_.out_dir, ec);
    if (ec) TRIDENT_THROW(IoError, "cannot create out_dir '{}': {}", cfg_.out_dir, ec.message());
    std::string mpath = (fs::path(cfg_.out_dir) / "metrics.jsonl").string();
    // On resume keep the records of the steps the checkpoint covers (a crashed run may have logged more).
    std::string kept;
    if (ckpt && fs::exists(mpath)) {
      std::ifstream in(mpath);
      std::string line;
      while (std::getline(in, line)) {
        try {
          auto r = nlohmann::json::parse(line);
          int64_t s = r.value("step", int64_t{-1});
          bool keep = r.value("type", "") == "eval" ? s <= evaluated_at_ && s <= start_step_ : s < start_step_;
          if (keep) kept += line + "\n";
        } catch (const nlohmann::json::exception&) {
        }
      }
    }
    metrics_ = std::fopen(mpath.c_str(), "w");
    if (metrics_ == nullptr) TRIDENT_THROW(IoError, "cannot write '{}': {}", mpath, detail::errno_string(errno));
    std::fputs(kept.c_str(), metrics_);
    std::fflush(metrics_);
    // The machine facts that decide speed: the kernels, the threads (CPU) or the GPU they run on.
    if (model_->device() != kernels::Device::kCpu) {
      const auto& ops = kernels::device_ops(model_->device());
      const nn::ModelConfig mc = nn::ModelConfig::from_json(model_->config());
      const int head_dim = nn::architecture(mc.kind).head_dim(mc);
      const std::string kernels =
          ops.kernel_summary(head_dim, cfg_.model.dtype == "bfloat16" ? kernels::cpu::Precision::kBFloat16
                                                                : kernels::cpu::Precision::kFloat32);
      const std::string device = ops.describe();
      log_info("{} kernels on {}: {}", kernels::device_name(model_->device()), device, kernels);
      emit({{"type", "run"}, {"device", device}, {"device_kernels", kernels}});
    } else {
      const std::string kernels = kernels::cpu::kernel_summary();
      log_info("cpu kernels: {}; {} thread(s)", kernels, kernels::cpu::num_threads());
      // bfloat16 pays on the CPU only where a unit multiplies bf16 faster than float32 (AMX tiles, or a
      // vdpbf16ps that outruns the FMAs); elsewhere it rounds the operands, then runs float32's FMAs.
      const kernels::cpu::Isa isa = kernels::cpu::active_isa();
      if (cfg_.model.dtype == "bfloat16" && (isa < kernels::cpu::Isa::kAvx512Bf16 ||
                                       (isa == kernels::cpu::Isa::kAvx512Bf16 && !kernels::cpu::bf16_dot_in_use())))
        log_info("--dtype bfloat16 runs here on float32 FMAs over rounded operands (no faster bfloat16 unit at ISA "
                 "level {}, see the kernels line): --dtype float32 trains faster on this CPU",
                 kernels::cpu::isa_name(isa));
      emit({{"type", "run"},
            {"cpu_isa", kernels::cpu::isa_name(kernels::cpu::active_isa())},
            {"cpu_kernels", kernels},
            {"cpu_features", kernels::cpu::cpu_features()},
            {"threads", kernels::cpu::num_threads()}});
    }
  }
}

bool Trainer::writer() const { return hooks_.writer >= 0 ? hooks_.writer == 1 : hooks_.rank == 0; }

std::string Trainer::first_nonfinite_gradient() const {
  const float* g = model_->grad_data();
  if (g == nullptr) return "";
  std::vector<float> host;  // a host copy of gradients on another device
  if (model_->device() != kernels::Device::kCpu) {
    host.resize(model_->num_params());
    kernels::device_ops(model_->device()).to_host(host.data(), g, host.size() * sizeof(float));
    g = host.data();
  }
  for (const auto& p : model_->parameters())
    for (size_t i = 0; i < p.numel; ++i)
      if (!std::isfinite(g[p.offset + i])) return p.name;
  return "";
}

double Trainer::micro_step(const int32_t* x, const int32_t* y, int B, int T, bool backward, float loss_scale) {
  if (hooks_.forward_backward) return hooks_.forward_backward(x, y, B, T, backward, loss_scale);
  return model_->forward_backward(x, y, B, T, backward, loss_scale);
}

Trainer::~Trainer() {
  if (metrics_ != nullptr) std::fclose(metrics_);
}

void Trainer::emit(const nlohmann::json& rec) {
  if (!writer()) return;
  std::string line = rec.dump() + "\n";
  std::fputs(line.c_str(), metrics_);
  std::fflush(metrics_);
  if (cfg_.json) {
    std::fputs(line.c_str(), hooks_.out);
    std::fflush(hooks_.out);
  }
}

void Trainer::progress(int64_t step, double loss, double lr, double tps, double eta_s) {
  if (!writer() || cfg_.json) return;
  std::string text = fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | {} tok/s | ETA {}", step + 1,
                                 cfg_.max_iters, loss, lr, fmt_rate(tps), fmt_duration(eta_s));
  if (tty_) {
    // Redraw at most ~20 times a second (and always on the last step).
    auto now = Clock::now();
    if (line_open_ && step + 1 != cfg_.max_iters && now - last_draw_ < std::chrono::milliseconds(50)) return;
    last_draw_ = now;
    std::fprintf(hooks_.out, "\r%s\x1b[K", text.c_str());
    line_open_ = true;
  } else if ((step + 1) % cfg_.log_interval == 0 || step + 1 == cfg_.max_iters) {
    std::fprintf(hooks_.out, "%s\n", text.c_str());
  }
  std::fflush(hooks_.out);
}

double Trainer::estimate_loss(data::Split split, int64_t step) {
  const int B = cfg_.batch_size, T = cfg_.model.block_size;
  const int global_batch = B * hooks_.world;
  auto& s = split == data::Split::kTrain ? *eval_train_ : *eval_val_;
  std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
  double sum = 0;
  for (int k = 0; k < cfg_.eval_iters; ++k) {
    s.sample_batch(step, k, global_batch, hooks_.rank * B, B, x.data(), y.data());
    sum += micro_step(x.data(), y.data(), B, T, false, 1.0f);
  }
  return hooks_.average(sum / cfg_.eval_iters);
}

std::string Trainer::save(int64_t step) {
  if (hooks_.before_save) hooks_.before_save();  // every rank (sharded state is gathered collectively)
  TrainerHooks::SaveView view;
  if (hooks_.checkpoint_view) view = hooks_.checkpoint_view();  // every rank (gathers to the writer)
  if (!writer() && !view.read) return {};
  if (view.model == nullptr) {
    view.model = model_.get();
    opt_->sync_state_to_host();  // device moments to exp_avg()/exp_avg_sq() (no-op on the CPU)
    view.exp_avg = &opt_->exp_avg();
    view.exp_avg_sq = &opt_->exp_avg_sq();
    view.optimizer_step = opt_->step_count();
  }
  CheckpointMeta meta;
  meta.step = step;
  meta.model_config = view.model->config();
  meta.tokenizer = dataset_->tokenizer().to_json();
  meta.train_config = cfg_.to_json();
  meta.sampler = sampler_->state(step);
  meta.rng = {{"data", data::Rng(cfg_.model.seed, data::kStreamTrain).state()},
              {"note", "batches are counter-based: (seed, step, micro) determine them"}};
  meta.optimizer_step = view.optimizer_step;
  meta.has_optimizer = true;
  meta.trainer = {{"evaluated_at", evaluated_at_},
                  {"best_val_loss", best_val_},
                  {"train_seconds", elapsed_before_ + run_seconds_},
                  {"train_tokens", tokens_before_ + run_tokens_},
                  {"source_checksum", io::hex64(dataset_->source_checksum())}};
  if (view.read) {
    // Streamed from the shards: every rank runs the reads, in the writer's order; synchronous.
    CheckpointSnapshot snap;
    snap.meta = std::move(meta);
    snap.parameters = view.model->parameters();
    snap.model_kind = view.model->kind();
    snap.read = view.read;
    snap.read_moments = true;
    if (!writer()) {
      drain_checkpoint(snap);
      return {};
    }
    writer_.wait();  // an earlier asynchronous write completes first (checkpoints are written in order)
    return write_checkpoint(cfg_.out_dir, snap, cfg_.keep_checkpoints);
  }
  OptimizerState os{view.exp_avg, view.exp_avg_sq};
  if (!cfg_.async_checkpoint) return save_checkpoint(cfg_.out_dir, *view.model, meta, os, cfg_.keep_checkpoints);
  // The snapshot is taken now (training goes on and changes the model); the files are written meanwhile.
  return writer_.submit(cfg_.out_dir, snapshot_checkpoint(*view.model, meta, os), cfg_.keep_checkpoints);
}

void Trainer::wait_for_checkpoint() { writer_.wait(); }

TrainResult Trainer::run() {
  TrainResult res;
  const int B = cfg_.batch_size, T = cfg_.model.block_size, accum = cfg_.gradient_accumulation_steps;
  const double tokens_per_step = static_cast<double>(B) * T * accum * hooks_.world;
  std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
  int64_t it = start_step_;
  int64_t last_saved = resumed_ ? start_step_ : -1;
  const int64_t kill_at = test_kill_step();
  if (hooks_.on_ready) hooks_.on_ready(*model_);
  double ema_step = 0;
  run_seconds_ = 0;
  run_tokens_ = 0;
  const Clock::time_point t_start = Clock::now();
  auto close_line = [&] {
    if (line_open_) {
      std::fputs("\n", hooks_.out);
      line_open_ = false;
    }
  };

  for (;;) {
    bool eval_now = it % cfg_.eval_interval == 0 || it >= cfg_.max_iters || cfg_.eval_only;
    if (eval_now && (evaluated_at_ != it || cfg_.eval_only)) {
      double tl = estimate_loss(data::Split::kTrain, it);
      double vl = estimate_loss(data::Split::kVal, it);
      evaluated_at_ = it;
      res.train_loss = tl;
      res.val_loss = vl;
      emit({{"type", "eval"}, {"step", it}, {"train_loss", tl}, {"val_loss", vl}});
      if (writer() && !cfg_.json) {
        close_line();
        std::fprintf(hooks_.out, "step %lld: train loss %.4f, val loss %.4f\n", static_cast<long long>(it), tl, vl);
        std::fflush(hooks_.out);
      }
      bool improved = vl < best_val_;
      if (improved) best_val_ = vl;
      const bool end_unsaved = it >= cfg_.max_iters && !cfg_.save_final;  // save_final=false: none at the end
      if ((improved || cfg_.always_save_checkpoint) && it > 0 && !cfg_.eval_only && !end_unsaved) {
        res.last_checkpoint = save(it);
        last_saved = it;
      }
    }
    if (cfg_.eval_only || it >= cfg_.max_iters) break;
    if (it == kill_at) ::kill(::getpid(), SIGKILL);

    const Clock::time_point t0 = Clock::now();
    StepSplit split(t0);
    double lr = cfg_.decay_lr ? optim::lr_at(static_cast<int>(it), cfg_.warmup_iters, cfg_.lr_decay_iters,
                                             static_cast<float>(cfg_.learning_rate), static_cast<float>(cfg_.min_lr))
                              : cfg_.learning_rate;
    model_->zero_grad();
    split.lap(StepSplit::kOptimizer);
    double loss_sum = 0;
    for (int micro = 0; micro < accum; ++micro) {
      if (hooks_.before_micro) hooks_.before_micro(micro, accum);
      split.lap(StepSplit::kCompute);
      sampler_->sample(it, micro, hooks_.rank * B, B, x.data(), y.data());
      split.lap(StepSplit::kData);
      loss_sum += micro_step(x.data(), y.data(), B, T, true, 1.0f / static_cast<float>(accum));
      split.lap(StepSplit::kCompute);
    }
    if (hooks_.after_backward) hooks_.after_backward(*model_);
    split.lap(StepSplit::kComm);
    // The pre-clip global norm (with model parallelism over all shards; grad_clip 0 only measures it) and
    // the loss are the same on every rank: a non-finite one stops or skips the step everywhere alike.
    const float max_norm = static_cast<float>(cfg_.grad_clip);
    const double grad_norm = hooks_.clip ? hooks_.clip(*model_, max_norm)
                                         : optim::clip_grad_norm(kernels::device_ops(model_->device()),
                                                                   model_->grad_data(), model_->num_params(), max_norm);
    split.lap(StepSplit::kOptimizer);
    const double loss = hooks_.average(loss_sum / accum);
    split.lap(StepSplit::kComm);
    const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
    if (!finite && cfg_.on_nonfinite != "skip") {
      const std::string param = first_nonfinite_gradient();
      throw NonFiniteError(
          fmt::format("step {}: the loss is {} and the gradient norm {}; first parameter with a non-finite gradient "
                      "on rank {}: {}. Nothing was updated or saved; lower learning_rate, set grad_clip, or pass "
                      "--on_nonfinite skip to skip such steps",
                      it, loss, grad_norm, hooks_.rank, param.empty() ? "none (another rank holds it)" : param),
          it, param);
    }
    if (!finite) ++res.nonfinite_skips;
    else if (hooks_.step) hooks_.step(static_cast<float>(lr));
    else opt_->step(static_cast<float>(lr));
    split.lap(StepSplit::kOptimizer);
    const double dt = split.total();  // t0 to the last lap
    run_seconds_ += dt;
    run_tokens_ += tokens_per_step;
    ema_step = ema_step == 0 ? dt : 0.9 * ema_step + 0.1 * dt;
    res.losses.push_back(loss);
    nlohmann::json rec = {{"type", "step"},
                          {"step", it},
                          {"loss", loss},
                          {"lr", lr},
                          {"tokens_per_s", tokens_per_step / dt},
                          {"elapsed", seconds_since(t_start)},
                          {"peak_rss_bytes", peak_rss_bytes()}};  // this process's high-water mark (VmHWM)
    if (std::isfinite(grad_norm)) rec["grad_norm"] = grad_norm;
    const std::vector<double> mine = split.values();
    rec["time_ms"] = StepSplit::to_json_ms(mine.data());
    if (hooks_.gather_ranks) {  // collective: every rank's split, in world-rank order
      const std::vector<double> all = hooks_.gather_ranks(mine);
      nlohmann::json ranks = nlohmann::json::array();
      for (size_t at = 0; at + mine.size() <= all.size(); at += mine.size())
        ranks.push_back(StepSplit::to_json_ms(&all[at]));
      rec["time_ms_ranks"] = std::move(ranks);
    }
    if (!finite) rec["skipped"] = true;
    if (res.nonfinite_skips > 0) rec["nonfinite_skips"] = res.nonfinite_skips;
    if (hooks_.annotate_step) hooks_.annotate_step(rec);
    emit(rec);
    progress(it, loss, lr, tokens_per_step / ema_step, ema_step * static_cast<double>(cfg_.max_iters - it - 1));
    ++it;
    if (cfg_.checkpoint_interval > 0 && it % cfg_.checkpoint_interval == 0 && it < cfg_.max_iters) {
      res.last_checkpoint = save(it);
      last_saved = it;
    }
  }
  close_line();
  res.steps = it;
  if (!cfg_.eval_only && cfg_.save_final && last_saved != it && cfg_.max_iters > 0) res.last_checkpoint = save(it);
  writer_.wait();  // the last checkpoint is complete (or its error thrown) before the run reports it
  // Tokens/s of this call's training steps (evaluation and checkpoints not counted).
  res.tokens_per_s = run_seconds_ > 0 ? run_tokens_ / run_seconds_ : 0;

  nn::Model* sample_from = model_.get();
  if (cfg_.sample_tokens > 0 && hooks_.sample_model) sample_from = hooks_.sample_model();  // every rank
  if (cfg_.sample_tokens > 0 && writer() && sample_from == nullptr) {
    std::fprintf(hooks_.out, "sample: skipped (this layout has no full model to sample from)\n");
    std::fflush(hooks_.out);
  }
  if (cfg_.sample_tokens > 0 && sample_from != nullptr && (writer() || hooks_.sample_on_every_rank)) {
    const auto& tok = dataset_->tokenizer();
    std::vector<int32_t> ctx;
    try {
      ctx = tok.encode("\n");
    } catch (const InvalidArgument&) {
      ctx = {0};
    }
    GenerateOptions g;
    g.max_new_tokens = cfg_.sample_tokens;
    g.temperature = cfg_.temperature;
    g.top_k = cfg_.top_k;
    g.seed = cfg_.model.seed;
    auto out = generate_tokens(*sample_from, cfg_.model.block_size, tok.vocab_size(), ctx, g);
    res.sample = tok.decode(out.data() + ctx.size(), out.size() - ctx.size());
  }
  if (hooks_.on_finished) hooks_.on_finished(res);
  if (writer()) {
    if (cfg_.json) {
      emit({{"type", "final"},
            {"step", it},
            {"val_loss", res.val_loss},
            {"train_loss", res.train_loss},
            {"tokens_per_s", res.tokens_per_s},
            {"sample", res.sample},
            {"checkpoint", res.last_checkpoint}});
    } else {
      std::fprintf(hooks_.out, "done: %lld steps | val loss %.4f | train loss %.4f | %s tokens/s\n",
                   static_cast<long long>(it), res.val_loss, res.train_loss, fmt_rate(res.tokens_per_s).c_str());
      if (!res.last_checkpoint.empty()) std::fprintf(hooks_.out, "checkpoint: %s\n", res.last_checkpoint.c_str());
      if (!res.sample.empty()) std::fprintf(hooks_.out, "sample:\n%s\n", res.sample.c_str());
      std::fflush(hooks_.out);
    }
  }
  return res;
}

namespace {
// The model's logits cropped to the tokenizer's vocabulary (a padded vocabulary's extra rows are never
// sampled: they have no text).
class CroppedLogits : public nn::Model {
 public:
  CroppedLogits(nn::Model& m, int model_vocab, int vocab) : m_(m), mv_(model_vocab), v_(vocab) {}
  const std::vector<nn::Parameter>& parameters() const override { return m_.parameters(); }
  float* param_data() override { return m_.param_data(); }
  float* grad_data() override { return m_.grad_data(); }
  size_t num_params() const override { return m_.num_params(); }
  kernels::Device device() const override { return m_.device(); }
  float forward_backward(const int32_t* x, const int32_t* y, int B, int T, bool backward, float s) override {
    return m_.forward_backward(x, y, B, T, backward, s);
  }
  void forward_logits(const int32_t* x, int B, int T, float* logits) override {
    std::vector<float> full(static_cast<size_t>(B) * T * mv_);
    m_.forward_logits(x, B, T, full.data());
    for (size_t r = 0; r < static_cast<size_t>(B) * T; ++r)
      std::copy_n(full.data() + r * mv_, v_, logits + r * v_);
  }
  void zero_grad() override { m_.zero_grad(); }
  void set_grad_ready_hook(GradReadyHook h) override { m_.set_grad_ready_hook(std::move(h)); }
  nlohmann::json config() const override { return m_.config(); }
  std::string kind() const override { return m_.kind(); }

 private:
  nn::Model& m_;
  int mv_, v_;
};
}  // namespace

std::vector<int32_t> generate_tokens(nn::Model& model, int block_size, int vocab_size, std::vector<int32_t> context,
                                     const GenerateOptions& opts) {
  const int model_vocab = model.config().value("vocab_size", vocab_size);
  if (model_vocab == vocab_size) return generate(model, block_size, vocab_size, std::move(context), opts);
  TRIDENT_CHECK(model_vocab > vocab_size, InvalidArgument,
                "the model's vocab_size {} is smaller than the tokenizer's {}", model_vocab, vocab_size);
  CroppedLogits cropped(model, model_vocab, vocab_size);
  return generate(cropped, block_size, vocab_size, std::move(context), opts);
}

double evaluate_windows(nn::Model& model, const data::TokenSpan& span, int block_size, int64_t windows) {
  const int T = block_size;
  TRIDENT_CHECK(windows >= 1, InvalidArgument, "--windows must be at least 1, got {}", windows);
  int64_t max_windows = span.size == 0 ? 0 : static_cast<int64_t>((span.size - 1) / static_cast<size_t>(T));
  if (windows > max_windows) {
    TRIDENT_THROW(InvalidArgument, "--windows {}: the split has {} tokens, enough for at most {} windows of {} tokens",
                  windows, span.size, max_windows, T);
  }
  const int64_t kBatch = 8;
  double sum = 0;
  std::vector<int32_t> x(static_cast<size_t>(kBatch) * T), y(x.size());
  for (int64_t w0 = 0; w0 < windows; w0 += kBatch) {
    int b = static_cast<int>(std::min(kBatch, windows - w0));
    for (int i = 0; i < b; ++i) {
      size_t start = static_cast<size_t>(w0 + i) * static_cast<size_t>(T);
      span.copy(start, static_cast<size_t>(T), x.data() + static_cast<size_t>(i) * T);
      span.copy(start + 1, static_cast<size_t>(T), y.data() + static_cast<size_t>(i) * T);
    }
    sum += static_cast<double>(model.forward_backward(x.data(), y.data(), b, T, false)) * b;
  }
  return sum / static_cast<double>(windows);
}

}  // namespace trident::train
