// Writes the seed corpus of the fuzz targets into DIR/<target>/: manifests
// as the engine writes them (full, delta, compacted; the checksum trailer
// left off, as fuzz_manifest adds it), delta payloads as the encoders
// write them, for every encoding and a few dtypes, and tensor lists for
// fuzz_safetensors in its encoding (valid ones, then one fault each).
// fuzz_catalog's seeds are real roots: fuzz_catalog_seeds writes those.
//   fuzz_seeds DIR
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "delta/delta_codec.h"
#include "testing/codec_testing.h"
#include "format/manifest.h"
#include "format/names.h"

namespace {

using namespace ckpt;
using namespace ckpt::internal;

void Write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// fuzz_safetensors' input (see fuzz_safetensors.cc): i64 step, u16 extras
// length + bytes, then per tensor u8 flags, name, u8 dtype, u8 rank, dims
// and the raw_bytes adjustment the flags ask for.
class SafetensorsInput {
 public:
  SafetensorsInput(int64_t step, const std::string& extras) {
    I64(step);
    out_.push_back(static_cast<char>(extras.size() & 0xff));
    out_.push_back(static_cast<char>(extras.size() >> 8));
    out_ += extras;
  }
  // flags: bits 0-1 name kind (0 bytes, 1 "__metadata__", 2 repeat of tensor
  // `repeat`), bit 2 i64 dims, bits 3-4 raw_bytes (0 exact, 1 + `adjust`).
  SafetensorsInput& Tensor(const std::string& name, int dtype, const std::vector<int64_t>& shape,
                           uint8_t flags = 0, int8_t adjust = 0, uint8_t repeat = 0) {
    out_.push_back(static_cast<char>(flags));
    if ((flags & 3) == 2) {
      out_.push_back(static_cast<char>(repeat));
    } else if ((flags & 3) != 1) {
      out_.push_back(static_cast<char>(name.size()));
      out_ += name;
    }
    out_.push_back(static_cast<char>(dtype));
    out_.push_back(static_cast<char>(shape.size()));
    for (int64_t d : shape) {
      if (flags & 4) {
        I64(d);
      } else {
        out_.push_back(static_cast<char>(d));
      }
    }
    if (((flags >> 3) & 3) == 1) out_.push_back(static_cast<char>(adjust));
    return *this;
  }
  const std::string& bytes() const { return out_; }

 private:
  void I64(int64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(static_cast<uint64_t>(v) >> (8 * i)));
  }
  std::string out_;
};

std::vector<std::string> SafetensorsSeeds() {
  const int bf16 = static_cast<int>(DType::kBFloat16), f32 = static_cast<int>(DType::kFloat32);
  auto model = [&](int64_t step, const std::string& extras) {
    SafetensorsInput in(step, extras);
    in.Tensor("model.embed.weight", bf16, {32, 64})
        .Tensor("model.layers.0.attn.q.weight", f32, {16, 16})
        .Tensor("model.layers.0.attn.scale", static_cast<int>(DType::kFloat64), {})
        .Tensor("mask", static_cast<int>(DType::kBool), {7})
        .Tensor("empty", static_cast<int>(DType::kInt64), {0, 3});
    return in;
  };
  std::vector<std::string> seeds;
  seeds.push_back(model(1200, R"({"epoch":3,"lr":0.001})").bytes());
  SafetensorsInput every(0, "{}");
  for (int d = 0; d < kNumDTypes; ++d) every.Tensor("t" + std::to_string(d), d, {3, 1});
  seeds.push_back(every.bytes());
  // Dimensions past a byte, and a name in Cyrillic with an emoji.
  SafetensorsInput wide(-1, "");
  wide.Tensor("big", static_cast<int>(DType::kInt8), {int64_t{1} << 31, 2}, 4)
      .Tensor("\xd0\xbf\xd0\xbe\xd0\xbb\xd0\xb5.\xf0\x9f\x99\x82", f32, {2});
  seeds.push_back(wide.bytes());
  // One fault each: a repeated name, "__metadata__", a name that is not
  // UTF-8, a dtype out of range, raw_bytes one off, a negative dimension,
  // extras that are not UTF-8.
  seeds.push_back(model(5, "{}").Tensor("", f32, {4}, 2, 0, 1).bytes());
  seeds.push_back(model(5, "{}").Tensor("", f32, {4}, 1).bytes());
  seeds.push_back(model(5, "{}").Tensor("bad\xff\xfe", f32, {4}).bytes());
  seeds.push_back(model(5, "{}").Tensor("odd", 13, {4}).bytes());
  seeds.push_back(model(5, "{}").Tensor("off", f32, {4}, 1 << 3, 1).bytes());
  seeds.push_back(model(5, "{}").Tensor("neg", f32, {-4}, 4).bytes());
  seeds.push_back(model(5, "{\"note\":\"\xc3\x28\"}").bytes());
  return seeds;
}

Manifest SampleManifest(bool delta) {
  Manifest m;
  m.step = delta ? 12 : 10;
  m.kind = delta ? CheckpointKind::kDelta : CheckpointKind::kFull;
  if (delta) {
    m.base_step = 10;
    m.base_manifest_xxh3 = 0x0123456789abcdefULL;
    m.delta_mode = DeltaOptions::Mode::kExact;
  }
  m.created_unix_ns = 1764620000000000000;
  m.writer = "ckpt fuzz-seed";
  m.extras_json = R"({"epoch": 3, "lr": 0.001, "note": "seed"})";
  m.shards = {{"layers.0.attn.0.shard", 3 * 4096}, {"embed.0.shard", 8192}};
  TensorInfo a{"layers.0.attn.q.weight", DType::kBFloat16, {16, 64}, 2048, 2048, RecordEncoding::kRaw,
               "layers.0.attn.0.shard", 0, 0x1111, 0};
  TensorInfo b{"layers.0.attn.q.bias", DType::kFloat32, {64}, 256, 256, RecordEncoding::kRaw,
               "layers.0.attn.0.shard", 4096, 0x2222, 0};
  TensorInfo c{"layers.0.attn.scale", DType::kFloat32, {}, 4, 4, RecordEncoding::kRaw,
               "layers.0.attn.0.shard", 8192,
               0x3333, 0};
  TensorInfo d{"embed.weight", DType::kFloat16, {32, 64}, 4096, 900, delta ? RecordEncoding::kSparse : RecordEncoding::kZstd,
               "embed.0.shard", 0, 0x4444, 0};
  TensorInfo e{"embed.empty", DType::kInt64, {0, 3}, 0, 0, RecordEncoding::kRaw, "embed.0.shard", 0, 0x5555, 0};
  m.tensors = {a, b, c, d, e};
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  for (const char* t : {"fuzz_manifest", "fuzz_delta", "fuzz_names", "fuzz_safetensors"}) {
    std::filesystem::create_directories(dir / t);
  }

  int i = 0;
  for (bool delta : {false, true}) {
    Manifest m = SampleManifest(delta);
    auto text = SerializeManifest(&m);
    if (!text.ok()) {
      std::fprintf(stderr, "fuzz_seeds: %s\n", std::string(text.status().message()).c_str());
      return 1;
    }
    const size_t trailer = text->rfind(",\n \"manifest_xxh3\"");
    Write(dir / "fuzz_manifest" / ("manifest" + std::to_string(i++)), text->substr(0, trailer));
    Write(dir / "fuzz_manifest" / ("raw" + std::to_string(i++)), "!" + *text);
  }

  // Delta payloads: header (encoding, dtype, element count) + payload.
  // In fuzz_delta's order: its first byte % 3 picks the encoding.
  const RecordEncoding encodings[] = {RecordEncoding::kSparse, RecordEncoding::kXor, RecordEncoding::kTopK};
  i = 0;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64, DType::kUInt8}) {
    const size_t elements = 300, n = elements * DTypeSize(dtype);
    std::vector<char> r(n), x(n);
    for (size_t k = 0; k < n; ++k) r[k] = static_cast<char>(k * 131);  // fuzz_delta's base
    for (double changed : {0.01, 0.5}) {
      x = r;
      for (size_t k = 0; k < n; k += static_cast<size_t>(1 / changed)) x[k] ^= 0x5a;
      Piece piece{x.data(), n};
      for (bool topk : {false, true}) {
        std::vector<char> ref = r;
        auto rec = topk ? EncodeTopKDelta({&piece, 1}, ref.data(), n, dtype, 0.1, 1)
                        : EncodeExactDelta({&piece, 1}, ref.data(), n, dtype, 1);
        if (!rec.ok()) continue;
        // xor_planes is fuzz_delta's first byte 0x80 (see fuzz_delta.cc).
        int enc = 0x80;
        for (int e = 0; e < 3; ++e) {
          if (rec->encoding == encodings[e]) enc = e;
        }
        std::string bytes = {static_cast<char>(enc), static_cast<char>(dtype),
                             static_cast<char>(elements >> 8), static_cast<char>(elements & 0xff)};
        bytes.append(rec->bytes.data(), rec->bytes.size());
        Write(dir / "fuzz_delta" / ("delta" + std::to_string(i++)), bytes);
      }
    }
    // A full "planes" record of the base (first byte 0xC0).
    Piece base{r.data(), n};
    auto planes = EncodePlanesRecord({&base, 1}, n, dtype, 1);
    if (planes.ok()) {
      std::string bytes = {static_cast<char>(0xC0), static_cast<char>(dtype),
                           static_cast<char>(elements >> 8), static_cast<char>(elements & 0xff)};
      bytes.append(planes->data(), planes->size());
      Write(dir / "fuzz_delta" / ("planes" + std::to_string(i++)), bytes);
    }
  }

  i = 0;
  for (const std::string& name : {CheckpointDirName(0), CheckpointDirName(1200), TempDirName(7, 0xabc),
                                  std::string("layers.0.attn.q.weight"), std::string("0123456789abcdef"),
                                  std::string("step-00000000000000000012\n")}) {
    Write(dir / "fuzz_names" / ("name" + std::to_string(i++)), name);
  }

  i = 0;
  for (const std::string& seed : SafetensorsSeeds()) {
    Write(dir / "fuzz_safetensors" / ("tensors" + std::to_string(i++)), seed);
  }
  return 0;
}
