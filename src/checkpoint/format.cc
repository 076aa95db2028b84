#include "checkpoint/format.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"

namespace zerodp::checkpoint {

using Json = nlohmann::ordered_json;

std::string step_dir_name(uint64_t step) { return fmt::format("step_{:08d}", step); }
std::string rank_file_name(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }
std::string tensor_name(std::string_view unit, std::string_view kind) {
  return fmt::format("{}.{}", unit, kind);
}

SavedValues saved_values(std::string_view kind) {
  if (kind == "adam_m8" || kind == "adam_v8") return SavedValues::kAny;
  if (kind == "adam_v" || kind.ends_with("_scale")) return SavedValues::kFiniteNonNegative;
  return SavedValues::kFinite;
}

std::string_view describe(SavedValues rule) {
  switch (rule) {
    case SavedValues::kAny:
      return "any";
    case SavedValues::kFinite:
      return "finite";
    case SavedValues::kFiniteNonNegative:
      return "finite, non-negative";
  }
  return "?";
}

namespace {

// The first of `n` elements at `p` whose bits are not finite (all exponent bits set) or, with
// `NonNegative`, are negative (the sign bit and any other: -0 passes). Blocks are tested
// without a branch per element, which the compiler vectorizes; only a block that holds one
// is searched.
template <typename Bits, bool NonNegative>
std::optional<size_t> first_bad_bits(const std::byte* p, size_t n, Bits exponent) {
  constexpr Bits kSign = Bits{1} << (8 * sizeof(Bits) - 1);
  const auto bad = [exponent](Bits b) {
    const bool not_finite = (b & exponent) == exponent;
    return NonNegative ? not_finite | (b > kSign) : not_finite;
  };
  constexpr size_t kBlock = 512;
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t m = std::min(kBlock, n - at);
    const std::byte* q = p + at * sizeof(Bits);
    unsigned any = 0;
    for (size_t i = 0; i < m; ++i) {
      Bits b;
      std::memcpy(&b, q + i * sizeof(Bits), sizeof(Bits));
      any |= static_cast<unsigned>(bad(b));
    }
    if (any == 0) continue;
    for (size_t i = 0; i < m; ++i) {
      Bits b;
      std::memcpy(&b, q + i * sizeof(Bits), sizeof(Bits));
      if (bad(b)) return at + i;
    }
  }
  return std::nullopt;
}

template <typename Bits>
std::optional<size_t> first_bad_bits(std::span<const std::byte> bytes, SavedValues rule,
                                     Bits exponent) {
  const size_t n = bytes.size() / sizeof(Bits);
  return rule == SavedValues::kFiniteNonNegative
             ? first_bad_bits<Bits, true>(bytes.data(), n, exponent)
             : first_bad_bits<Bits, false>(bytes.data(), n, exponent);
}

// An IEEE half's value, exactly (a float holds every half). Here rather than tensor/dtype's
// converters so the checkpoint's parsers build alone (the fuzz target takes only them).
float half_value(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  const float sign = (bits & 0x8000) != 0 ? -1.0f : 1.0f;
  if (exponent == 0x1f) {
    return mantissa != 0 ? std::numeric_limits<float>::quiet_NaN()
                         : sign * std::numeric_limits<float>::infinity();
  }
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  return sign * std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
}

}  // namespace

std::optional<BadValue> first_bad_value(std::span<const std::byte> bytes,
                                        safetensors::ElementType type, SavedValues rule) {
  using safetensors::ElementType;
  if (rule == SavedValues::kAny) return std::nullopt;
  std::optional<size_t> at;
  if (type == ElementType::kF32) {
    at = first_bad_bits<uint32_t>(bytes, rule, 0x7f800000u);
  } else if (type == ElementType::kBF16) {
    at = first_bad_bits<uint16_t>(bytes, rule, 0x7f80u);
  } else if (type == ElementType::kF16) {
    at = first_bad_bits<uint16_t>(bytes, rule, 0x7c00u);
  }
  if (!at) return std::nullopt;
  BadValue bad{.index = *at, .value = 0};
  if (type == ElementType::kF32) {
    float v = 0;
    std::memcpy(&v, bytes.data() + *at * 4, 4);
    bad.value = v;
  } else {
    uint16_t bits = 0;
    std::memcpy(&bits, bytes.data() + *at * 2, 2);
    bad.value =
        type == ElementType::kBF16 ? std::bit_cast<float>(uint32_t{bits} << 16) : half_value(bits);
  }
  return bad;
}

std::string to_json(const Meta& m) {
  Json j;
  j["format"] = kFormat;
  j["zerodp_version"] = m.zerodp_version;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  if (m.islands > 1) j["islands"] = m.islands;
  j["stage"] = m.stage;
  j["precision"] = m.precision;
  Json model;
  model["kind"] = m.model_kind;
  for (const auto& [k, v] : m.model_shape) model[k] = v;
  j["model"] = model;
  Json units = Json::array();
  for (const UnitMeta& u : m.units) {
    Json ju;
    ju["name"] = u.name;
    ju["numel"] = u.numel;
    ju["partition"] = u.counts;
    Json ts = Json::array();
    for (const TensorMeta& t : u.tensors) {
      ts.push_back(
          {{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}, {"numel", t.numel}});
    }
    ju["tensors"] = ts;
    units.push_back(ju);
  }
  j["units"] = units;
  j["config"] = m.config;
  j["optimizer"] = {{"kind", "adamw"}, {"step", m.adam_step}};
  if (m.int8_moments) {
    j["optimizer"]["moments"] = "int8";
    j["optimizer"]["moment_code"] = m.moment_code;
  }
  j["lr_schedule"] = {{"step", m.step}, {"lr_next", m.lr_next}};
  if (m.loss_scaler) {
    j["loss_scaler"] = {{"scale", m.loss_scaler->scale},
                        {"clean_steps", m.loss_scaler->clean_steps},
                        {"hysteresis_left", m.loss_scaler->hysteresis_left}};
  } else {
    j["loss_scaler"] = nullptr;
  }
  j["data"] = {{"epoch", m.data_epoch},
               {"step_in_epoch", m.data_step},
               {"samples_per_step", m.samples_per_step},
               {"dataset_size", m.dataset_size},
               {"seed", m.seed}};
  if (!m.data_identity.empty()) j["data"]["identity"] = m.data_identity;
  if (!m.samples_chain.empty()) {
    j["data"]["samples_chain"] = m.samples_chain;
    j["data"]["samples_chain_from"] = m.samples_chain_from;
  }
  Json rng = Json::array();
  for (size_t r = 0; r < m.rank_seeds.size(); ++r) {
    rng.push_back({{"rank", r},
                   {"kind", "stateless"},
                   {"seed", m.rank_seeds[r]},
                   {"counter", {{"epoch", m.data_epoch}, {"step_in_epoch", m.data_step}}}});
  }
  j["rng"] = rng;
  Json files = Json::array();
  for (const FileMeta& f : m.files) {
    Json file = {{"name", f.name}, {"bytes", f.bytes}};
    if (f.crc32c.empty()) {
      file["sha256"] = f.sha256;
    } else {
      file["crc32c"] = f.crc32c;
    }
    files.push_back(std::move(file));
  }
  j["files"] = files;
  if (!m.hosts.empty()) j["hosts"] = m.hosts;
  return j.dump(2) + "\n";
}

namespace {

// Field access that names the file and the field's path in every error.
class Fields {
 public:
  explicit Fields(std::string_view what) : what_(what) {}

  [[noreturn]] void fail(std::string_view path, std::string_view problem) const {
    throw CorruptData(fmt::format("{}: field \"{}\" {}", what_, path, problem));
  }
  const Json& at(const Json& j, std::string_view path, std::string_view key) const {
    if (!j.is_object()) fail(path, "is not an object");
    const auto it = j.find(key);
    if (it == j.end()) fail(join(path, key), "is missing");
    return *it;
  }
  template <typename T>
  T get(const Json& j, std::string_view path, std::string_view key) const {
    const Json& v = at(j, path, key);
    const std::string p = join(path, key);
    if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) fail(p, fmt::format("is {}, expected a string", v.type_name()));
      return v.get<std::string>();
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) fail(p, fmt::format("is {}, expected a boolean", v.type_name()));
      return v.get<bool>();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) fail(p, fmt::format("is {}, expected a number", v.type_name()));
      return v.get<T>();
    } else if constexpr (std::is_unsigned_v<T>) {
      if (!v.is_number_unsigned()) {
        fail(p, fmt::format("is {}, expected a non-negative integer", v.dump()));
      }
      return v.get<T>();
    } else {
      if (!v.is_number_integer()) fail(p, fmt::format("is {}, expected an integer", v.dump()));
      // Through 64 bits first: get<int> of a larger number would wrap silently.
      if (v.is_number_unsigned() &&
          v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
        fail(p, fmt::format("is {}, past the largest {}", v.dump(), std::numeric_limits<T>::max()));
      }
      const int64_t x = v.get<int64_t>();
      if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) {
        fail(p, fmt::format("is {}, outside [{}, {}]", x, std::numeric_limits<T>::min(),
                            std::numeric_limits<T>::max()));
      }
      return static_cast<T>(x);
    }
  }
  const Json& array(const Json& j, std::string_view path, std::string_view key) const {
    const Json& v = at(j, path, key);
    if (!v.is_array())
      fail(join(path, key), fmt::format("is {}, expected an array", v.type_name()));
    return v;
  }
  static std::string join(std::string_view path, std::string_view key) {
    return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
  }

 private:
  std::string what_;
};

// meta.json's files: one per rank, named as the writer names them, then the history.
void parse_files(const Fields& f, const Json& j, Meta& m) {
  const Json& files = f.array(j, "", "files");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string p = fmt::format("files[{}]", i);
    FileMeta file;
    file.name = f.get<std::string>(files[i], p, "name");
    // Names come from the writer; anything that could leave the directory is not ours.
    if (file.name.empty() || file.name.find('/') != std::string::npos || file.name[0] == '.') {
      f.fail(p + ".name", fmt::format("is \"{}\", not a file name", file.name));
    }
    file.bytes = f.get<uint64_t>(files[i], p, "bytes");
    // CRC-32C since it replaced SHA-256; checkpoints from before hold sha256.
    const auto hex = [&](std::string_view key, size_t digits) {
      std::string h = f.get<std::string>(files[i], p, key);
      if (h.size() != digits || h.find_first_not_of("0123456789abcdef") != std::string::npos) {
        f.fail(fmt::format("{}.{}", p, key), fmt::format("is not {} lowercase hex digits", digits));
      }
      return h;
    };
    // Exactly one: a reader checks the one there is, so a second beside it would be taken
    // on trust.
    if (files[i].contains("crc32c") && files[i].contains("sha256")) {
      f.fail(p,
             "has both \"crc32c\" and \"sha256\"; a checkpoint lists one digest per file "
             "(zerodp writes crc32c), so this entry was not written by zerodp");
    }
    if (files[i].contains("crc32c")) {
      file.crc32c = hex("crc32c", 8);
    } else if (files[i].contains("sha256")) {
      file.sha256 = hex("sha256", 64);
    } else {
      f.fail(p, "has no digest: neither \"crc32c\" nor \"sha256\"");
    }
    m.files.push_back(std::move(file));
  }
  // The rank files, then the history (absent from checkpoints of earlier versions).
  const auto ranks = static_cast<size_t>(m.shard_files());
  if (m.files.size() != ranks && m.files.size() != ranks + 1) {
    f.fail("files", m.islands > 1 ? fmt::format("lists {} files for world_size {} x islands {}",
                                                m.files.size(), m.world_size, m.islands)
                                  : fmt::format("lists {} files for world_size {}", m.files.size(),
                                                m.world_size));
  }
  if (m.files.size() == ranks + 1 && m.files.back().name != kHistoryFile) {
    f.fail(fmt::format("files[{}].name", ranks),
           fmt::format("is \"{}\", expected \"{}\"", m.files.back().name, kHistoryFile));
  }
  for (int r = 0; r < m.shard_files(); ++r) {
    if (m.files[static_cast<size_t>(r)].name != rank_file_name(r)) {
      f.fail(fmt::format("files[{}].name", r),
             fmt::format("is \"{}\", expected \"{}\"", m.files[static_cast<size_t>(r)].name,
                         rank_file_name(r)));
    }
  }
}

// units[i] of meta.json: its partition over `world_size` ranks sums to the unit, and its
// tensors lie back to back over exactly its elements.
UnitMeta parse_unit(const Fields& f, const Json& unit, const std::string& p, int world_size) {
  UnitMeta u;
  u.name = f.get<std::string>(unit, p, "name");
  u.numel = f.get<uint64_t>(unit, p, "numel");
  const Json& part = f.array(unit, p, "partition");
  if (part.size() != static_cast<size_t>(world_size)) {
    f.fail(p + ".partition",
           fmt::format("has {} ranks, world_size is {}", part.size(), world_size));
  }
  uint64_t sum = 0;
  for (size_t r = 0; r < part.size(); ++r) {
    if (!part[r].is_number_unsigned()) f.fail(p + ".partition", "holds a non-count");
    u.counts.push_back(part[r].get<uint64_t>());
    if (u.counts.back() > u.numel) f.fail(p + ".partition", "holds a count past the unit");
    sum += u.counts.back();
    if (sum > u.numel) f.fail(p + ".partition", "holds more elements than the unit");
  }
  if (sum != u.numel) {
    f.fail(p + ".partition", fmt::format("sums to {}, the unit has {}", sum, u.numel));
  }
  const Json& ts = f.array(unit, p, "tensors");
  for (size_t k = 0; k < ts.size(); ++k) {
    const std::string tp = fmt::format("{}.tensors[{}]", p, k);
    TensorMeta t;
    t.name = f.get<std::string>(ts[k], tp, "name");
    t.offset = f.get<uint64_t>(ts[k], tp, "offset");
    t.numel = f.get<uint64_t>(ts[k], tp, "numel");
    const Json& shape = f.array(ts[k], tp, "shape");
    for (const Json& d : shape) {
      if (!d.is_number_unsigned()) f.fail(tp + ".shape", "holds a non-dimension");
      t.shape.push_back(d.get<int64_t>());
    }
    if (t.offset > u.numel || t.numel > u.numel - t.offset) {
      f.fail(tp, fmt::format("covers [{}, {}) past the unit's {} elements", t.offset,
                             t.offset + t.numel, u.numel));
    }
    // Readers size their buffers by shape and copy by numel: the two must agree, or an
    // export declares one size and streams another.
    uint64_t product = 1;
    for (const int64_t d : t.shape) {
      const auto ud = static_cast<uint64_t>(d);
      product = ud != 0 && product > u.numel / ud ? u.numel + 1 : product * ud;
    }
    if (product != t.numel) {
      f.fail(tp + ".numel",
             fmt::format("is {}, but shape [{}] holds {}", t.numel, fmt::join(t.shape, ", "),
                         product > u.numel ? "more than the unit" : std::to_string(product)));
    }
    const uint64_t expected_offset =
        u.tensors.empty() ? 0 : u.tensors.back().offset + u.tensors.back().numel;
    if (t.offset != expected_offset) {
      f.fail(tp + ".offset",
             fmt::format("is {}; the tensors before it end at {} (a unit's tensors lie back to "
                         "back)",
                         t.offset, expected_offset));
    }
    u.tensors.push_back(std::move(t));
  }
  const uint64_t covered = u.tensors.empty() ? 0 : u.tensors.back().offset + u.tensors.back().numel;
  if (covered != u.numel) {
    f.fail(p + ".tensors", fmt::format("cover {} elements, the unit has {}", covered, u.numel));
  }
  return u;
}

// meta.json's data cursor as a sampler leaves it: a step takes 1 to dataset_size samples,
// an equal share for each of the saving run's ranks, and the cursor is inside an epoch (a
// step that ends one moves it to the next epoch's start).
void check_data_cursor(const Fields& f, const Meta& m) {
  const uint64_t k = m.samples_per_step;
  if (k == 0) f.fail("data.samples_per_step", "is 0; a step takes 1 sample or more");
  if (k > m.dataset_size) {
    f.fail("data.samples_per_step",
           fmt::format("is {}, more than the {} samples of data.dataset_size", k, m.dataset_size));
  }
  if (k % static_cast<uint64_t>(m.world_size) != 0) {
    f.fail("data.samples_per_step",
           fmt::format("is {}, which the {} ranks of world_size cannot have taken in equal shares",
                       k, m.world_size));
  }
  if (const uint64_t steps = m.dataset_size / k; m.data_step >= steps) {
    f.fail("data.step_in_epoch",
           fmt::format("is {}, past the {} steps of an epoch (data.dataset_size {} / "
                       "data.samples_per_step {})",
                       m.data_step, steps, m.dataset_size, k));
  }
}

// meta.json's "optimizer": AdamW's step (0..the run's step, which m holds already) and how
// its moments are stored.
void parse_optimizer(const Fields& f, const Json& j, Meta& m) {
  const Json& opt = f.at(j, "", "optimizer");
  m.adam_step = f.get<int64_t>(opt, "optimizer", "step");
  if (opt.contains("moments")) {
    const std::string moments = f.get<std::string>(opt, "optimizer", "moments");
    if (moments != "int8" && moments != "fp32") {
      f.fail("optimizer.moments", fmt::format("is \"{}\", expected fp32 or int8", moments));
    }
    m.int8_moments = moments == "int8";
  }
  if (m.int8_moments) {
    m.moment_code = opt.contains("moment_code")
                        ? f.get<std::string>(opt, "optimizer", "moment_code")
                        : std::string(kMomentCodeBeforeTheField);
  }
  if (m.adam_step < 0 || static_cast<uint64_t>(m.adam_step) > m.step) {
    f.fail("optimizer.step", fmt::format("is {}, expected 0..step ({})", m.adam_step, m.step));
  }
}

// meta.json's "data": the sampler's cursor and seed, and what identifies the data and the
// samples taken so far.
void parse_data(const Fields& f, const Json& j, Meta& m) {
  const Json& data = f.at(j, "", "data");
  m.data_epoch = f.get<uint64_t>(data, "data", "epoch");
  m.data_step = f.get<uint64_t>(data, "data", "step_in_epoch");
  m.samples_per_step = f.get<uint64_t>(data, "data", "samples_per_step");
  m.dataset_size = f.get<uint64_t>(data, "data", "dataset_size");
  m.seed = f.get<uint64_t>(data, "data", "seed");
  if (data.contains("identity")) m.data_identity = f.get<std::string>(data, "data", "identity");
  if (data.contains("samples_chain")) {
    m.samples_chain = f.get<std::string>(data, "data", "samples_chain");
    m.samples_chain_from = f.get<uint64_t>(data, "data", "samples_chain_from");
    if (m.samples_chain.size() != 64 ||
        m.samples_chain.find_first_not_of("0123456789abcdef") != std::string::npos) {
      f.fail("data.samples_chain",
             fmt::format("is \"{}\"; it should be 64 lowercase hex digits (a sha256)",
                         m.samples_chain));
    }
  }
  check_data_cursor(f, m);
}

}  // namespace

Meta parse_meta(std::string_view text, std::string_view what) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    // parse_error, and out_of_range for numbers past 64 bits (found by the fuzzer).
    throw CorruptData(fmt::format("{}: not JSON: {}", what, e.what()));
  }
  const Fields f(what);
  if (!j.is_object()) throw CorruptData(fmt::format("{}: is not a JSON object", what));
  const std::string format = f.get<std::string>(j, "", "format");
  if (format != kFormat) {
    f.fail("format", fmt::format("is \"{}\"; this zerodp reads \"{}\"", format, kFormat));
  }
  Meta m;
  m.zerodp_version = f.get<std::string>(j, "", "zerodp_version");
  m.step = f.get<uint64_t>(j, "", "step");
  m.world_size = f.get<int>(j, "", "world_size");
  if (m.world_size < 1)
    f.fail("world_size", fmt::format("is {}, expected 1 or more", m.world_size));
  if (j.contains("islands")) {
    m.islands = f.get<int>(j, "", "islands");
    if (m.islands < 2) f.fail("islands", fmt::format("is {}, expected 2 or more", m.islands));
  }
  m.stage = f.get<int>(j, "", "stage");
  if (m.stage < 0 || m.stage > 3) f.fail("stage", fmt::format("is {}, expected 0..3", m.stage));
  m.precision = f.get<std::string>(j, "", "precision");
  if (m.precision != "bf16" && m.precision != "fp16" && m.precision != "fp32") {
    f.fail("precision", fmt::format("is \"{}\", expected bf16, fp16 or fp32", m.precision));
  }
  const Json& model = f.at(j, "", "model");
  m.model_kind = f.get<std::string>(model, "model", "kind");
  for (const auto& [k, v] : model.items()) {
    if (k == "kind") continue;
    if (!v.is_number_integer()) f.fail("model." + k, "is not an integer");
    m.model_shape[k] = v.get<int64_t>();
  }
  const Json& units = f.array(j, "", "units");
  for (size_t i = 0; i < units.size(); ++i) {
    m.units.push_back(parse_unit(f, units[i], fmt::format("units[{}]", i), m.world_size));
  }
  const Json& config = f.at(j, "", "config");
  if (!config.is_object()) f.fail("config", "is not an object");
  for (const auto& [k, v] : config.items()) {
    if (!v.is_string()) f.fail("config." + k, "is not a string");
    m.config[k] = v.get<std::string>();
  }
  parse_optimizer(f, j, m);
  m.lr_next = f.get<double>(f.at(j, "", "lr_schedule"), "lr_schedule", "lr_next");
  const Json& scaler = f.at(j, "", "loss_scaler");
  if (!scaler.is_null()) {
    ScalerMeta s;
    s.scale = f.get<double>(scaler, "loss_scaler", "scale");
    s.clean_steps = f.get<int64_t>(scaler, "loss_scaler", "clean_steps");
    s.hysteresis_left = f.get<int32_t>(scaler, "loss_scaler", "hysteresis_left");
    m.loss_scaler = s;
  }
  parse_data(f, j, m);
  const Json& rng = f.array(j, "", "rng");
  for (size_t r = 0; r < rng.size(); ++r) {
    m.rank_seeds.push_back(f.get<uint64_t>(rng[r], fmt::format("rng[{}]", r), "seed"));
  }
  parse_files(f, j, m);
  if (j.contains("hosts")) {
    const Json& hosts = f.array(j, "", "hosts");
    if (hosts.size() != m.files.size()) {
      f.fail("hosts", fmt::format("lists {} hosts for {} files", hosts.size(), m.files.size()));
    }
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (!hosts[i].is_string()) f.fail(fmt::format("hosts[{}]", i), "is not a host name");
      m.hosts.push_back(hosts[i].get<std::string>());
    }
  }
  return m;
}

namespace {

Json finite_or_null(double x) { return std::isfinite(x) ? Json(x) : Json(); }

}  // namespace

std::string history_to_jsonl(const std::vector<StepHistory>& steps) {
  std::string out;
  for (const StepHistory& s : steps) {
    Json j;
    j["step"] = s.step;
    j["loss"] = finite_or_null(s.loss);
    j["lr"] = finite_or_null(s.lr);
    j["grad_norm"] = finite_or_null(s.grad_norm);
    j["grad_norm_clipped"] = finite_or_null(s.grad_norm_clipped);
    j["loss_scale"] = s.loss_scale ? finite_or_null(*s.loss_scale) : Json();
    j["skipped"] = s.skipped;
    j["tokens"] = s.tokens;
    if (s.val_loss) j["val_loss"] = finite_or_null(*s.val_loss);
    if (s.outer) j["outer"] = true;
    out += j.dump();
    out += '\n';
  }
  return out;
}

std::vector<StepHistory> parse_history(std::string_view text, std::string_view what,
                                       uint64_t last_step) {
  std::vector<StepHistory> out;
  size_t line = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) {
      throw CorruptData(fmt::format("{}: line {} has no newline (truncated)", what, line + 1));
    }
    const std::string_view one = text.substr(at, nl - at);
    at = nl + 1;
    ++line;
    const std::string where = fmt::format("{} line {}", what, line);
    Json j;
    try {
      j = Json::parse(one);
    } catch (const Json::exception& e) {
      throw CorruptData(fmt::format("{}: not JSON: {}", where, e.what()));
    }
    if (!j.is_object()) throw CorruptData(fmt::format("{}: is not a JSON object", where));
    const Fields f(where);
    // null stands for a non-finite value (JSON has none).
    const auto number = [&](std::string_view key) {
      const Json& v = f.at(j, "", key);
      return v.is_null() ? std::nan("") : f.get<double>(j, "", key);
    };
    StepHistory s;
    s.step = f.get<int64_t>(j, "", "step");
    s.loss = number("loss");
    s.lr = number("lr");
    s.grad_norm = number("grad_norm");
    s.grad_norm_clipped = number("grad_norm_clipped");
    if (!f.at(j, "", "loss_scale").is_null()) s.loss_scale = number("loss_scale");
    s.skipped = f.get<bool>(j, "", "skipped");
    s.tokens = f.get<uint64_t>(j, "", "tokens");
    if (j.contains("val_loss")) s.val_loss = number("val_loss");
    if (j.contains("outer")) s.outer = f.get<bool>(j, "", "outer");
    const int64_t expected = out.empty() ? 1 : out.back().step + 1;
    if (out.empty() ? s.step < 1 : s.step != expected) {
      f.fail("step", fmt::format("is {}, expected {}", s.step,
                                 out.empty() ? "1 or more" : std::to_string(expected)));
    }
    out.push_back(s);
  }
  if (!out.empty() && static_cast<uint64_t>(out.back().step) != last_step) {
    throw CorruptData(fmt::format("{}: ends at step {}, the checkpoint is at step {}", what,
                                  out.back().step, last_step));
  }
  return out;
}

void require_regular_file(const std::filesystem::path& path, std::string_view role) {
  const auto kind = files::non_regular_kind(path);
  if (!kind) return;
  std::string via;
  std::error_code ec;
  if (std::filesystem::is_symlink(path, ec)) {
    via = fmt::format(" (a link to '{}')", std::filesystem::read_symlink(path, ec).string());
  }
  throw CorruptData(fmt::format(
      "{} '{}' is {}{}; a checkpoint holds regular files only: restore it from a copy, or "
      "resume from another checkpoint",
      role, path.string(), *kind, via));
}

}  // namespace zerodp::checkpoint
