// The llama's shape options (docs/llama.md), a part of the option table (options.h).
#include <string>

#include <fmt/core.h>

#include "core/error.h"
#include "train/option_readers.h"
#include "train/options.h"

namespace zerodp {
namespace {

constexpr std::string_view kModel = "Model";

using namespace option_readers;

const OptionSpec kLlamaOptions[] = {
    {.key = "kv_heads",
     .section = kModel,
     .help = "llama key/value heads, dividing --heads (grouped-query attention; train: overrides "
             "the preset)",
     .commands = kBoth,
     .advice = "use a number of heads that divides --heads (omit it for the preset's)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.kv_heads = shape(t, o); },
     .idle = llama_shape,
     .quote = [](const TrainConfig& c) { return std::to_string(c.kv_heads); }},
    {.key = "ffn_hidden",
     .section = kModel,
     .help = "llama SwiGLU hidden units (default: 8/3 of --embd, rounded up as docs/llama.md "
             "says)",
     .commands = kBoth,
     .advice = "use 1 or more (omit it for the rule's)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.ffn_hidden = shape(t, o); },
     .idle = llama_shape,
     .quote = [](const TrainConfig& c) { return std::to_string(c.ffn_hidden); }},
    {.key = "rope_theta",
     .section = kModel,
     .help = "llama rotary base, a whole number (default 10000)",
     .commands = kBoth,
     .advice = "use a whole number from 2 to 2147483647, e.g. 10000 or 500000",
     .type = "INT",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.rope_theta = whole<int>(t, o);
           if (c.rope_theta < 2) o.refuse(t);
         },
     .idle = llama_shape,
     .quote = [](const TrainConfig& c) { return std::to_string(c.rope_theta); }},
    {.key = "norm_eps",
     .section = kModel,
     .help = "llama RMSNorm eps (default 1e-05)",
     .commands = kBoth,
     .advice = "use a number above 0 and at most 1, e.g. 1e-5 or 1e-6",
     .type = "NUMBER",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.norm_eps = static_cast<float>(finite(t, o, 0, true, 1)); },
     .idle = llama_shape,
     .quote = [](const TrainConfig& c) { return fmt::format("{:g}", c.norm_eps); }},
    {.key = "head",
     .section = kModel,
     .help = "llama head: untied (its own weights) or tied (the embedding's, not built yet)",
     .commands = kBoth,
     .advice = "use untied",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           if (t == "tied") {
             throw InvalidArgument(
                 "--head tied is not built yet: a unit owns one flat buffer and the embedding and "
                 "the head are different units, so sharing a weight between them needs a tie "
                 "the engine does not have; use --head untied (Llama-2's and TinyLlama's head is "
                 "untied)");
           }
           if (t != "untied") o.refuse(t);
           c.head = t;
         }},
};

}  // namespace

std::span<const OptionSpec> llama_option_table() { return kLlamaOptions; }

}  // namespace zerodp
