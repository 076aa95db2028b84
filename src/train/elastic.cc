// elastic.h is the contract.
#include "train/elastic.h"

#include <filesystem>
#include <optional>
#include <typeinfo>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "checkpoint/store.h"
#include "core/error.h"
#include "train/checkpoint_io.h"
#include "train/continuation.h"
#include "train/run_check.h"

namespace zerodp {

RankFailure failure_of(const std::exception_ptr& error, int64_t step) {
  RankFailure f;
  f.failed = true;
  f.step = step;
  try {
    std::rethrow_exception(error);
  } catch (const CommError& e) {
    f.message = e.what();
  } catch (const Error& e) {
    f.own = true;
    f.restartable = typeid(e) == typeid(Error);
    f.message = e.what();
  } catch (const std::exception& e) {
    f.own = true;
    f.message = e.what();
  } catch (...) {
    f.own = true;
    f.message = "unknown exception";
  }
  return f;
}

namespace {

// The root cause of a local launch's failure, when a restart may get past it.
struct RootCause {
  std::string message;  // what `error` said
  bool timeout = false;
  int failed_rank = -1;
  const RankFailure* failure = nullptr;  // the root's own record, in `failures`
};

// The root cause run_local rethrew as `error`: a timeout names the rank that stopped
// arriving; any other collective failure (a mismatch) is a defect, not a lost rank; else the
// root is the first rank in rank order whose own failure was recorded. Rethrows `error` when
// it is not a failure a restart gets past.
RootCause restartable_root(const std::exception_ptr& error,
                           const std::vector<RankFailure>& failures) {
  std::string message;
  bool timeout = false;
  bool comm_error = false;
  bool untyped = false;  // zerodp::Error itself: a typed root is never restarted
  int failed_rank = -1;
  try {
    std::rethrow_exception(error);
  } catch (const CommTimeout& e) {
    timeout = true;
    failed_rank = e.failed_rank();
    message = e.what();
  } catch (const CommError& e) {
    comm_error = true;
    message = e.what();
  } catch (const std::exception& e) {
    untyped = typeid(e) == typeid(Error);
    message = e.what();
  } catch (...) {
  }
  const RankFailure* root = nullptr;
  for (size_t r = 0; r < failures.size() && !comm_error; ++r) {
    const RankFailure& f = failures[r];
    if (!f.failed || !(timeout || f.own)) continue;
    root = &f;
    if (!timeout) failed_rank = static_cast<int>(r);
    break;
  }
  // A failure outside the step loop (start-up, loading, the final evaluation) is not
  // restarted either: a restart would meet it again.
  if (root == nullptr || !(timeout || (untyped && root->restartable))) {
    std::rethrow_exception(error);
  }
  return {.message = message, .timeout = timeout, .failed_rank = failed_rank, .failure = root};
}

}  // namespace

// After a local launch ended with `error`: the restart the survivors make, with cfg set
// for their launch; or `error` rethrown: unchanged when it is not a rank's failure a
// restart gets past, with the reason appended when it is but no restart can be made.
Restart plan_restart(TrainConfig& cfg, const std::exception_ptr& error,
                     const std::vector<RankFailure>& failures, std::span<const Restart> done,
                     bool default_policy) {
  const RootCause cause = restartable_root(error, failures);
  const std::string& message = cause.message;
  const bool timeout = cause.timeout;
  const int failed_rank = cause.failed_rank;
  const RankFailure* root = cause.failure;
  const auto refuse = [&](const std::string& why) {
    const std::string what =
        fmt::format("{}; not restarted (--max-restarts {}): {}", message, cfg.max_restarts, why);
    if (timeout) throw CommTimeout(what, failed_rank);
    throw Error(what);
  };
  if (done.size() >= static_cast<size_t>(cfg.max_restarts)) {
    std::vector<std::string> earlier;
    for (const Restart& r : done) {
      earlier.push_back(
          fmt::format("step {} on {} ranks -> {}", r.failed_step, r.ranks_before, r.ranks_after));
    }
    refuse(fmt::format("all {} used ({}); pass a larger --max-restarts to go on", done.size(),
                       fmt::join(earlier, ", ")));
  }
  const int ranks = cfg.launch.ranks;
  if (ranks < 2) refuse("the run had 1 rank, so none is left to continue");
  const std::optional<std::filesystem::path> latest = checkpoint::find_latest(cfg.checkpoint_dir);
  if (!latest) {
    refuse(fmt::format(
        "no checkpoint was committed in {} before the failure (the first was due at step {}), "
        "and a restart continues from one, never from scratch",
        cfg.checkpoint_dir, cfg.checkpoint_every));
  }
  // The step's micro-batches M = N x A stay; the survivors are N - 1, and the largest of
  // them that divides M trains on, each rank taking M / N' of them. Over nodes of T ranks
  // the world stays whole nodes (N' = P' x T: a node is lost, not one rank of it); when no
  // such N' is left, the survivors are one node of N' ranks.
  // With --islands the islands stay, each with its micro-batches per step, on fewer ranks
  // each: n' < n dividing them (the same bits, docs/diloco.md), every island a node of n';
  // islands in turn go on in turn on n' ranks.
  const int micro_batches = ranks * cfg.grad_accum;
  const int per_node = cfg.launch.comm.node_ranks;
  int survivors = ranks - 1;
  if (cfg.islands > 1) {
    const int n = shard_ranks(cfg, ranks);
    int fewer = n - 1;
    while (fewer >= 1 && (n * cfg.grad_accum) % fewer != 0) --fewer;
    if (fewer < 1) {
      refuse(cfg.islands_in_turn
                 ? std::string("--islands-in-turn on one rank: no rank is left to go on")
                 : fmt::format("--islands {} of one rank each: losing a rank loses an island, "
                               "and a restart keeps every island",
                               cfg.islands));
    }
    survivors = cfg.islands_in_turn ? fewer : cfg.islands * fewer;
    cfg.launch.comm.node_ranks = fewer;
  } else if (per_node > 0) {
    while (survivors >= per_node && (micro_batches % survivors != 0 || survivors % per_node != 0))
      --survivors;
    if (survivors < per_node) survivors = ranks - 1;
  }
  while (micro_batches % survivors != 0) --survivors;
  if (cfg.islands == 1 && per_node > 0 && survivors % per_node != 0) {
    cfg.launch.comm.node_ranks = survivors;
  }
  const checkpoint::Meta meta = checkpoint::read_meta(*latest);
  Restart restart{.failed_step = root->step,
                  .failed_rank = failed_rank,
                  .cause = timeout ? message : root->message,
                  .ranks_before = ranks,
                  .ranks_after = survivors,
                  .grad_accum_before = cfg.grad_accum,
                  .resumed_step = static_cast<int64_t>(meta.step),
                  .checkpoint = latest->string(),
                  .order_note = {}};
  restart.order_note =
      keep_global_batch(cfg, *latest, meta, survivors * hosted_islands(cfg), default_policy);
  restart.grad_accum_after = cfg.grad_accum;
  cfg.launch.ranks = survivors;
  cfg.resume = "latest";
  // Injections are one-shot per process: the failed step's, and those before it, fired; and
  // those at ranks past the new world never fire, as before a restart's launch.
  std::erase_if(cfg.inject,
                [&](const Injection& i) { return i.step <= root->step || i.rank >= survivors; });
  // The world chosen above keeps the rules every world keeps.
  check_world(cfg, survivors, WorldNamed::kRanks);
  return restart;
}

}  // namespace zerodp
