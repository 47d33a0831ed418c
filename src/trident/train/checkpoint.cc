#include "trident/train/checkpoint.h"

#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "trident/core/error.h"
#include "trident/core/json_int.h"
#include "trident/core/log.h"
#include "trident/core/tensor.h"
#include "trident/data/file_io.h"
#include "trident/kernels/device.h"

namespace trident::train {
namespace fs = std::filesystem;

namespace {
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimFile = "optimizer.safetensors";
constexpr const char* kMetaFile = "checkpoint.json";
constexpr uint64_t kMaxHeader = 100ull << 20;

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// safetensors' dtype names that trident reads (everything is converted to float32 on load).
const DType* safetensors_dtype(const std::string& name) {
  static const std::map<std::string, DType> kNames = {
      {"F32", DType::kFloat32}, {"BF16", DType::kBFloat16}, {"F16", DType::kFloat16}, {"F64", DType::kFloat64}};
  auto it = kNames.find(name);
  return it == kNames.end() ? nullptr : &it->second;
}

std::string ckpt_name(int64_t step) { return fmt::format("ckpt-{:08d}", step); }

// Step of a "ckpt-NNNNNNNN" folder name, or -1.
int64_t parse_ckpt_name(const std::string& name) {
  if (name.size() != 13 || name.rfind("ckpt-", 0) != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// Index of the first element of v[0, n) that is not finite, or -1.
int64_t first_nonfinite(const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) return static_cast<int64_t>(i);
  return -1;
}

// A checkpoint never holds a NaN or an infinity: a diverged run's state is refused before it is written.
void check_finite_state(const nn::Model& model, const float* values, const OptimizerState& opt, int64_t step) {
  for (const auto& p : model.parameters()) {
    struct Part {
      const char* what;
      const float* data;
    } parts[] = {{"value", values + p.offset},
                 {"AdamW exp_avg", opt.exp_avg ? opt.exp_avg->data() + p.offset : nullptr},
                 {"AdamW exp_avg_sq", opt.exp_avg_sq ? opt.exp_avg_sq->data() + p.offset : nullptr}};
    for (const auto& part : parts) {
      if (part.data == nullptr) continue;
      const int64_t bad = first_nonfinite(part.data, p.numel);
      if (bad >= 0)
        TRIDENT_THROW(InvalidArgument,
                      "refusing to save the checkpoint of step {}: the {} of parameter '{}' is not finite ({} at "
                      "element {}); the run diverged (lower learning_rate or set grad_clip)",
                      step, part.what, p.name, part.data[bad], bad);
    }
  }
}
}  // namespace

namespace {
// The JSON header of a safetensors file of `tensors` (F32, contiguous in order), padded to a multiple of 8.
std::string safetensors_header(const std::vector<TensorRef>& tensors, const std::map<std::string, std::string>& metadata,
                               uint64_t* data_bytes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t bytes = static_cast<uint64_t>(numel(t.shape)) * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  *data_bytes = offset;
  return h;
}

uint64_t safetensors_bytes(const std::vector<TensorRef>& tensors, const std::map<std::string, std::string>& metadata) {
  uint64_t data = 0;
  return 8 + safetensors_header(tensors, metadata, &data).size() + data;
}
}  // namespace

uint64_t write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                           const std::map<std::string, std::string>& metadata, const std::string& previous_note) {
  uint64_t data = 0;
  const std::string h = safetensors_header(tensors, metadata, &data);
  uint64_t n = h.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  return io::atomic_write_file(
      path,
      [&](io::FileWriter& w) {
        w.write(len, 8);
        w.write(h);
        std::vector<float> scratch;  // one tensor at a time, for those written from a fill
        for (const auto& t : tensors) {
          const auto n = static_cast<size_t>(numel(t.shape));
          if (t.data != nullptr || n == 0) {
            w.write(t.data, n * 4);
            continue;
          }
          scratch.resize(n);
          t.fill(scratch.data());
          w.write(scratch.data(), n * 4);
        }
      },
      previous_note, 8 + n + data);
}

std::map<std::string, Tensor32> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  io::MappedFile f(path);
  auto corrupt = [&](const std::string& why) {
    TRIDENT_THROW(IoError, "safetensors file '{}' is corrupt or truncated: {}", path, why);
  };
  if (f.size() < 8) corrupt(fmt::format("{} bytes, shorter than the 8-byte header length", f.size()));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(f.data()[i]) << (8 * i);
  if (n > kMaxHeader || n > f.size() - 8) {
    corrupt(fmt::format("header length {} exceeds the file size {}", n, f.size()));
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(std::string_view(reinterpret_cast<const char*>(f.data()) + 8, n));
  } catch (const nlohmann::json::exception& e) {
    corrupt(fmt::format("the JSON header does not parse ({})", e.what()));
  }
  if (!header.is_object()) corrupt("the JSON header is not an object");
  const uint8_t* buf = f.data() + 8 + n;
  uint64_t buf_size = f.size() - 8 - n;
  std::map<std::string, Tensor32> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (metadata != nullptr) {
        try {
          *metadata = info.get<std::map<std::string, std::string>>();
        } catch (const nlohmann::json::exception&) {
          corrupt("__metadata__ is not a map of strings");
        }
      }
      continue;
    }
    std::vector<int64_t> shape;
    uint64_t b = 0, e = 0;
    DType dtype = DType::kFloat32;
    try {
      const std::string dt = info.at("dtype").get<std::string>();
      const DType* known = safetensors_dtype(dt);
      if (known == nullptr) {
        TRIDENT_THROW(IoError,
                      "safetensors file '{}': tensor '{}' has dtype {}; trident reads F32, BF16, F16 and F64 "
                      "(converted to float32)",
                      path, name, dt);
      }
      dtype = *known;
      if (!json_int::to_ints(info.at("shape"), &shape))
        corrupt(fmt::format("tensor '{}' has shape {}, not a list of integers", name, info.at("shape").dump()));
      std::vector<uint64_t> off;
      if (!json_int::to_ints(info.at("data_offsets"), &off))
        corrupt(fmt::format("tensor '{}' has data_offsets {}, not a list of byte offsets", name,
                            info.at("data_offsets").dump()));
      if (off.size() != 2) corrupt(fmt::format("tensor '{}' has {} data_offsets, expected 2", name, off.size()));
      b = off[0];
      e = off[1];
    } catch (const nlohmann::json::exception& ex) {
      corrupt(fmt::format("tensor '{}' has a malformed entry ({})", name, ex.what()));
    }
    // Elements counted against the data section's size, so a huge shape is named before its product overflows.
    uint64_t elems = 1;
    for (auto d : shape) {
      if (d < 0) corrupt(fmt::format("tensor '{}' has a negative dimension", name));
      const auto ud = static_cast<uint64_t>(d);
      if (ud != 0 && elems > buf_size / ud)
        corrupt(fmt::format("tensor '{}' has shape {}, more elements than the file's {} data bytes", name,
                            shape_string(shape), buf_size));
      elems *= ud;
    }
    if (e < b || e > buf_size) {
      corrupt(fmt::format("tensor '{}' spans bytes [{}, {}) but the data section has {} bytes", name, b, e, buf_size));
    }
    if (e - b != static_cast<uint64_t>(numel(shape)) * dtype_size(dtype)) {
      corrupt(fmt::format("tensor '{}' has {} bytes for shape {} of {}", name, e - b, shape_string(shape),
                          dtype_name(dtype)));
    }
    Tensor32 t;
    t.shape = shape;
    t.data.resize(static_cast<size_t>(numel(shape)));
    if (!t.data.empty()) {
      // The file's bytes (any alignment: copied out first) converted into the float32 tensor.
      Tensor stored = Tensor::zeros(shape, dtype);
      std::memcpy(stored.raw(), buf + b, e - b);
      Tensor::view(t.data.data(), shape, DType::kFloat32).copy_from(stored);
    }
    out.emplace(name, std::move(t));
    ranges.emplace_back(b, e);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t pos = 0;
  for (auto [b, e] : ranges) {
    if (b != pos) corrupt(fmt::format("tensor data overlaps or leaves a hole at byte {}", std::min(b, pos)));
    pos = e;
  }
  if (pos != buf_size) corrupt(fmt::format("the tensors cover {} bytes but the data section has {}", pos, buf_size));
  return out;
}

CheckpointSnapshot snapshot_checkpoint(nn::Model& model, const CheckpointMeta& meta, const OptimizerState& opt) {
  CheckpointSnapshot snap;
  snap.meta = meta;
  snap.parameters = model.parameters();
  snap.model_kind = model.kind();
  snap.values.resize(model.num_params());
  if (model.device() != kernels::Device::kCpu) {
    kernels::device_ops(model.device())
        .to_host(snap.values.data(), model.param_data(), snap.values.size() * sizeof(float));
  } else {
    std::copy_n(model.param_data(), snap.values.size(), snap.values.data());
  }
  if (opt.exp_avg != nullptr) {
    if (opt.exp_avg->size() != model.num_params() || opt.exp_avg_sq == nullptr ||
        opt.exp_avg_sq->size() != model.num_params()) {
      TRIDENT_THROW(InvalidArgument, "optimizer state has {} elements, the model {}", opt.exp_avg->size(),
                    model.num_params());
    }
    snap.exp_avg = *opt.exp_avg;
    snap.exp_avg_sq = *opt.exp_avg_sq;
  }
  check_finite_state(model, snap.values.data(), opt, meta.step);
  return snap;
}

namespace {
// What a checkpoint write left behind when its process died mid-write, of a PID that no longer runs: folders
// ".ckpt-N.tmp.PID" and ".ckpt-N.old.PID" (never complete, never named by `latest`) and the `latest` pointer's
// own temporary "latest.tmp.PID" (a rank killed between writing it and renaming it over `latest`).
void remove_abandoned_writes(const fs::path& out_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".ckpt-", 0) != 0 && name.rfind("latest.tmp.", 0) != 0) continue;
    size_t at = name.rfind(".tmp.");
    if (at == std::string::npos) at = name.rfind(".old.");
    if (at == std::string::npos) continue;
    const std::string pid_text = name.substr(at + 5);
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}
}  // namespace

namespace {

// The tensors of a checkpoint's two files, in file order: the model's parameters (and, for the GPT, the tied
// head written as lm_head.weight), then exp_avg and exp_avg_sq of every parameter. From the snapshot's
// buffers, or, for a streamed snapshot, as fills that read each tensor (and check it is finite) when the
// writer reaches it.
struct CheckpointFiles {
  std::vector<TensorRef> model, optim;
  std::map<std::string, std::string> md, omd;
  bool with_optimizer = false;
};

CheckpointFiles checkpoint_files(const CheckpointSnapshot& snap) {
  CheckpointFiles cf;
  const bool streamed = static_cast<bool>(snap.read);
  cf.with_optimizer = streamed ? snap.read_moments : !snap.exp_avg.empty();
  const int64_t step = snap.meta.step;
  auto ref = [&](std::string name, const nn::Parameter& p, int which, const std::vector<float>& host) {
    TensorRef t{std::move(name), p.shape, streamed ? nullptr : host.data() + p.offset, {}};
    if (streamed) {
      t.fill = [&snap, offset = p.offset, n = p.numel, which, step, pname = p.name](float* dst) {
        snap.read(which, offset, n, dst);
        static const char* const kWhat[] = {"value", "AdamW exp_avg", "AdamW exp_avg_sq"};
        if (const int64_t bad = first_nonfinite(dst, n); bad >= 0)
          TRIDENT_THROW(InvalidArgument,
                        "refusing to save the checkpoint of step {}: the {} of parameter '{}' is not finite ({} at "
                        "element {}); the run diverged (lower learning_rate or set grad_clip)",
                        step, kWhat[which], pname, dst[bad], bad);
      };
    }
    return t;
  };
  const auto& params = snap.parameters;
  bool has_head = false;
  for (const auto& p : params) {
    cf.model.push_back(ref(p.name, p, 0, snap.values));
    has_head = has_head || p.name == "lm_head.weight";
  }
  cf.md = {{"format", "pt"}, {"producer", "trident"}, {"step", std::to_string(step)}};
  if (!has_head) {
    for (const auto& p : params) {
      if (p.name == "transformer.wte.weight" && snap.model_kind == "gpt") {
        cf.model.push_back(ref("lm_head.weight", p, 0, snap.values));
        cf.md["tied"] = "lm_head.weight=transformer.wte.weight";
      }
    }
  }
  cf.omd = {{"format", "pt"}, {"optimizer", "adamw"}};
  if (cf.with_optimizer) {
    for (const auto& p : params) cf.optim.push_back(ref("exp_avg." + p.name, p, 1, snap.exp_avg));
    for (const auto& p : params) cf.optim.push_back(ref("exp_avg_sq." + p.name, p, 2, snap.exp_avg_sq));
  }
  return cf;
}

// Runs the fills of the tensors from the first-th on (in file order), into a scratch buffer.
void run_fills(const CheckpointFiles& cf, size_t first) {
  std::vector<float> scratch;
  size_t i = 0;
  for (const auto* list : {&cf.model, &cf.optim}) {
    for (const auto& t : *list) {
      const auto n = static_cast<size_t>(numel(t.shape));
      if (!t.fill || n == 0) continue;
      if (i++ < first) continue;
      scratch.resize(n);
      t.fill(scratch.data());
    }
  }
}

std::string write_checkpoint_files(const std::string& out_dir, const CheckpointSnapshot& snap, CheckpointFiles cf,
                                   int keep) {
  const CheckpointMeta& meta = snap.meta;
  const bool with_optimizer = cf.with_optimizer;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) TRIDENT_THROW(IoError, "cannot create out_dir '{}': {}", out_dir, ec.message());
  remove_abandoned_writes(out_dir);
  std::string prev;
  try {
    prev = find_checkpoint(out_dir);
  } catch (const Error&) {
  }
  std::string note = prev.empty() ? std::string("no earlier checkpoint existed")
                                  : fmt::format("the previous checkpoint {} is intact", prev);
  std::string name = ckpt_name(meta.step);
  fs::path final_dir = fs::path(out_dir) / name;
  fs::path tmp_dir = fs::path(out_dir) / fmt::format(".{}.tmp.{}", name, ::getpid());

  // What goes into the files, and how many bytes each will have.
  const std::vector<TensorRef>& tensors = cf.model;
  const std::vector<TensorRef>& ot = cf.optim;
  const auto& md = cf.md;
  const auto& omd = cf.omd;
  nlohmann::json files = nlohmann::json::object();
  files[kModelFile] = {{"bytes", safetensors_bytes(tensors, md)}, {"fnv1a64", io::hex64(0)}};
  if (with_optimizer) files[kOptimFile] = {{"bytes", safetensors_bytes(ot, omd)}, {"fnv1a64", io::hex64(0)}};
  auto meta_json = [&] {
    nlohmann::json j{{"format", "trident-checkpoint"},
                     {"version", 1},
                     {"step", meta.step},
                     {"model", meta.model_config},
                     {"tokenizer", meta.tokenizer},
                     {"train_config", meta.train_config},
                     {"sampler", meta.sampler},
                     {"rng", meta.rng},
                     {"trainer", meta.trainer},
                     {"optimizer", {{"kind", "adamw"}, {"step", meta.optimizer_step}, {"present", with_optimizer}}},
                     {"files", files}};
    if (!meta.hf_config.is_null()) j["hf_config"] = meta.hf_config;
    return j.dump(2) + "\n";
  };
  // The checksums have a fixed width: the JSON's size is known before the files are written.
  const uint64_t json_bytes = meta_json().size();
  uint64_t needed = json_bytes;
  for (const auto& [f, info] : files.items()) needed += info.at("bytes").get<uint64_t>();
  // The whole checkpoint must fit beside the previous one (which stays until this one is complete).
  struct statvfs vfs{};
  if (::statvfs(out_dir.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes < needed) {
      std::string parts;
      for (const auto& [f, info] : files.items()) parts += fmt::format("{} {}, ", f, info.at("bytes").get<uint64_t>());
      TRIDENT_THROW(IoError,
                    "no space for checkpoint {} in '{}': it needs {} bytes ({}{} {}) but the file system has {} bytes "
                    "free; {}; free some space, lower keep_checkpoints, or choose another out_dir",
                    name, out_dir, needed, parts, kMetaFile, json_bytes, free_bytes, note);
    }
  }

  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) TRIDENT_THROW(IoError, "cannot create '{}': {}; {}", tmp_dir.string(), ec.message(), note);
  try {
    fs::path mpath = tmp_dir / kModelFile;
    uint64_t h = write_safetensors(mpath.string(), tensors, md, note);
    files[kModelFile] = {{"bytes", fs::file_size(mpath)}, {"fnv1a64", io::hex64(h)}};
    if (with_optimizer) {
      fs::path opath = tmp_dir / kOptimFile;
      uint64_t oh = write_safetensors(opath.string(), ot, omd, note);
      files[kOptimFile] = {{"bytes", fs::file_size(opath)}, {"fnv1a64", io::hex64(oh)}};
    }
    const std::string j = meta_json();
    io::atomic_write_file((tmp_dir / kMetaFile).string(), [&](io::FileWriter& w) { w.write(j); }, note, j.size());
    io::fsync_dir(tmp_dir.string());

    // Move into place. Re-saving an existing step replaces it (the old one is moved aside first).
    fs::path aside;
    if (fs::exists(final_dir)) {
      aside = fs::path(out_dir) / fmt::format(".{}.old.{}", name, ::getpid());
      fs::remove_all(aside, ec);
      fs::rename(final_dir, aside);
    }
    fs::rename(tmp_dir, final_dir);
    io::fsync_dir(out_dir);
    io::atomic_write_file((fs::path(out_dir) / "latest").string(), [&](io::FileWriter& w) { w.write(name + "\n"); },
                          note);
    if (!aside.empty()) fs::remove_all(aside, ec);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp_dir, ec);
    TRIDENT_THROW(IoError, "cannot save checkpoint {} in '{}': {}; {}", name, out_dir, e.what(), note);
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }

  // Retention: keep the one just written and the newest keep-1 others (by step); older ones, including
  // those of an earlier run in the same out_dir, are removed.
  std::vector<std::pair<int64_t, fs::path>> others;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    int64_t s = parse_ckpt_name(e.path().filename().string());
    if (s >= 0 && e.is_directory() && e.path().filename() != final_dir.filename()) others.emplace_back(s, e.path());
  }
  std::sort(others.begin(), others.end());
  int excess = static_cast<int>(others.size()) - (std::max(keep, 1) - 1);
  for (int i = 0; i < excess; ++i) fs::remove_all(others[static_cast<size_t>(i)].second, ec);
  return final_dir.string();
}

}  // namespace

std::string write_checkpoint(const std::string& out_dir, const CheckpointSnapshot& snap, int keep) {
  CheckpointFiles cf = checkpoint_files(snap);
  if (!snap.read) return write_checkpoint_files(out_dir, snap, std::move(cf), keep);
  // Streamed: the other ranks run the same reads (drain_checkpoint). Count the fills that ran; when the write
  // fails between them (a full disk, a folder that cannot be made), run the rest before throwing. A fill
  // that fails (a collective, a non-finite value) fails on every rank alike: nothing is left to run then.
  size_t done = 0;
  bool fill_failed = false;
  CheckpointFiles counted = cf;
  for (auto* list : {&counted.model, &counted.optim}) {
    for (auto& t : *list) {
      if (!t.fill || numel(t.shape) == 0) continue;
      t.fill = [f = t.fill, &done, &fill_failed](float* dst) {
        try {
          f(dst);
        } catch (...) {
          fill_failed = true;
          throw;
        }
        ++done;
      };
    }
  }
  try {
    return write_checkpoint_files(out_dir, snap, std::move(counted), keep);
  } catch (...) {
    if (!fill_failed) {
      try {
        run_fills(cf, done);
      } catch (const std::exception& e) {
        log_error("checkpoint: after the write failed, reading the rest for the other ranks failed too: {}",
                  e.what());
      }
    }
    throw;
  }
}

void drain_checkpoint(const CheckpointSnapshot& snap) {
  if (snap.read) run_fills(checkpoint_files(snap), 0);
}

std::string save_checkpoint(const std::string& out_dir, nn::Model& model, const CheckpointMeta& meta,
                            const OptimizerState& opt, int keep) {
  return write_checkpoint(out_dir, snapshot_checkpoint(model, meta, opt), keep);
}

std::string checkpoint_dir(const std::string& out_dir, int64_t step) {
  return (fs::path(out_dir) / ckpt_name(step)).string();
}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    log_error("checkpoint write failed: {}", e.what());
  }
}

std::string AsyncCheckpointWriter::submit(std::string out_dir, CheckpointSnapshot snap, int keep) {
  wait();
  std::string dir = checkpoint_dir(out_dir, snap.meta.step);
  thread_ = std::thread([this, out_dir = std::move(out_dir), snap = std::move(snap), keep] {
    try {
      write_checkpoint(out_dir, snap, keep);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
  return dir;
}

void AsyncCheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::string find_checkpoint(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (fs::is_regular_file(p, ec) && p.filename() == kMetaFile) return p.parent_path().string();
  // The out_dir's `latest` file stands for its out_dir: both mean the newest complete checkpoint.
  if (fs::is_regular_file(p, ec) && p.filename() == "latest") p = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (!fs::is_directory(p, ec)) {
    TRIDENT_THROW(InvalidArgument,
                  "checkpoint '{}' does not exist; give a run's out_dir (its newest checkpoint), its `latest` file, a "
                  "ckpt-NNNNNNNN folder or its checkpoint.json",
                  path);
  }
  if (fs::exists(p / kMetaFile)) return p.string();
  fs::path latest = p / "latest";
  if (fs::exists(latest)) {
    std::string name = io::read_file(latest.string());
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (parse_ckpt_name(name) < 0 || !fs::exists(p / name / kMetaFile)) {
      TRIDENT_THROW(IoError, "'{}' names '{}', which is not a complete checkpoint in '{}'", latest.string(), name,
                    path);
    }
    return (p / name).string();
  }
  int64_t best = -1;
  for (const auto& e : fs::directory_iterator(p, ec)) {
    int64_t s = parse_ckpt_name(e.path().filename().string());
    if (s > best && fs::exists(e.path() / kMetaFile)) best = s;
  }
  return best < 0 ? std::string() : (p / ckpt_name(best)).string();
}

LoadedCheckpoint load_checkpoint(const std::string& dir, bool with_optimizer) {
  LoadedCheckpoint out;
  out.dir = dir;
  std::string meta_path = (fs::path(dir) / kMetaFile).string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_file(meta_path));
  } catch (const nlohmann::json::exception& e) {
    TRIDENT_THROW(IoError, "checkpoint file '{}' is corrupt: not valid JSON ({})", meta_path, e.what());
  }
  try {
    if (j.at("format") != "trident-checkpoint") {
      TRIDENT_THROW(IoError, "'{}' is not a trident checkpoint (format {})", meta_path, j.at("format").dump());
    }
    // Integers are checked before conversion (core/json_int.h): a float or out-of-range value is corruption.
    auto integer = [&](const nlohmann::json& v, const char* field, auto* out_value) {
      if (!json_int::to_int(v, out_value))
        TRIDENT_THROW(IoError, "checkpoint file '{}' is corrupt: \"{}\" is {}, not an integer in range", meta_path,
                      field, v.dump());
    };
    int version = 0;
    integer(j.at("version"), "version", &version);
    if (version != 1) {
      TRIDENT_THROW(IoError, "'{}' has checkpoint version {}; this trident reads version 1", meta_path, version);
    }
    auto& m = out.meta;
    integer(j.at("step"), "step", &m.step);
    m.model_config = j.at("model");
    m.tokenizer = j.at("tokenizer");
    m.train_config = j.value("train_config", nlohmann::json());
    m.sampler = j.value("sampler", nlohmann::json());
    m.rng = j.value("rng", nlohmann::json());
    m.trainer = j.value("trainer", nlohmann::json());
    m.hf_config = j.value("hf_config", nlohmann::json());
    integer(j.at("optimizer").at("step"), "optimizer.step", &m.optimizer_step);
    m.has_optimizer = j.at("optimizer").value("present", false);
    for (const auto& [fname, info] : j.at("files").items()) {
      if (fname != kModelFile && fname != kOptimFile) continue;
      if (fname == kOptimFile && !with_optimizer) continue;
      std::string fp = (fs::path(dir) / fname).string();
      std::error_code ec;
      if (!fs::exists(fp, ec)) TRIDENT_THROW(IoError, "checkpoint file '{}' is missing", fp);
      uint64_t want = 0;
      integer(info.at("bytes"), "bytes", &want);
      uint64_t have = fs::file_size(fp, ec);
      if (have != want) {
        TRIDENT_THROW(IoError, "checkpoint file '{}' has {} bytes but {} records {} (truncated or replaced)", fp, have,
                      meta_path, want);
      }
      std::string sum = io::hex64(io::file_fnv1a64(fp));
      if (sum != info.at("fnv1a64").get<std::string>()) {
        TRIDENT_THROW(IoError, "checkpoint file '{}' is corrupt: checksum {} does not match {} recorded in {}", fp, sum,
                      info.at("fnv1a64").get<std::string>(), meta_path);
      }
      if (fname == kModelFile) out.weights = read_safetensors(fp);
      else out.optimizer = read_safetensors(fp);
    }
  } catch (const nlohmann::json::exception& e) {
    TRIDENT_THROW(IoError, "checkpoint file '{}' is corrupt: {}", meta_path, e.what());
  }
  if (out.weights.empty()) TRIDENT_THROW(IoError, "checkpoint '{}' lists no {}", meta_path, kModelFile);
  for (const auto* tensors : {&out.weights, &out.optimizer})
    for (const auto& [name, t] : *tensors)
      if (const int64_t bad = first_nonfinite(t.data.data(), t.data.size()); bad >= 0)
        TRIDENT_THROW(IoError,
                      "checkpoint '{}' holds a non-finite value in '{}' ({} at element {}): it is the state of a "
                      "diverged run, not a usable model",
                      dir, name, t.data[static_cast<size_t>(bad)], bad);
  if (with_optimizer && out.meta.has_optimizer && out.optimizer.empty()) {
    TRIDENT_THROW(IoError, "checkpoint '{}' lists no {}", meta_path, kOptimFile);
  }
  return out;
}

void load_weights(nn::Model& model, const std::map<std::string, Tensor32>& weights, const std::string& origin) {
  const auto& params = model.parameters();
  const bool on_host = model.device() == kernels::Device::kCpu;
  std::vector<float> staging;  // written here, then uploaded, for a model on another device
  if (!on_host) {
    staging.resize(model.num_params());
    kernels::device_ops(model.device()).to_host(staging.data(), model.param_data(), staging.size() * sizeof(float));
  }
  float* values = on_host ? model.param_data() : staging.data();
  size_t used = 0;
  for (const auto& p : params) {
    auto it = weights.find(p.name);
    if (it == weights.end()) {
      TRIDENT_THROW(InvalidArgument, "{}: tensor '{}' is missing (the checkpoint is for another model)", origin, p.name);
    }
    if (it->second.shape != p.shape) {
      TRIDENT_THROW(InvalidArgument, "{}: tensor '{}' has shape {} but the model expects {}", origin, p.name,
                    nlohmann::json(it->second.shape).dump(), nlohmann::json(p.shape).dump());
    }
    std::memcpy(values + p.offset, it->second.data.data(), p.numel * sizeof(float));
    ++used;
  }
  for (const auto& [name, t] : weights) {
    bool known = false;
    for (const auto& p : params) known = known || p.name == name;
    if (!known && name != "lm_head.weight") {
      TRIDENT_THROW(InvalidArgument, "{}: tensor '{}' is not a parameter of this model", origin, name);
    }
  }
  if (!on_host)
    kernels::device_ops(model.device()).to_device(model.param_data(), staging.data(), staging.size() * sizeof(float));
}

void load_optimizer_moments(const nn::Model& model, const std::map<std::string, Tensor32>& tensors,
                            std::vector<float>& exp_avg, std::vector<float>& exp_avg_sq, const std::string& origin) {
  exp_avg.assign(model.num_params(), 0.0f);
  exp_avg_sq.assign(model.num_params(), 0.0f);
  for (const auto& p : model.parameters()) {
    for (int which = 0; which < 2; ++which) {
      std::string key = (which == 0 ? "exp_avg." : "exp_avg_sq.") + p.name;
      auto it = tensors.find(key);
      if (it == tensors.end()) TRIDENT_THROW(InvalidArgument, "{}: optimizer tensor '{}' is missing", origin, key);
      if (it->second.shape != p.shape) {
        TRIDENT_THROW(InvalidArgument, "{}: optimizer tensor '{}' has the wrong shape", origin, key);
      }
      std::memcpy((which == 0 ? exp_avg : exp_avg_sq).data() + p.offset, it->second.data.data(),
                  p.numel * sizeof(float));
    }
  }
}

}  // namespace trident::train
