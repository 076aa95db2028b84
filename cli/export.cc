// zerodp export: a sharded checkpoint as one safetensors file of consolidated fp32 weights
// under the model's canonical parameter names (what DeepSpeed's zero_to_fp32 produces),
// streamed so the process holds a few MiB whatever the model's size.
#include <memory>

#include <fmt/core.h>

#include "checkpoint/consolidate.h"
#include "commands.h"
#include "core/error.h"
#include "core/units.h"
#include "train/model_kind.h"

namespace zerodp::cli {

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
