// safetensors format, checkpoint save/load, corruption detection, and atomicity under injected failures.
#include <gtest/gtest.h>

#include "harness/temp_dir.h"
#include "harness/skip.h"
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>

#include "trident/core/error.h"
#include "trident/data/file_io.h"
#include "trident/nn/models.h"
#include "trident/train/checkpoint.h"

using namespace trident;
using namespace trident::train;
namespace fs = std::filesystem;

namespace {

using TempDir = trident::testing::TempDir;

std::unique_ptr<nn::Model> tiny_gpt(uint64_t seed = 1) {
  return nn::make_model({{"kind", "gpt"}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 8}, {"block_size", 8},
                         {"vocab_size", 11}, {"bias", true}, {"seed", seed}});
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void flip_byte(const std::string& path, std::streamoff from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-from_end, std::ios::end);
  f.put(static_cast<char>(c ^ 0x5a));
}

CheckpointMeta meta_for(nn::Model& m, int64_t step) {
  CheckpointMeta meta;
  meta.step = step;
  meta.model_config = m.config();
  meta.tokenizer = {{"kind", "byte"}, {"vocab_size", 256}};
  meta.sampler = {{"kind", "random"}, {"next_step", step}};
  meta.optimizer_step = step;
  meta.has_optimizer = true;
  return meta;
}
}  // namespace

TEST(Safetensors, WritesTheDocumentedLayoutAndReadsBack) {
  TempDir d;
  std::string p = (d.path / "t.safetensors").string();
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 1e-20f, -7.0f};
  std::vector<float> b = {42.0f};
  write_safetensors(p, {{"a.weight", {2, 3}, a.data()}, {"b", {1}, b.data()}}, {{"format", "pt"}});
  // Independent parse of the format: u64 little-endian header size, JSON header, raw F32 data.
  std::string raw = io::read_file(p);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(raw[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  auto h = nlohmann::json::parse(raw.substr(8, n));
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_EQ(h["a.weight"]["dtype"], "F32");
  EXPECT_EQ(h["a.weight"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(h["a.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(h["b"]["data_offsets"], nlohmann::json({24, 28}));
  EXPECT_EQ(raw.size(), 8 + n + 28);
  float f;
  std::memcpy(&f, raw.data() + 8 + n + 8, 4);
  EXPECT_EQ(f, 3.25f);

  std::map<std::string, std::string> md;
  auto t = read_safetensors(p, &md);
  EXPECT_EQ(md.at("format"), "pt");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t["a.weight"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t["a.weight"].data, a);
  EXPECT_EQ(t["b"].data, b);
}

TEST(Safetensors, PythonReaderAgrees) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) TRIDENT_SKIP_MISSING("/usr/bin/python3 has no numpy (apt-get install python3-numpy)");
  TempDir d;
  std::string p = (d.path / "m.safetensors").string();
  std::vector<float> a = {0.5f, 1.0f, -3.0f, 8.0f};
  write_safetensors(p, {{"x", {2, 2}, a.data()}}, {});
  // The reference reader of the safetensors format, in numpy (what safetensors.numpy.load_file does).
  std::string script = (d.path / "r.py").string();
  std::ofstream(script) << "import json, struct, sys, numpy as np\n"
                           "b = open(sys.argv[1], 'rb').read()\n"
                           "n = struct.unpack('<Q', b[:8])[0]\n"
                           "h = json.loads(b[8:8+n])\n"
                           "s, e = h['x']['data_offsets']\n"
                           "x = np.frombuffer(b[8+n+s:8+n+e], dtype='<f4').reshape(h['x']['shape'])\n"
                           "print(x.sum(), x[1,0], h['x']['dtype'])\n";
  std::string out_file = (d.path / "out.txt").string();
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " " + p + " > " + out_file).c_str()), 0);
  EXPECT_EQ(io::read_file(out_file), "6.5 -3.0 F32\n");
}

// A safetensors file written here byte by byte (independent of write_safetensors), with 16- and 64-bit
// float tensors as PyTorch's bfloat16/half/double checkpoints have them.
std::string hand_written_safetensors(const fs::path& dir, const std::string& header_json, const std::string& data) {
  std::string h = header_json;
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  std::string p = (dir / "h.safetensors").string();
  std::ofstream(p, std::ios::binary) << bytes << h << data;
  return p;
}

template <typename T>
std::string raw_bytes(std::initializer_list<T> v) {
  std::string s;
  for (T x : v) s.append(reinterpret_cast<const char*>(&x), sizeof(T));
  return s;
}

TEST(Safetensors, ReadsBFloat16Float16AndFloat64AsFloat32) {
  TempDir d;
  // bfloat16 bit patterns: 0x3f00 = 0.5, 0xc040 = -3, 0x3fc0 = 1.5, 0x4100 = 8; float16: 0x3400 = 0.25,
  // 0xc000 = -2, 0x3c00 = 1.
  std::string data = raw_bytes<uint16_t>({0x3f00, 0xc040, 0x3fc0, 0x4100}) +
                     raw_bytes<uint16_t>({0x3400, 0xc000, 0x3c00}) + raw_bytes<double>({1.0 / 3.0, -1e-3});
  std::string p = hand_written_safetensors(
      d.path,
      R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("h":{"dtype":"F16","shape":[3],"data_offsets":[8,14]},)"
      R"("g":{"dtype":"F64","shape":[2],"data_offsets":[14,30]}})",
      data);
  auto t = read_safetensors(p);
  EXPECT_EQ(t["w"].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(t["w"].data, (std::vector<float>{0.5f, -3.0f, 1.5f, 8.0f}));
  EXPECT_EQ(t["h"].data, (std::vector<float>{0.25f, -2.0f, 1.0f}));
  EXPECT_EQ(t["g"].data, (std::vector<float>{static_cast<float>(1.0 / 3.0), -1e-3f}));
}

TEST(Safetensors, UnsupportedDtypeAndWrongByteCountAreNamed) {
  TempDir d;
  std::string p = hand_written_safetensors(d.path, R"({"q":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})",
                                           std::string(4, '\1'));
  std::string e = error_of([&] { read_safetensors(p); });
  EXPECT_CONTAINS(e, "tensor 'q' has dtype I8");
  EXPECT_CONTAINS(e, "F32, BF16, F16 and F64");
  // 4 bfloat16 elements need 8 bytes, not 16.
  p = hand_written_safetensors(d.path, R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})",
                               std::string(16, '\0'));
  e = error_of([&] { read_safetensors(p); });
  EXPECT_CONTAINS(e, "tensor 'w' has 16 bytes for shape [4] of bfloat16");
}

TEST(Safetensors, RejectsTruncatedAndCorruptFiles) {
  TempDir d;
  std::string p = (d.path / "t.safetensors").string();
  std::vector<float> a(64, 1.0f);
  write_safetensors(p, {{"a", {8, 8}, a.data()}}, {});
  auto size = fs::file_size(p);
  std::string good = io::read_file(p);

  fs::resize_file(p, size - 4);
  std::string e = error_of([&] { read_safetensors(p); });
  EXPECT_CONTAINS(e, p);
  EXPECT_CONTAINS(e, "truncated");
  EXPECT_CONTAINS(e, "data section has 252");

  fs::resize_file(p, 5);
  EXPECT_CONTAINS(error_of([&] { read_safetensors(p); }), "shorter than the 8-byte header length");

  std::string bad = good;
  bad[0] = '\xff';
  bad[1] = '\xff';
  std::ofstream(p, std::ios::binary) << bad;
  EXPECT_CONTAINS(error_of([&] { read_safetensors(p); }), "exceeds the file size");

  bad = good;
  bad[9] = '#';  // JSON header
  std::ofstream(p, std::ios::binary) << bad;
  EXPECT_CONTAINS(error_of([&] { read_safetensors(p); }), "does not parse");

  bad = good;
  size_t pos = bad.find("F32");
  bad.replace(pos, 3, "I16");
  std::ofstream(p, std::ios::binary) << bad;
  EXPECT_CONTAINS(error_of([&] { read_safetensors(p); }), "dtype I16");
  bad = good;
  bad.replace(pos, 3, "F16");  // a readable dtype, but the byte count is that of float32
  std::ofstream(p, std::ios::binary) << bad;
  EXPECT_CONTAINS(error_of([&] { read_safetensors(p); }), "256 bytes for shape [8, 8] of float16");

  // Shapes and offsets that are not integers, or whose element count overflows, are named.
  std::string hp = hand_written_safetensors(d.path, R"({"w":{"dtype":"F32","shape":[1e300],"data_offsets":[0,4]}})",
                                            std::string(4, '\0'));
  EXPECT_CONTAINS(error_of([&] { read_safetensors(hp); }), "has shape [1e+300], not a list of integers");
  hp = hand_written_safetensors(d.path, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4.5]}})",
                                std::string(4, '\0'));
  EXPECT_CONTAINS(error_of([&] { read_safetensors(hp); }), "not a list of byte offsets");
  hp = hand_written_safetensors(
      d.path, R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})", "");
  EXPECT_CONTAINS(error_of([&] { read_safetensors(hp); }), "more elements than the file's 0 data bytes");

  std::ofstream(p, std::ios::binary) << good << "xxxx";  // trailing bytes: a hole in the data section
  EXPECT_CONTAINS(error_of([&] { read_safetensors(p); }), "cover 256 bytes but the data section has 260");
  EXPECT_THROW(read_safetensors((d.path / "missing").string()), IoError);
}

TEST(Checkpoint, SaveLoadRoundTripWithTiedHeadAndOptimizer) {
  TempDir d;
  auto m = tiny_gpt(3);
  std::vector<float> ea(m->num_params()), es(m->num_params());
  for (size_t i = 0; i < ea.size(); ++i) ea[i] = 0.001f * i, es[i] = 0.5f + i;
  std::string out = d.path.string();
  std::string dir = save_checkpoint(out, *m, meta_for(*m, 7), {&ea, &es});
  EXPECT_EQ(fs::path(dir).filename(), "ckpt-00000007");
  EXPECT_EQ(find_checkpoint(out), dir);
  EXPECT_EQ(find_checkpoint(dir + "/checkpoint.json"), dir);
  EXPECT_EQ(find_checkpoint(out + "/latest"), dir);  // the out_dir's `latest` file stands for the out_dir

  auto ck = load_checkpoint(dir);
  EXPECT_EQ(ck.meta.step, 7);
  EXPECT_EQ(ck.meta.optimizer_step, 7);
  EXPECT_TRUE(ck.weights.count("lm_head.weight"));  // strict-loadable by nanoGPT's GPT
  EXPECT_EQ(ck.weights["lm_head.weight"].data, ck.weights["transformer.wte.weight"].data);
  EXPECT_EQ(ck.weights["transformer.h.0.attn.c_attn.weight"].shape, (std::vector<int64_t>{24, 8}));

  auto m2 = tiny_gpt(99);  // different init
  load_weights(*m2, ck.weights, dir);
  for (const auto& p : m->parameters()) {
    for (size_t i = 0; i < p.numel; ++i) ASSERT_EQ(m2->param_data()[p.offset + i], m->param_data()[p.offset + i]);
  }
  std::vector<float> ea2, es2;
  load_optimizer_moments(*m2, ck.optimizer, ea2, es2, dir);
  for (const auto& p : m->parameters()) {
    for (size_t i = 0; i < p.numel; ++i) {
      ASSERT_EQ(ea2[p.offset + i], ea[p.offset + i]);
      ASSERT_EQ(es2[p.offset + i], es[p.offset + i]);
    }
  }
  // A model of another shape is refused, naming the tensor.
  auto other = nn::make_model({{"kind", "gpt"}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"block_size", 8},
                               {"vocab_size", 11}, {"bias", true}});
  EXPECT_CONTAINS(error_of([&] { load_weights(*other, ck.weights, dir); }), "transformer.wte.weight' has shape");
  auto nobias = nn::make_model({{"kind", "gpt"}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 8}, {"block_size", 8},
                                {"vocab_size", 11}, {"bias", false}});
  EXPECT_CONTAINS(error_of([&] { load_weights(*nobias, ck.weights, dir); }), "is not a parameter of this model");
}

TEST(Checkpoint, CorruptTruncatedOrMissingFilesAreNamed) {
  TempDir d;
  auto m = tiny_gpt();
  std::vector<float> ea(m->num_params()), es(m->num_params());
  std::string dir = save_checkpoint(d.path.string(), *m, meta_for(*m, 1), {&ea, &es});
  std::string model = dir + "/model.safetensors", opt = dir + "/optimizer.safetensors";
  std::string good = io::read_file(model);

  flip_byte(model, 5);
  std::string e = error_of([&] { load_checkpoint(dir); });
  EXPECT_CONTAINS(e, model);
  EXPECT_CONTAINS(e, "checksum");
  std::ofstream(model, std::ios::binary) << good;
  EXPECT_NO_THROW(load_checkpoint(dir));

  fs::resize_file(opt, fs::file_size(opt) - 1);
  e = error_of([&] { load_checkpoint(dir); });
  EXPECT_CONTAINS(e, opt);
  EXPECT_CONTAINS(e, "truncated");
  EXPECT_NO_THROW(load_checkpoint(dir, /*with_optimizer=*/false));

  fs::remove(model);
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir); }), "is missing");

  std::ofstream(dir + "/checkpoint.json") << "{\"format\": \"trident-checkpoint\",";
  e = error_of([&] { load_checkpoint(dir); });
  EXPECT_CONTAINS(e, "checkpoint.json");
  EXPECT_CONTAINS(e, "not valid JSON");
  std::ofstream(dir + "/checkpoint.json") << R"({"format": "trident-checkpoint", "version": 9})";
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir); }), "version 9");
  // Numbers no integer field can hold are corruption, named, never converted (the fuzzer's find: a version of
  // 100 digits, which JSON reads as a float, used to reach a float-to-int cast, undefined behaviour).
  for (const char* version : {"188888888888888888888888888888888888888888888", "1e300", "1.5", "-99999999999"}) {
    std::ofstream(dir + "/checkpoint.json") << R"({"format": "trident-checkpoint", "version": )" << version << "}";
    e = error_of([&] { load_checkpoint(dir); });
    EXPECT_CONTAINS(e, "\"version\" is");
    EXPECT_CONTAINS(e, "not an integer in range");
  }
  std::ofstream(dir + "/checkpoint.json") << R"({"format": "trident-checkpoint", "version": 1, "step": 1e30})";
  EXPECT_CONTAINS(error_of([&] { load_checkpoint(dir); }), "\"step\" is 1e+30");
  EXPECT_CONTAINS(error_of([&] { find_checkpoint((d.path / "nope").string()); }), "does not exist");
  std::ofstream(d.path / "latest") << "ckpt-00000042\n";
  EXPECT_CONTAINS(error_of([&] { find_checkpoint(d.path.string()); }), "not a complete checkpoint");
}

TEST(Checkpoint, AFailedSaveLeavesThePreviousCheckpointIntact) {
  TempDir d;
  auto m = tiny_gpt(5);
  std::vector<float> ea(m->num_params(), 0.25f), es(m->num_params(), 0.5f);
  std::string out = d.path.string();
  std::string first = save_checkpoint(out, *m, meta_for(*m, 5), {&ea, &es});
  std::vector<float> saved(m->param_data(), m->param_data() + m->num_params());
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(first)) total += fs::file_size(e.path());

  // Change the weights, then fail the next save at many points (inside each file, and at the `latest` update).
  for (float& v : std::span(m->param_data(), m->num_params())) v += 1.0f;
  int failures = 0;
  for (uint64_t at : {uint64_t{0}, uint64_t{7}, uint64_t{100}, total / 2, total - 300, total - 20, total + 2}) {
    io::testing::set_write_fault(static_cast<int64_t>(at), ENOSPC);
    std::string e = error_of([&] { save_checkpoint(out, *m, meta_for(*m, 10), {&ea, &es}); });
    io::testing::set_write_fault(-1, 0);
    if (e.empty()) continue;  // the fault point fell beyond the last write
    ++failures;
    EXPECT_CONTAINS(e, "no space left on device");
    EXPECT_CONTAINS(e, "the previous checkpoint " + first + " is intact");
    std::string found = find_checkpoint(out);
    auto ck = load_checkpoint(found);
    if (found == first) {
      auto m2 = tiny_gpt(9);
      load_weights(*m2, ck.weights, found);
      for (size_t i = 0; i < saved.size(); ++i) ASSERT_EQ(m2->param_data()[i], saved[i]) << "fault at " << at;
    }
    for (const auto& ent : fs::directory_iterator(out)) {
      EXPECT_EQ(ent.path().filename().string().find(".tmp."), std::string::npos) << ent.path();
    }
  }
  EXPECT_GE(failures, 6);
  // A failed rename (e.g. EIO) is reported too and the old checkpoint survives.
  io::testing::set_rename_fault(EIO);
  EXPECT_CONTAINS(error_of([&] { save_checkpoint(out, *m, meta_for(*m, 11), {&ea, &es}); }), "is intact");
  EXPECT_NO_THROW(load_checkpoint(find_checkpoint(out)));
}

TEST(Checkpoint, RetentionKeepsTheNewest) {
  TempDir d;
  auto m = tiny_gpt();
  std::vector<float> ea(m->num_params()), es(m->num_params());
  for (int s : {1, 2, 3, 4}) save_checkpoint(d.path.string(), *m, meta_for(*m, s), {&ea, &es}, 2);
  EXPECT_FALSE(fs::exists(d.path / "ckpt-00000001"));
  EXPECT_FALSE(fs::exists(d.path / "ckpt-00000002"));
  EXPECT_TRUE(fs::exists(d.path / "ckpt-00000003"));
  EXPECT_TRUE(fs::exists(d.path / "ckpt-00000004"));
  // Re-saving the same step replaces it.
  save_checkpoint(d.path.string(), *m, meta_for(*m, 4), {&ea, &es}, 2);
  EXPECT_EQ(load_checkpoint(find_checkpoint(d.path.string())).meta.step, 4);
  EXPECT_TRUE(fs::exists(d.path / "ckpt-00000003"));
  // A new run in the same out_dir (step 2 < 4) keeps its own checkpoint and the newest other one.
  save_checkpoint(d.path.string(), *m, meta_for(*m, 2), {&ea, &es}, 2);
  EXPECT_EQ(load_checkpoint(find_checkpoint(d.path.string())).meta.step, 2);
  EXPECT_FALSE(fs::exists(d.path / "ckpt-00000003"));
  EXPECT_TRUE(fs::exists(d.path / "ckpt-00000004"));
  save_checkpoint(d.path.string(), *m, meta_for(*m, 1), {&ea, &es}, 1);
  EXPECT_FALSE(fs::exists(d.path / "ckpt-00000004"));
  EXPECT_FALSE(fs::exists(d.path / "ckpt-00000002"));
  EXPECT_EQ(find_checkpoint(d.path.string()), (d.path / "ckpt-00000001").string());
}

// --- A full disk and a file size limit, for real (not injected) ------------------------------------------

namespace {
// Runs `body` in a forked child and returns what it printed to the pipe and its exit code.
std::pair<std::string, int> in_child(const std::function<int(int out_fd)>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return {"pipe failed", -1};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    int code = 1;
    try {
      code = body(fds[1]);
    } catch (...) {
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {text, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
}

void put(int fd, const std::string& s) { [[maybe_unused]] ssize_t n = ::write(fd, s.data(), s.size()); }

// A checkpoint of step 5 in `out`, then the weights changed: what a failed save of step 10 must leave.
struct FirstCheckpoint {
  explicit FirstCheckpoint(const std::string& dir) : out(dir) {
    first = save_checkpoint(out, *m, meta_for(*m, 5), {&ea, &es});
    saved.assign(m->param_data(), m->param_data() + m->num_params());
    model_bytes = fs::file_size(fs::path(first) / "model.safetensors");
    for (float& v : std::span(m->param_data(), m->num_params())) v += 1.0f;
  }
  std::unique_ptr<nn::Model> m = tiny_gpt(5);
  std::vector<float> ea = std::vector<float>(m->num_params(), 0.25f), es = std::vector<float>(m->num_params(), 0.5f);
  std::string out, first;
  std::vector<float> saved;
  uint64_t model_bytes = 0;
};

void expect_previous_loadable(const std::string& out, const std::string& first, const std::vector<float>& saved) {
  EXPECT_EQ(find_checkpoint(out), first);
  auto ck = load_checkpoint(first);
  auto m2 = tiny_gpt(9);
  load_weights(*m2, ck.weights, first);
  for (size_t i = 0; i < saved.size(); ++i) ASSERT_EQ(m2->param_data()[i], saved[i]) << i;
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}
}  // namespace

TEST(CheckpointFullDisk, FileSizeLimitFailsNamingThePathAndBytesAndKeepsThePreviousCheckpoint) {
  TempDir d;
  FirstCheckpoint c(d.path.string());
  auto& [m, ea, es, out, first, saved, model_bytes] = c;
  // The child may not write files larger than half the weights file (RLIMIT_FSIZE, as `ulimit -f`).
  auto [message, code] = in_child([&](int fd) {
    ::signal(SIGXFSZ, SIG_IGN);  // as the trident CLI does: EFBIG instead of death by SIGXFSZ
    struct rlimit lim{model_bytes / 2, model_bytes / 2};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 3;
    try {
      save_checkpoint(out, *m, meta_for(*m, 10), {&ea, &es});
    } catch (const IoError& e) {
      put(fd, e.what());
      return 0;
    }
    return 2;  // no error
  });
  ASSERT_EQ(code, 0) << "child exit " << code << ": " << message;
  EXPECT_CONTAINS(message, "file size limit reached while writing '");
  EXPECT_CONTAINS(message, "ckpt-00000010.tmp.");
  EXPECT_CONTAINS(message, "model.safetensors");
  EXPECT_CONTAINS(message, fmt::format("the file needs {} bytes", model_bytes));
  EXPECT_CONTAINS(message, "RLIMIT_FSIZE");
  EXPECT_CONTAINS(message, "the previous checkpoint " + first + " is intact");
  expect_previous_loadable(out, first, saved);
}

TEST(CheckpointFullDisk, SmallTmpfsFailsNamingThePathAndBytesAndKeepsThePreviousCheckpoint) {
  // A private mount namespace with a 64 KiB tmpfs (root or CAP_SYS_ADMIN; skipped where mounting is refused).
  TempDir d;
  auto [message, code] = in_child([&](int fd) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", d.path.c_str(), "tmpfs", 0, "size=64k") != 0) {
      put(fd, std::string("cannot mount a tmpfs: ") + std::strerror(errno));
      return 77;
    }
    const std::string out = (d.path / "out").string();
    auto m = tiny_gpt(5);
    std::vector<float> ea(m->num_params(), 0.25f), es(m->num_params(), 0.5f);
    const std::string first = save_checkpoint(out, *m, meta_for(*m, 5), {&ea, &es});
    const std::vector<float> saved(m->param_data(), m->param_data() + m->num_params());
    uint64_t ckpt_bytes = 0;
    for (const auto& e : fs::directory_iterator(first)) ckpt_bytes += fs::file_size(e.path());
    // Fill the file system until a second checkpoint (of the same size: steps 5 and 9 print alike) no longer
    // fits beside the first.
    struct statvfs vfs{};
    ::statvfs(out.c_str(), &vfs);
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    std::string filler(free_bytes - ckpt_bytes / 2, 'x');
    { std::ofstream(d.path / "filler", std::ios::binary) << filler; }
    for (float& v : std::span(m->param_data(), m->num_params())) v += 1.0f;
    std::string e1 = error_of([&] { save_checkpoint(out, *m, meta_for(*m, 9), {&ea, &es}); });
    // The space check before writing: names the checkpoint, the folder, the bytes needed and free.
    put(fd, e1 + "\n");
    if (e1.find(fmt::format("needs {} bytes", ckpt_bytes)) == std::string::npos) return 4;
    if (e1.find("no space for checkpoint ckpt-00000009 in '" + out + "'") == std::string::npos) return 5;
    if (e1.find("the previous checkpoint " + first + " is intact") == std::string::npos) return 6;
    // A single file that does not fit: ENOSPC from reserving its space, and from write(2) when the size is
    // not announced; the old file stays.
    const std::string f = (d.path / "out" / "big.bin").string();
    io::atomic_write_file(f, [](io::FileWriter& w) { w.write("old"); });
    std::string big(free_bytes, 'y');
    std::string e2 = error_of(
        [&] { io::atomic_write_file(f, [&](io::FileWriter& w) { w.write(big); }, "the old file is intact", big.size()); });
    put(fd, e2 + "\n");
    if (e2.find(fmt::format("no space left on device while writing '{}' (reserving space; the file needs {} bytes",
                            f, big.size())) == std::string::npos)
      return 7;
    std::string e3 = error_of([&] { io::atomic_write_file(f, [&](io::FileWriter& w) { w.write(big); }); });
    put(fd, e3 + "\n");
    if (e3.find(fmt::format("no space left on device while writing '{}' (write;", f)) == std::string::npos) return 8;
    if (io::read_file(f) != "old") return 9;
    try {
      expect_previous_loadable(out, first, saved);
    } catch (...) {
      return 10;
    }
    return ::testing::Test::HasFailure() ? 11 : 0;
  });
  if (code == 77) TRIDENT_SKIP_MACHINE(message);
  EXPECT_EQ(code, 0) << message;
}

TEST(CheckpointFullDisk, EnospcFromFsyncFailsAndKeepsThePreviousCheckpoint) {
  TempDir d;
  FirstCheckpoint c(d.path.string());
  auto& [m, ea, es, out, first, saved, model_bytes] = c;
  io::testing::set_fsync_fault(ENOSPC);
  const std::string e = error_of([&] { save_checkpoint(out, *m, meta_for(*m, 10), {&ea, &es}); });
  io::testing::set_fsync_fault(0);
  EXPECT_CONTAINS(e, "no space left on device while writing '");
  EXPECT_CONTAINS(e, fmt::format("model.safetensors' (fsync; the file needs {} bytes, {} were written)", model_bytes,
                                 model_bytes));
  EXPECT_CONTAINS(e, "the previous checkpoint " + first + " is intact");
  expect_previous_loadable(out, first, saved);
}

// --- Asynchronous writes ---------------------------------------------------------------------------------

TEST(AsyncCheckpoint, WritesTheSnapshotTakenAtSubmitByteForByteAsTheSyncWrite) {
  TempDir d;
  auto m = tiny_gpt(3);
  std::vector<float> ea(m->num_params(), 0.125f), es(m->num_params(), 0.5f);
  const std::string sync_dir = save_checkpoint((d.path / "sync").string(), *m, meta_for(*m, 4), {&ea, &es});
  AsyncCheckpointWriter writer;
  const std::string async_dir =
      writer.submit((d.path / "async").string(), snapshot_checkpoint(*m, meta_for(*m, 4), {&ea, &es}), 1);
  // Training goes on while the write runs: later changes are not in the checkpoint.
  for (float& v : std::span(m->param_data(), m->num_params())) v = -7.0f;
  std::fill(ea.begin(), ea.end(), 9.0f);
  writer.wait();
  EXPECT_EQ(async_dir, checkpoint_dir((d.path / "async").string(), 4));
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "checkpoint.json"}) {
    EXPECT_EQ(io::read_file((fs::path(async_dir) / f).string()), io::read_file((fs::path(sync_dir) / f).string()))
        << f;
  }
  EXPECT_EQ(find_checkpoint((d.path / "async").string()), async_dir);
}

TEST(AsyncCheckpoint, AFailedWriteIsRethrownByTheNextWaitOrSubmit) {
  TempDir d;
  auto m = tiny_gpt(3);
  std::vector<float> ea(m->num_params(), 0.125f), es(m->num_params(), 0.5f);
  const std::string out = d.path.string();
  AsyncCheckpointWriter writer;
  const std::string first = writer.submit(out, snapshot_checkpoint(*m, meta_for(*m, 2), {&ea, &es}), 1);
  writer.wait();
  io::testing::set_write_fault(100, ENOSPC);
  writer.submit(out, snapshot_checkpoint(*m, meta_for(*m, 3), {&ea, &es}), 1);
  try {
    writer.submit(out, snapshot_checkpoint(*m, meta_for(*m, 4), {&ea, &es}), 1);  // waits for step 3's write
    FAIL() << "the failed write of step 3 was not reported";
  } catch (const IoError& e) {
    EXPECT_CONTAINS(e.what(), "no space left on device");
    EXPECT_CONTAINS(e.what(), "the previous checkpoint " + first + " is intact");
  }
  io::testing::set_write_fault(-1, 0);
  EXPECT_EQ(find_checkpoint(out), first);
  // The error is reported once; the writer goes on working.
  EXPECT_NO_THROW(writer.wait());
  writer.submit(out, snapshot_checkpoint(*m, meta_for(*m, 5), {&ea, &es}), 1);
  writer.wait();
  EXPECT_EQ(find_checkpoint(out), checkpoint_dir(out, 5));
  EXPECT_NO_THROW(load_checkpoint(find_checkpoint(out)));
}

TEST(AsyncCheckpoint, AFolderLeftByAWriterThatDiedIsRemovedByTheNextWrite) {
  TempDir d;
  auto m = tiny_gpt(3);
  std::vector<float> ea(m->num_params()), es(m->num_params());
  // A pid that cannot be running (above the kernel's pid_max), and one that runs (our parent: kept).
  const fs::path dead = d.path / ".ckpt-00000007.tmp.2147483646";
  const fs::path ours = d.path / fmt::format(".ckpt-00000001.tmp.{}", ::getppid());
  // The `latest` pointer's temporary, left by a rank killed between writing it and renaming it.
  const fs::path dead_latest = d.path / "latest.tmp.2147483646";
  const fs::path ours_latest = d.path / fmt::format("latest.tmp.{}", ::getppid());
  fs::create_directories(dead);
  fs::create_directories(ours);
  std::ofstream(dead_latest) << "ckpt-00000007\n";
  std::ofstream(ours_latest) << "ckpt-00000001\n";
  save_checkpoint(d.path.string(), *m, meta_for(*m, 8), {&ea, &es});
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(ours));
  EXPECT_FALSE(fs::exists(dead_latest));
  EXPECT_TRUE(fs::exists(ours_latest));
}
