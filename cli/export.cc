// zerodp export: a sharded checkpoint as one safetensors file of consolidated fp32 weights
// under the model's canonical parameter names (what DeepSpeed's zero_to_fp32 produces),
// streamed so the process holds a few MiB whatever the model's size.
#include <limits>
#include <memory>

#include <fmt/core.h>

#include "checkpoint/consolidate.h"
#include "commands.h"
#include "core/error.h"
#include "core/units.h"
#include "models/gpt.h"
#include "models/mlp.h"

namespace zerodp::cli {

std::optional<std::vector<checkpoint::UnitMeta>> checkpoint_model_layout(const checkpoint::Meta& m,
                                                                         const std::string& what) {
  const auto field = [&](const char* key) {
    const auto it = m.model_shape.find(key);
    if (it == m.model_shape.end()) {
      throw CorruptData(
          fmt::format("{}: field \"model.{}\" is missing; a {} has one", what, key, m.model_kind));
    }
    if (it->second < 0 || it->second > std::numeric_limits<int>::max()) {
      throw CorruptData(fmt::format("{}: field \"model.{}\" is {}; expected 0..{}", what, key,
                                    it->second, std::numeric_limits<int>::max()));
    }
    return static_cast<int>(it->second);
  };
  // The unit count is checked before the model is built: a hostile layer count would
  // otherwise build that many units.
  const auto units_for = [&](const char* key, int layers, uint64_t units, const char* which) {
    if (units != m.units.size()) {
      throw CorruptData(fmt::format(
          "{}: field \"model.{}\" is {}, but field \"units\" lists {} units; a {} with {} {} has "
          "{} {}",
          what, key, layers, m.units.size(), m.model_kind, layers, key, units, which));
    }
  };
  try {
    if (m.model_kind == "gpt") {
      const GptConfig c{.layers = field("layers"),
                        .heads = field("heads"),
                        .embd = field("embd"),
                        .seq_len = field("seq_len"),
                        .vocab = field("vocab")};
      units_for("layers", c.layers, uint64_t(c.layers) + 2, "(embedding, h.0.., head)");
      if (c.heads > 0 && c.embd % c.heads != 0) {
        throw CorruptData(fmt::format(
            "{}: field \"model.heads\" is {}; it does not divide field \"model.embd\" ({})", what,
            c.heads, c.embd));
      }
      return checkpoint::describe_units(make_gpt(c));
    }
    if (m.model_kind == "mlp") {
      MlpConfig c;
      c.hidden = field("hidden");
      c.hidden_layers = field("hidden_layers");
      units_for("hidden_layers", c.hidden_layers, uint64_t(c.hidden_layers) + 1,
                "(hidden.., head)");
      return checkpoint::describe_units(make_mlp(c));
    }
  } catch (const InvalidArgument& e) {
    throw CorruptData(
        fmt::format("{}: field \"model\" describes no valid {}: {}", what, m.model_kind, e.what()));
  }
  return std::nullopt;  // a model the caller built itself (tests): checked against itself only
}

namespace {

struct Flags {
  std::string checkpoint;
  std::string out;
  bool quiet = false;
};

}  // namespace

Runner add_export(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  app.add_option("CHECKPOINT", f->checkpoint,
                 "A step directory (DIR/step_NNNNNNNN) or a checkpoint dir (its latest)")
      ->required();
  app.add_option("--out", f->out, "The safetensors file to write")->required();
  app.add_flag("--quiet", f->quiet, "Print nothing on success");
  app.footer(
      "The file holds one F32 tensor per parameter (e.g. h.0.attn.c_attn.weight), loadable by\n"
      "any safetensors reader and by the PyTorch peer's GPT (docs/interop.md).\n"
      "Examples:\n"
      "  zerodp export ckpt --out model.safetensors          # the newest checkpoint in ckpt/\n"
      "  zerodp export ckpt/step_00000200 --out model.safetensors\n"
      "  zerodp sample model.safetensors --prompt 'In the beginning'");
  return [f](Launch) {
    const auto s =
        checkpoint::export_fp32(f->checkpoint, f->out, uint64_t{1} << 20, checkpoint_model_layout);
    if (!f->quiet) {
      fmt::print(stderr, "zerodp export: {} tensors, {} to {} (held at most {} in memory)\n",
                 s.tensors, format_bytes(static_cast<double>(s.bytes)), f->out,
                 format_bytes(static_cast<double>(s.buffer_bytes)));
    }
    return 0;
  };
}

}  // namespace zerodp::cli
