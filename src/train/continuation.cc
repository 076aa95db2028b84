// continuation.h is the contract.
#include "train/continuation.h"

#include <cstdint>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "checkpoint/store.h"
#include "core/error.h"

namespace zerodp {

std::string keep_global_batch(TrainConfig& cfg, const std::filesystem::path& from,
                              const checkpoint::Meta& m, int world, bool default_policy) {
  const uint64_t k = m.samples_per_step;
  const uint64_t b = static_cast<uint64_t>(cfg.micro_batch);
  const uint64_t n = static_cast<uint64_t>(world);
  const auto saved_value = [&](const char* key) {
    return m.config.count(key) ? m.config.at(key) : std::string("?");
  };
  // The ranks a user names: islands in turn each take every rank, so `world` counts each
  // rank once per island; islands on ranks of their own need a multiple of the islands.
  const uint64_t islands = static_cast<uint64_t>(std::max(cfg.islands, 1));
  const uint64_t per_rank = cfg.islands_in_turn ? islands : 1;
  const uint64_t step = cfg.islands_in_turn ? 1 : islands;
  const std::string saved_ranks =
      cfg.islands < 2 ? fmt::format("{} ranks", saved_value("ranks"))
      : cfg.islands_in_turn
          ? fmt::format("{} ranks x {} islands in turn", saved_value("ranks"), cfg.islands)
          : fmt::format("{} ranks as {} islands", saved_value("ranks"), cfg.islands);
  if (k % (n * b) != 0) {
    // A damaged checkpoint is the graver news (exit 3): verify before refusing the batch.
    (void)checkpoint::Checkpoint(from);
    std::vector<uint64_t> fits;
    for (uint64_t r = step; r * per_rank * b <= k; r += step) {
      if (k % (r * per_rank * b) == 0) fits.push_back(r);
    }
    throw InvalidArgument(fmt::format(
        "--resume {}: the checkpoint's steps take {} samples ({} x --micro-batch {} x "
        "--grad-accum {}), which {} ranks of --micro-batch {} cannot split evenly; {}, or pass "
        "--grad-accum to change the batch",
        from.string(), k, saved_ranks, saved_value("micro_batch"), saved_value("grad_accum"),
        n / per_rank, b,
        fits.empty() ? std::string("no rank count can at this micro-batch")
                     : fmt::format("use --ranks {}", fmt::join(fits, ", "))));
  }
  cfg.grad_accum = static_cast<int>(k / (n * b));
  // A run in the canonical order had the same bits at every rank count: the continuation
  // keeps that order (reduce), whatever A' now is, or a resume on fewer ranks at stages 0-1
  // would turn local and lose the bits it promised.
  const auto saved = m.config.find("invariant");
  const bool saved_canonical = saved != m.config.end() && saved->second == "on";
  if (default_policy) {
    cfg.accumulate = saved_canonical && cfg.invariant.value_or(true)
                         ? AccumulatePolicy::kReduce
                         : default_accumulate(cfg.stage, cfg.grad_accum, cfg.invariant);
  }
  // K is kept, so the same micro-batch and accumulation mean the same ranks.
  const std::string saved_accum = saved_value("grad_accum");
  if (saved_value("micro_batch") == std::to_string(b) &&
      saved_accum == std::to_string(cfg.grad_accum)) {
    return {};
  }
  if (saved_canonical && canonical_order(cfg)) return {};
  return fmt::format(
      "the checkpoint's steps were {} x --grad-accum {}, these are {} ranks x {}: the batch is "
      "kept, but {} sums gradients in an order that depends on the rank count, so the weights "
      "may differ in their last bits from a run that kept its ranks (--invariant on keeps "
      "them; docs/determinism.md)",
      saved_ranks, saved_accum, n / per_rank, cfg.grad_accum,
      saved_canonical ? "this run" : "the checkpoint's run");
}

}  // namespace zerodp
