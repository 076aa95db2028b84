// DiLoCo's options (docs/diloco.md), a part of the option table (options.h).
#include <string>

#include <fmt/core.h>

#include "train/option_readers.h"
#include "train/options.h"

namespace zerodp {
namespace {

using nlohmann::json;

constexpr std::string_view kParallelism = "Parallelism";
constexpr int kMaxFragments = 1000000;

using namespace option_readers;

const OptionSpec kIslandOptions[] = {
    {.key = "islands",
     .section = kParallelism,
     .help = "DiLoCo: split the ranks into this many islands of consecutive ranks (each a node "
             "unless --node-ranks says otherwise), each training on its own data at --stage "
             "over its ranks; they meet only every --outer-every steps to average what they "
             "learned (docs/diloco.md). 1 = off",
     .commands = kBoth,
     .advice = "use the number of islands, 1 or more, dividing --ranks",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.islands = whole<int>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.islands, 1, o); },
     .record = [](const TrainConfig& c) -> json { return c.islands; }},
    {.key = "islands_in_turn",
     .section = kParallelism,
     .help = "DiLoCo: run every island in turn on all the ranks, each rank holding every "
             "island's states, instead of each island on ranks of its own: a cluster's run, "
             "bit for bit, on fewer ranks (--islands; docs/diloco.md)",
     .commands = kBoth,
     .form = OptionSpec::Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&,
                const OptionSpec&) { c.islands_in_turn = true; },
     .record = [](const TrainConfig& c) -> json { return c.islands_in_turn; }},
    {.key = "outer_every",
     .section = kParallelism,
     .help = "DiLoCo's H: inner steps between two outer steps (--islands)",
     .commands = kBoth,
     .advice = "use a number of steps, 1 or more, e.g. 50",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.outer_every = whole<int64_t>(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { at_least<int64_t>(c.outer_every, 1, o); },
     .record = [](const TrainConfig& c) -> json { return c.outer_every; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.islands > 1, "it spaces DiLoCo's outer steps; add --islands K");
         }},
    {.key = "outer_lr",
     .section = kParallelism,
     .help = "DiLoCo's outer learning rate: the Nesterov step on the averaged pseudo-gradient "
             "(--islands)",
     .advice = "use a positive number, e.g. 0.7",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.outer_lr = static_cast<float>(finite(t, o, 0, true)); },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (!(c.outer_lr > 0) || !std::isfinite(c.outer_lr))
             o.refuse(fmt::format("{}", c.outer_lr));
         },
     .record = [](const TrainConfig& c) -> json { return c.outer_lr; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.islands > 1, "it sizes DiLoCo's outer step; add --islands K");
         }},
    {.key = "outer_momentum",
     .section = kParallelism,
     .help = "DiLoCo's outer Nesterov momentum, 0 (plain averaging when --outer-lr is 1) to "
             "below 1 (--islands)",
     .advice = "use a number in [0, 1), e.g. 0.9",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.outer_momentum = static_cast<float>(finite(t, o, 0, false, 1));
           if (!(c.outer_momentum < 1)) o.refuse(t);
         },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (!(c.outer_momentum >= 0 && c.outer_momentum < 1))
             o.refuse(fmt::format("{}", c.outer_momentum));
         },
     .record = [](const TrainConfig& c) -> json { return c.outer_momentum; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.islands > 1, "it is DiLoCo's outer momentum; add --islands K");
         }},
    {.key = "fragments",
     .section = kParallelism,
     .help = "Streaming DiLoCo: sync the parameters in this many equal fragments, one every "
             "--outer-every / F steps, so each exchange moves 1/F of the bytes (--islands; "
             "1 to 1000000, each fragment at least one parameter)",
     .commands = kBoth,
     .advice = "use a number of fragments from 1 to 1000000 dividing --outer-every, e.g. 4",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.fragments = whole<int>(t, o); },
     // Planning a round visits every fragment: a million keeps it under a second, and
     // Streaming DiLoCo's own runs use a handful (4 to 100).
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           at_least(c.fragments, 1, o);
           if (c.fragments > kMaxFragments) o.refuse(std::to_string(c.fragments));
         },
     .record = [](const TrainConfig& c) -> json { return c.fragments; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.islands > 1, "it streams DiLoCo's outer steps; add --islands K");
         }},
    {.key = "outer_delay",
     .section = kParallelism,
     .help = "Streaming DiLoCo: merge each fragment's exchange this many inner steps after "
             "it starts, overlapping it with them (0 = wait for it; below --outer-every / "
             "--fragments)",
     .commands = kBoth,
     .advice = "use a number of steps, 0 or more, below --outer-every / --fragments",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.outer_delay = whole<int64_t>(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { at_least<int64_t>(c.outer_delay, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.outer_delay; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.islands > 1, "it delays DiLoCo's merges; add --islands K");
         }},
    {.key = "outer_mix",
     .section = kParallelism,
     .help = "Streaming DiLoCo: at a delayed merge, the global weights' share against the "
             "island's own, which trained on meanwhile (--outer-delay)",
     .advice = "use a number in (0, 1], e.g. 0.5",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.outer_mix = static_cast<float>(finite(t, o, 0, true, 1));
         },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (!(c.outer_mix > 0 && c.outer_mix <= 1)) o.refuse(fmt::format("{}", c.outer_mix));
         },
     .record = [](const TrainConfig& c) -> json { return c.outer_mix; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.islands > 1 && c.outer_delay > 0,
                         "it weighs a delayed merge, and merges wait for their exchange; add "
                         "--islands K and --outer-delay D");
         }},
    {.key = "outer_quant",
     .section = kParallelism,
     .help = "DiLoCo: send the outer gradients across islands as int8 or int4 blocks of 256 "
             "elements with an fp32 scale each (Streaming DiLoCo's 4-bit exchange), folded in "
             "fp32; off, int8 or int4 (--islands)",
     .commands = kBoth,
     .advice = "use off, int8 or int4",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           if (t == "off") {
             c.outer_quant = 0;
           } else if (t == "int8") {
             c.outer_quant = 8;
           } else if (t == "int4") {
             c.outer_quant = 4;
           } else {
             o.refuse(t);
           }
         },
     .record = [](const TrainConfig& c) -> json { return qgz_name(c.outer_quant); },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.islands > 1, "it quantizes DiLoCo's outer gradients; add --islands K");
         }},
};

}  // namespace

std::span<const OptionSpec> island_option_table() { return kIslandOptions; }

}  // namespace zerodp
