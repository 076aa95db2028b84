// The one table of options: every recorded option reads back what it records (a report's
// "config" fed back through --config is the run it describes), the report's keys are the
// table's, and each option's rule holds however the value was set.
#include <gtest/gtest.h>

#include "core/error.h"
#include "train/options.h"

namespace zerodp {
namespace {

// A resolved configuration far from the defaults.
TrainConfig unusual() {
  TrainConfig c;
  c.model = "gpt";
  c.size = "tiny";
  c.data = "synthetic";
  c.launch.ranks = 4;
  c.launch.ranks_per_process = 2;
  c.launch.backend = Backend::kMpi;
  c.launch.comm.node_ranks = 2;
  c.launch.comm.link_bandwidth = 2.5e9;
  c.launch.comm.inter_node_latency = 5e-5;
  c.launch.comm.timeout_seconds = 30;
  c.launch.comm.check_collectives = false;
  c.launch.comm.qgz_bits = 4;
  c.launch.comm.qgz_block = 77;
  c.stage = 3;
  c.precision = Precision::kFP16;
  c.micro_batch = 3;
  c.grad_accum = 5;
  c.accumulate = AccumulatePolicy::kReduce;
  c.hpz = true;
  c.prefetch = 4;
  c.offload = Offload::kParams;
  c.offload_piece = 4096;
  c.memory_per_rank = 123456789;
  c.steps = 77;
  c.seed = 18446744073709551615u;
  c.lr = 3e-4f;
  c.schedule = "constant";
  c.warmup = 9;
  c.clip = 0.5f;
  c.weight_decay = 0;
  c.decay_all = true;
  c.eval_every = 4;
  c.checkpoint_dir = "ck";
  c.checkpoint_every = 2;
  c.keep = 3;
  c.trace_path = "t.json";
  return c;
}

TEST(OptionTable, EveryRecordedValueReadsBackToItself) {
  const TrainConfig c = unusual();
  int checked = 0;
  for (const OptionSpec& o : option_table()) {
    if (o.record == nullptr || o.read == nullptr) continue;
    const nlohmann::json v = o.record(c);
    if (v.is_null()) continue;
    TrainConfig d;
    if (o.form == OptionSpec::Form::kSwitch) {
      if (!v.get<bool>()) continue;
      o.read(d, "true", o);
    } else {
      o.read(d,
             v.is_string()    ? v.get<std::string>()
             : v.is_boolean() ? (v.get<bool>() ? "true" : "false")
                              : v.dump(),
             o);
    }
    if (o.key == "invariant") d.accumulate = c.accumulate;  // recorded as the order it gives
    EXPECT_EQ(o.record(d), v) << o.flag();
    ++checked;
  }
  EXPECT_GE(checked, 40);
}

TEST(OptionTable, TheReportsKeysAreTheTablesRecordedOptions) {
  TrainConfig c = unusual();
  const nlohmann::json j = config_json(c);
  for (const OptionSpec& o : option_table()) {
    EXPECT_EQ(j.contains(std::string(o.key)),
              o.record != nullptr || o.key == "size" || o.key == "layers" || o.key == "heads" ||
                  o.key == "embd" || o.key == "seq_len" || o.key == "vocab")
        << o.key;
  }
  // Each key is a flag of train, or the engine's one recorded-only choice.
  for (const auto& [key, value] : j.items()) {
    bool known = key == "min_lr_ratio";
    for (const OptionSpec& o : option_table()) known = known || o.key == key;
    EXPECT_TRUE(known) << key;
  }
}

TEST(OptionTable, RulesHoldForValuesSetInCode) {
  TrainConfig valid;
  valid.micro_batch = 1;  // resolved from the preset
  EXPECT_NO_THROW(check_option_values(valid));
  const auto refused = [&](auto set, const std::string& words) {
    TrainConfig c = valid;
    set(c);
    try {
      check_option_values(c);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused([](TrainConfig& c) { c.steps = -1; }, "--steps -1 is invalid; use 0 or more");
  refused([](TrainConfig& c) { c.prefetch = 9; }, "--prefetch 9 is invalid; use 0..8");
  refused([](TrainConfig& c) { c.memory_per_rank = 0; }, "--memory-per-rank 0 is invalid");
  refused([](TrainConfig& c) { c.offload_piece = 1000; }, "not a multiple of 1024");
  refused([](TrainConfig& c) { c.stage = 4; }, "--stage 4 is not a ZeRO stage");
  refused([](TrainConfig& c) { c.launch.ranks = 0; }, "--ranks 0 is invalid");
  // estimate checks only what it takes: --steps is train's alone.
  TrainConfig c = valid;
  c.steps = -1;
  EXPECT_NO_THROW(check_option_values(c, kEstimateCommand));
}

TEST(OptionTable, TextIsReadWholeOrRefusedNamingIt) {
  TrainConfig c;
  const auto refuses = [&](std::string_view key, const std::string& text) {
    const OptionSpec& o = option_spec(key);
    try {
      o.read(c, text, o);
      ADD_FAILURE() << o.flag() << " took " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(o.flag()), std::string::npos) << e.what();
    }
  };
  refuses("steps", "12x");
  refuses("keep", "4294967297");   // past int: never 1
  refuses("offload_piece", "-1");  // never 2^64 - 1
  refuses("qwz_block", "0");
  refuses("micro_batch", "0");
  refuses("grad_accum", "0");  // 0 is "derive it", never the user's
  refuses("warmup", "-1");
  refuses("check_collectives", "maybe");
  refuses("lr", "inf");
  EXPECT_THROW(option_spec("no_such_option"), std::logic_error);
}

}  // namespace
}  // namespace zerodp
