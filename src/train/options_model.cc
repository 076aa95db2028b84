// The model's shape and the data it trains on, a part of the option table (options.h).
#include <string>

#include "train/option_readers.h"
#include "train/options.h"

namespace zerodp {
namespace {

using nlohmann::json;
using Form = OptionSpec::Form;
using namespace option_readers;

constexpr std::string_view kModel = "Model", kData = "Data";
// 2^24 rows: past any vocabulary trained today (256k), and V x C stays far inside a size_t.
constexpr int kMaxVocab = 1 << 24;

const OptionSpec kModelOptions[] = {
    // Model.
    {.key = "model",
     .section = kModel,
     .help = "gpt (GPT-2's shape), llama (RMSNorm, RoPE, SwiGLU, grouped-query attention) or mlp "
             "(Fashion-MNIST)",
     .commands = kBoth,
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.model = t; },
     .record = [](const TrainConfig& c) -> json { return c.model; }},
    {.key = "size",
     .section = kModel,
     .help = "gpt or llama preset: tiny, small (the default), medium, large; llama also 1.1b "
             "(TinyLlama's shape, docs/llama.md)",
     .commands = kBoth,
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.size = t; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.model != "mlp",
                         "it picks a gpt or llama preset; use --model gpt or llama");
         },
     .quote = [](const TrainConfig& c) { return c.size; }},
    {.key = "layers",
     .section = kModel,
     .help = "transformer blocks (train: overrides the --size preset)",
     .commands = kBoth,
     .advice = "use 1 or more (omit it for the --size preset's)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.layers = shape(t, o); },
     .idle = transformer_shape,
     .quote = [](const TrainConfig& c) { return std::to_string(c.layers); }},
    {.key = "heads",
     .section = kModel,
     .help = "attention (query) heads (train: overrides the preset)",
     .commands = kBoth,
     .advice = "use 1 or more (omit it for the --size preset's)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.heads = shape(t, o); },
     .idle = transformer_shape,
     .quote = [](const TrainConfig& c) { return std::to_string(c.heads); }},
    {.key = "embd",
     .section = kModel,
     .help = "embedding width (train: overrides the preset)",
     .commands = kBoth,
     .advice = "use 1 or more (omit it for the --size preset's)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.embd = shape(t, o); },
     .idle = transformer_shape,
     .quote = [](const TrainConfig& c) { return std::to_string(c.embd); }},
    {.key = "seq_len",
     .section = kModel,
     .help = "context length (train: overrides the preset)",
     .commands = kBoth,
     .advice = "use 1 or more (omit it for the --size preset's)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.seq_len = shape(t, o); },
     .idle = transformer_shape,
     .quote = [](const TrainConfig& c) { return std::to_string(c.seq_len); }},
    {.key = "vocab",
     .section = kModel,
     .help = "vocabulary: the embedding's and the head's rows, at least the data's largest "
             "token + 1 (default: the preset's, 256 bytes but for llama 1.1b's 32000)",
     .commands = kBoth,
     .advice = "use 2 to 16777216 (omit it for the preset's)",
     .type = "INT",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.vocab = whole<int>(t, o);
           if (c.vocab < 2 || c.vocab > kMaxVocab) o.refuse(t);
         },
     .idle = transformer_shape,
     .quote = [](const TrainConfig& c) { return std::to_string(c.vocab); }},
    {.key = "mlp_hidden",
     .section = kModel,
     .help = "MLP hidden width",
     .advice = "use a width, 1 or more",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.mlp_hidden = whole<int>(t, o); },
     .idle = mlp_shape,
     .quote = [](const TrainConfig& c) { return std::to_string(c.mlp_hidden); }},
    {.key = "mlp_layers",
     .section = kModel,
     .help = "MLP hidden layers",
     .advice = "use 0 or more",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.mlp_layers = whole<int>(t, o); },
     .idle = mlp_shape,
     .quote = [](const TrainConfig& c) { return std::to_string(c.mlp_layers); }},
    // Data.
    {.key = "data",
     .section = kData,
     .help = "kjv, fashion-mnist, synthetic, a text file PATH, or a DIR of token shards "
             "(zerodp prepare's or llm.c's)",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.data = t; },
     .record = [](const TrainConfig& c) -> json { return c.data; }},
    {.key = "tokenizer",
     .section = kData,
     .help = "A SentencePiece .model that encodes --data's text (kjv or a file) into tokens "
             "as the run starts; the vocabulary is the tokenizer's unless --vocab is given",
     .type = "FILE",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.tokenizer = t; },
     .record = [](const TrainConfig& c) -> json { return c.tokenizer; }},
    {.key = "cache_dir",
     .section = kData,
     .help = "Where prepared data is cached (default ~/.cache/zerodp)",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.cache_dir = t; }},
};

}  // namespace

std::span<const OptionSpec> model_option_table() { return kModelOptions; }

}  // namespace zerodp
