// The rules between options and with the world, each written once: train and estimate refuse
// a run for the same reason in the same words, estimate at the stages it sweeps, and a world
// rule reads the same wherever the world became known.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/world_shape.h"
#include "core/error.h"
#include "train/config.h"
#include "train/options.h"
#include "train/run_check.h"

namespace zerodp {
namespace {

template <typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

// A run as a command line gives it: resolved defaults, nothing but `keys` given.
TrainConfig given(std::initializer_list<const char*> keys) {
  TrainConfig c;
  c.micro_batch = 1;
  c.grad_accum = 1;
  c.given.emplace();
  for (const char* k : keys) c.given->insert(k);
  return c;
}

TEST(WorldCheck, EachShapeRuleHasOneTextNamingTheWorldAsTheUserDid) {
  TrainConfig c;
  c.launch.comm.node_ranks = 4;
  EXPECT_EQ(message_of([&] { check_world(c, 6, WorldNamed::kRanks); }),
            "--node-ranks 4 does not divide --ranks 6: a world is whole nodes; use a divisor of 6");
  EXPECT_EQ(message_of([&] { check_world(c, 6, WorldNamed::kRanksList); }),
            "--node-ranks 4 does not divide --ranks 6: a world is whole nodes; use rank counts "
            "that are multiples of it");
  EXPECT_EQ(message_of([&] { check_world(c, 6, WorldNamed::kLaunched); }),
            "--node-ranks 4 does not divide the world of 6 ranks: a world is whole nodes; launch "
            "a multiple of 4 ranks, or use a divisor of 6");
  // The communicator's own refusal is the same sentence (comm/world_shape.h).
  EXPECT_EQ(message_of([&] { check_whole_nodes(4, 6, WorldNamed::kLaunched); }),
            message_of([&] { check_world(c, 6, WorldNamed::kLaunched); }));
  TrainConfig isl;
  isl.islands = 4;
  EXPECT_EQ(message_of([&] { check_world(isl, 6, WorldNamed::kRanks); }),
            "--islands 4 does not divide --ranks 6: every island has as many ranks; use a "
            "divisor of 6");
  EXPECT_EQ(message_of([&] { check_world(isl, 6, WorldNamed::kLaunched); }),
            "--islands 4 does not divide the world of 6 ranks: every island has as many ranks; "
            "launch a multiple of 4 ranks, or use a divisor of 6");
  // The planner asks the same rule.
  EXPECT_EQ(message_of([&] { check_island_world(isl, 6, WorldNamed::kLaunched); }),
            message_of([&] { check_world(isl, 6, WorldNamed::kLaunched); }));
  isl.islands_in_turn = true;  // every island on all the ranks: any world
  EXPECT_EQ(message_of([&] { check_world(isl, 6, WorldNamed::kRanks); }), "(accepted)");
}

TEST(WorldCheck, IslandsAreWholeNodesOrAPartOfOne) {
  TrainConfig c;
  c.islands = 2;
  c.launch.comm.node_ranks = 4;
  EXPECT_NE(message_of([&] { check_world(c, 12, WorldNamed::kRanksList); })
                .find("--islands 2 of 6 ranks each and --node-ranks 4: an island must be whole "
                      "nodes or a part of one"),
            std::string::npos);
  c.launch.comm.node_ranks = 3;
  EXPECT_EQ(message_of([&] { check_world(c, 12, WorldNamed::kRanksList); }), "(accepted)");
}

TEST(WorldCheck, AnInjectionNamesARankOfTheWorld) {
  TrainConfig c;
  c.inject = {parse_injection("throw@2:5")};
  EXPECT_EQ(message_of([&] { check_world(c, 2, WorldNamed::kLaunched); }),
            "--inject at rank 5: the run has ranks 0..1");
  EXPECT_EQ(message_of([&] { check_world(c, 6, WorldNamed::kLaunched); }), "(accepted)");
}

TEST(WorldCheck, ProcessRanksShareANodeUnlessOneProcessIsTheJob) {
  const std::string split =
      "--ranks-per-process 4 does not divide --node-ranks 2: a process's ranks must share a node "
      "(or be the whole job); use a divisor of 2";
  // Before the launch the job's processes are unknown: the divide rule waits for it.
  EXPECT_EQ(message_of([] { check_process_ranks(4, true, 2, 0); }), "(accepted)");
  EXPECT_EQ(message_of([] { check_process_ranks(4, true, 2, 3); }), split);
  EXPECT_EQ(message_of([] { check_process_ranks(4, true, 2, 1); }), "(accepted)");
  EXPECT_EQ(message_of([] { check_process_ranks(2, true, 4, 3); }), "(accepted)");
  EXPECT_EQ(message_of([] { check_process_ranks(0, true, 0, 0); }),
            "--ranks-per-process 0 is invalid; use 1 or more rank threads per MPI process");
  EXPECT_EQ(message_of([] { check_process_ranks(2, false, 0, 0); }),
            "--ranks-per-process 2 is for --backend mpi; the local backend already runs every "
            "rank as a thread of one process (use --ranks)");
  // train's check before the launch is the same rule.
  TrainConfig c = given({});
  c.launch.ranks_per_process = 2;
  EXPECT_EQ(message_of([&] { check_run(c); }),
            message_of([] { check_process_ranks(2, false, 0, 0); }));
}

TEST(WorldCheck, AdviceNamesOnlyTheWorldsTheRuleTakes) {
  TrainConfig c;
  c.islands = 2;
  c.launch.comm.node_ranks = 4;
  EXPECT_TRUE(launchable(c, 8));
  EXPECT_TRUE(launchable(c, 4));    // two islands of 2 share a node of 4
  EXPECT_FALSE(launchable(c, 6));   // not whole nodes
  EXPECT_FALSE(launchable(c, 12));  // islands of 6 over nodes of 4
  EXPECT_TRUE(launchable(c, 16));
  // The rule without its words is the rule with them, world by world.
  for (int islands : {1, 2, 3}) {
    for (int node : {0, 1, 2, 4, 6}) {
      for (bool in_turn : {false, true}) {
        TrainConfig k;
        k.islands = islands;
        k.islands_in_turn = in_turn && islands > 1;
        k.launch.comm.node_ranks = node;
        k.inject = {parse_injection("throw@2:20")};
        for (int world = 1; world <= 48; ++world) {
          EXPECT_EQ(launchable(k, world),
                    message_of([&] { check_world(k, world, WorldNamed::kRanks); }) == "(accepted)")
              << "islands " << islands << " in turn " << k.islands_in_turn << " node " << node
              << " world " << world;
        }
      }
    }
  }
}

TEST(RunCheck, TrainAndEstimateRefuseARuleInTheSameWords) {
  TrainConfig c = given({"qwz_block"});
  c.qwz_block = 64;
  const std::string want =
      "--qwz-block 64 does nothing here: it sizes --qwz's blocks, and --qwz is off; add --qwz, "
      "or leave --qwz-block out";
  EXPECT_EQ(message_of([&] { check_run(c, kTrainCommand); }), want);
  EXPECT_EQ(message_of([&] { check_run(c, kEstimateCommand); }), want);
  TrainConfig i = given({"node_ranks"});
  i.invariant = true;
  i.launch.comm.node_ranks = 2;
  i.launch.comm.two_level = true;
  EXPECT_EQ(message_of([&] { check_run(i, kTrainCommand); }),
            message_of([&] { check_run(i, kEstimateCommand); }));
}

TEST(RunCheck, EstimateLeavesTrainsOwnRulesToTrain) {
  // estimate has no --offload-dir nor --checkpoint-dir: what needs them is train's to refuse.
  TrainConfig c = given({"offload", "checkpoint_async"});
  c.offload = Offload::kOptimizer;
  c.offload_dir.clear();
  c.checkpoint_async = true;
  EXPECT_EQ(message_of([&] { check_run(c, kEstimateCommand); }), "(accepted)");
  EXPECT_NE(message_of([&] { check_run(c, kTrainCommand); }).find("--offload-dir is empty"),
            std::string::npos);
  c.offload_dir = "/var/tmp";
  EXPECT_NE(message_of([&] { check_run(c, kTrainCommand); })
                .find("--checkpoint-async on does nothing here: it writes checkpoints in the "
                      "background; add --checkpoint-dir DIR"),
            std::string::npos);
}

TEST(RunCheck, EstimateRefusesOnlyWhatNoStageItSweepsTakes) {
  TrainConfig c = given({"prefetch"});
  c.prefetch = 2;
  const std::vector<int> with3 = {0, 3}, without3 = {1, 2};
  EXPECT_EQ(message_of([&] { check_run_at_stages(c, with3); }), "(accepted)");
  EXPECT_EQ(message_of([&] { check_run_at_stages(c, without3); }),
            "--prefetch 2 does nothing here: it sets how many units stage 3 gathers ahead, and "
            "stages 0-2 gather none; use --stage 3, or leave --prefetch out");
  // Overlap acts at stage 0: a sweep of 0 and 2 takes it.
  TrainConfig o = given({"offload", "offload_overlap"});
  o.offload = Offload::kOptimizer;
  o.offload_overlap = true;
  const std::vector<int> zero_two = {0, 2}, one_two = {1, 2};
  EXPECT_EQ(message_of([&] { check_run_at_stages(o, zero_two); }), "(accepted)");
  EXPECT_NE(message_of([&] { check_run_at_stages(o, one_two); }).find("stages 1 and 2 gather"),
            std::string::npos);
  // Refused at every stage: the highest stage's reason, the one that acts on the most.
  TrainConfig p = given({"offload", "offload_overlap"});
  p.offload = Offload::kParams;
  p.offload_overlap = true;
  const std::vector<int> all = {0, 1, 2, 3};
  EXPECT_NE(message_of([&] {
              check_run_at_stages(p, all);
            }).find("--offload-overlap on with --offload optimizer,params"),
            std::string::npos);
}

TEST(RunCheck, AStage3ModeAtNoStage3IsRefusedAsTrainRefusesIt) {
  TrainConfig c = given({"hpz", "node_ranks"});
  c.hpz = true;
  c.launch.comm.node_ranks = 2;
  const std::vector<int> low = {0, 1};
  TrainConfig at1 = c;
  at1.stage = 1;
  EXPECT_EQ(message_of([&] { check_run_at_stages(c, low); }),
            message_of([&] { check_run(at1, kTrainCommand); }));
  EXPECT_NE(message_of([&] { check_run_at_stages(c, low); }).find("--stage 1 gathers none"),
            std::string::npos);
}

TEST(RunCheck, NodeRanksZeroGivenIsRefusedAsAValue) {
  TrainConfig c = given({"node_ranks"});
  EXPECT_EQ(message_of([&] { check_run(c, kEstimateCommand); }),
            "--node-ranks 0 is invalid; use the ranks per node (1 or more), or leave it out for "
            "one node");
  c.given->clear();  // the configuration's own 0: one node
  EXPECT_EQ(message_of([&] { check_run(c, kEstimateCommand); }), "(accepted)");
}

TEST(IdleRules, AnIdleOptionIsNullInTheReportWhetherGivenOrNot) {
  TrainConfig c;
  c.prefetch = 2;  // stage 0
  EXPECT_TRUE(config_json(c)["prefetch"].is_null());
  c.stage = 3;
  EXPECT_EQ(config_json(c)["prefetch"], 2);
  // Two reasons for one option: overlap without offload, and at stages 1-2.
  c.offload = Offload::kOptimizer;
  c.offload_dir = "/var/tmp";
  c.stage = 2;
  EXPECT_TRUE(config_json(c)["offload_overlap"].is_null());
  c.stage = 0;
  EXPECT_EQ(config_json(c)["offload_overlap"], false);
}

}  // namespace
}  // namespace zerodp
