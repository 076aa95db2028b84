// zerodp export: a sharded checkpoint as one safetensors file of consolidated fp32 weights
// under the model's canonical parameter names (what DeepSpeed's zero_to_fp32 produces), or
// with --format hf as a Hugging Face model directory (config.json and save_pretrained's
// weight files under GPT2LMHeadModel's or LlamaForCausalLM's names), streamed so the process
// holds a few MiB whatever the model's size.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include <fmt/core.h>

#include "checkpoint/consolidate.h"
#include "checkpoint/hf_export.h"
#include "commands.h"
#include "core/error.h"
#include "core/files.h"
#include "core/sha256.h"
#include "core/units.h"
#include "tensor/dtype.h"
#include "tokenizer/tokenizer.h"
#include "train/hf_layout.h"
#include "train/model_kind.h"

namespace zerodp::cli {

namespace {

struct Flags {
  std::string checkpoint;
  std::string out;
  std::string format = "zerodp";
  std::optional<std::string> dtype;
  std::optional<std::string> max_shard_size;
  std::string tokenizer;
  bool quiet = false;
};

// --tokenizer: its bytes for tokenizer.model, and the ids config.json names.
struct ExportTokenizer {
  std::string bytes;
  int32_t vocab = 0, bos = -1, eos = -1;
  std::string path;
};

ExportTokenizer read_export_tokenizer(const std::string& path) {
  if (path.empty()) return {};
  const tokenizer::Tokenizer tok(path);
  ExportTokenizer t{.bytes = {},
                    .vocab = tok.vocab_size(),
                    .bos = tok.bos_id(),
                    .eos = tok.eos_id(),
                    .path = path};
  files::read_in_chunks("--tokenizer", path, [&](std::span<const std::byte> b) {
    t.bytes.append(reinterpret_cast<const char*>(b.data()), b.size());
  });
  if (sha256_hex(t.bytes) != tok.sha256()) {
    throw IoError(fmt::format("--tokenizer '{}' changed while it was read; export again", path));
  }
  return t;
}

// HF's names, orientation and config.json (train/hf_layout.h) for the checkpoint library.
checkpoint::HfLayout hf_layout(const std::string& ckpt, const ExportTokenizer& tok) {
  checkpoint::HfLayout l;
  l.tensor = [](const std::string& kind, const std::string& name) {
    hf::HfTensor t = hf::export_tensor(kind, name);
    return checkpoint::HfName{std::move(t.name), t.transposed};
  };
  l.config = [ckpt, tok](const std::string& kind, const ShapeFields& shape,
                         std::string_view torch_dtype) {
    if (!hf::has_layout(kind)) {
      std::string with;
      for (const ModelKind& k : model_kinds()) {
        if (hf::has_layout(k.name)) with += fmt::format("{}{}", with.empty() ? "" : ", ", k.name);
      }
      throw InvalidArgument(fmt::format(
          "--format hf: checkpoint '{}' holds a model of kind {}, which has no Hugging Face "
          "layout (the kinds with one: {}); export it with --format zerodp",
          ckpt, kind, with));
    }
    nlohmann::json config = hf::config_json(kind, shape, torch_dtype);
    if (!tok.path.empty()) {
      const auto vocab = shape.find("vocab");
      if (vocab != shape.end() && tok.vocab > vocab->second) {
        throw InvalidArgument(fmt::format(
            "--tokenizer '{}' has {} ids, more than the vocabulary of {} that checkpoint '{}' "
            "was trained with; give the tokenizer it was trained with",
            tok.path, tok.vocab, vocab->second, ckpt));
      }
      const auto id = [](int32_t v) { return v < 0 ? nlohmann::json() : nlohmann::json(v); };
      config["bos_token_id"] = id(tok.bos);
      config["eos_token_id"] = id(tok.eos);
    }
    return config.dump(2) + "\n";
  };
  return l;
}

checkpoint::HfDtype hf_dtype(const std::optional<std::string>& text) {
  if (!text) return checkpoint::HfDtype::kF32;
  const std::optional<DType> d = parse_dtype(*text);
  if (d == DType::kF32) return checkpoint::HfDtype::kF32;
  if (d == DType::kBF16) return checkpoint::HfDtype::kBF16;
  throw InvalidArgument(fmt::format("--dtype '{}' is unknown here; use f32 or bf16", *text));
}

int run_hf(const Flags& f) {
  checkpoint::HfExportOptions o;
  o.dtype = hf_dtype(f.dtype);
  ExportTokenizer tok = read_export_tokenizer(f.tokenizer);
  if (f.max_shard_size) o.max_shard_bytes = parse_bytes(*f.max_shard_size, "--max-shard-size");
  const checkpoint::HfLayout layout = hf_layout(f.checkpoint, tok);
  o.tokenizer_model = std::move(tok.bytes);
  const auto s = checkpoint::export_hf(f.checkpoint, f.out, layout, o, checkpoint_model_layout);
  if (f.quiet) return 0;
  std::string files = s.weight_files.size() == 1
                          ? s.weight_files.front()
                          : fmt::format("{} .. {}", s.weight_files.front(), s.weight_files.back());
  if (s.indexed) files += ", model.safetensors.index.json";
  if (!f.tokenizer.empty()) files += ", tokenizer.model";
  fmt::print(stderr,
             "zerodp export: {} {} tensors, {} to {}: {}, config.json (held at most {} in "
             "memory)\n",
             s.tensors, o.dtype == checkpoint::HfDtype::kBF16 ? "BF16" : "F32",
             format_bytes(static_cast<double>(s.bytes)), f.out, files,
             format_bytes(static_cast<double>(s.buffer_bytes)));
  if (s.removed > 0) {
    fmt::print(stderr, "zerodp export: removed {} file{} of the earlier export in {}\n", s.removed,
               s.removed == 1 ? "" : "s", f.out);
  }
  return 0;
}

int run_zerodp(const Flags& f) {
  // Its one F32 file is what --init-from takes back bit for bit (docs/interop.md); bf16 is
  // a Hugging Face export's option, where loaders expect it.
  if (f.dtype && hf_dtype(f.dtype) != checkpoint::HfDtype::kF32) {
    throw InvalidArgument(fmt::format(
        "--dtype {}: --format zerodp writes F32 only (the fp32 master exactly, so "
        "train --init-from gets the checkpoint's weights back bit for bit); for bf16 weights "
        "use --format hf --dtype bf16",
        *f.dtype));
  }
  if (f.max_shard_size) {
    throw InvalidArgument(
        "--max-shard-size: --format zerodp writes one file, which nothing splits; shards are "
        "a Hugging Face export's (--format hf)");
  }
  if (!f.tokenizer.empty()) {
    throw InvalidArgument(
        "--tokenizer: --format zerodp writes the weights alone; the tokenizer goes with a "
        "Hugging Face export (--format hf), or give it to zerodp sample --tokenizer");
  }
  const auto s =
      checkpoint::export_fp32(f.checkpoint, f.out, uint64_t{1} << 20, checkpoint_model_layout);
  if (!f.quiet) {
    fmt::print(stderr, "zerodp export: {} tensors, {} to {} (held at most {} in memory)\n",
               s.tensors, format_bytes(static_cast<double>(s.bytes)), f.out,
               format_bytes(static_cast<double>(s.buffer_bytes)));
  }
  return 0;
}

}  // namespace

Runner add_export(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  app.add_option("CHECKPOINT", f->checkpoint,
                 "A step directory (DIR/step_NNNNNNNN) or a checkpoint dir (its latest)")
      ->required();
  app.add_option("--out", f->out,
                 "The safetensors file to write (--format hf: the directory to write)")
      ->required();
  app.add_option("--format", f->format,
                 "zerodp: one F32 safetensors file under zerodp's names (default); hf: a Hugging "
                 "Face model directory (config.json, model*.safetensors)");
  app.add_option("--dtype", f->dtype,
                 "--format hf: f32 (default) or bf16 (rounded to nearest even from the fp32 "
                 "master)");
  app.add_option("--max-shard-size", f->max_shard_size,
                 "--format hf: the most tensor bytes in one weight file, e.g. 5GB (default), "
                 "500MB, 2GiB; more than that is split into model-0000i-of-0000N.safetensors "
                 "with model.safetensors.index.json");
  app.add_option("--tokenizer", f->tokenizer,
                 "--format hf: the SentencePiece .model the checkpoint was trained with, written "
                 "as tokenizer.model (where LlamaTokenizer and zerodp sample find it); its bos "
                 "and eos ids go into config.json");
  app.add_flag("--quiet", f->quiet, "Print nothing on success");
  app.footer(
      "--format zerodp: one F32 tensor per parameter (e.g. h.0.attn.c_attn.weight), loadable by\n"
      "any safetensors reader and by the PyTorch peer's GPT (docs/interop.md).\n"
      "--format hf: a model directory in save_pretrained's layout: the gpt as GPT2LMHeadModel, "
      "the\n"
      "llama as LlamaForCausalLM. It is created if missing; an existing one may hold only an "
      "earlier\n"
      "Hugging Face export's files (replaced; those this export does not write are removed),\n"
      "anything else in it is refused.\n"
      "Examples:\n"
      "  zerodp export ckpt --out model.safetensors          # the newest checkpoint in ckpt/\n"
      "  zerodp export ckpt/step_00000200 --out model.safetensors\n"
      "  zerodp export ckpt --format hf --out hf-model --dtype bf16 --max-shard-size 2GB\n"
      "  zerodp export ckpt --format hf --out hf-model --tokenizer kjv8k.model\n"
      "  zerodp sample model.safetensors --prompt 'In the beginning'");
  return [f](Launch) {
    if (f->format == "hf") return run_hf(*f);
    if (f->format == "zerodp") return run_zerodp(*f);
    throw InvalidArgument(
        fmt::format("--format '{}' is unknown; use zerodp (one F32 file, the default) or hf (a "
                    "Hugging Face model directory)",
                    f->format));
  };
}

}  // namespace zerodp::cli
