// Communicator: collective communication among the ranks of one training job.
//
// Contract (as in c10d): every rank calls the same collectives, in the same order, with the
// same element counts, dtype and partition. Calls return a Work handle at once; the
// collective runs on the rank's communication thread, in call order, and Work::wait()
// returns when it is done or rethrows its error. Buffers must stay alive and untouched
// until then. The blocking forms are the async forms followed by wait().
//
// Determinism: a reduction computes ((x_0 + x_1) + ...) + x_{N-1} element-wise in fp32, in
// rank order, then divides by N for kAvg, then rounds once (to nearest even) to the
// buffer's dtype. Every backend reduces with the same code (comm/reduce.h), so results are
// the same bits whichever backend runs them.
//
// Accounting: each call is recorded in the rank's CommLedger when it is issued, as bytes
// this rank receives from its peers (docs/architecture.md, "Comm ledger").
//
// Failure: if any rank fails, every other rank's pending or next collective fails with a
// CommError naming that rank and its reason; a collective that waits longer than the
// timeout fails with CommTimeout naming the ranks that did not arrive, and one the simulated
// link would make last longer than the timeout fails with CommTimeout naming the link.
//
// Stop: the simulated link's waits end early once a stop is requested (core/stop_flag.h) or
// a failure is recorded, so a stopping run finishes its step at full speed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/buffer.h"
#include "comm/comm_options.h"
#include "comm/ledger.h"
#include "comm/link_model.h"
#include "core/partition.h"
#include "tensor/dtype.h"

namespace zerodp {

// kSum, kAvg and kMax reduce into an output of the input's dtype (reduce.h: summed in fp32 in
// rank order, divided by the world for kAvg, rounded once). kSumInto is the accumulating
// form, for reduce-scatter only: the output is an fp32 accumulator of the rank's range and
// out[i] = ((out[i] + in_0[i]) + in_1[i]) + ... + in_{n-1}[i], in fp32, nothing divided or
// rounded. Called once per micro-step with the ranks' micro-batch gradients, it adds them to
// the owner's accumulator in the order i = k * n + r (micro-step k, rank r): the one order of
// a step's M = A * n micro-batches whatever n is, which is what lets a run's bits not depend
// on its rank count.
enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kSumInto };

std::string_view reduce_op_name(ReduceOp op);

// Handle to an issued collective. Waiting twice is allowed; a default Work is complete.
class [[nodiscard]] Work {
 public:
  struct State;
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // Blocks until the collective finished; rethrows its error (every time it is called).
  void wait();
  bool ready() const;

 private:
  std::shared_ptr<State> state_;
};

class Communicator {
 public:
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string_view backend_name() const = 0;

  // Reduce-scatter: `in` holds part.length() elements on every rank; `out` receives
  // part.count(rank()) elements, rank rank()'s range reduced over all ranks. `out` may be
  // exactly rank()'s range of `in` (in place); no other overlap is allowed. With kSumInto,
  // `out` is an fp32 accumulator (whatever `in`'s dtype) that must not overlap `in` at all.
  // all_reduce takes kSum, kAvg and kMax only.
  Work reduce_scatter_async(ConstBuffer in, MutableBuffer out, const Partition& part, ReduceOp op);
  // All-gather: `shard` holds part.count(rank()) elements; `out` receives part.length(),
  // each rank's shard at its range. `shard` may be exactly rank()'s range of `out`.
  Work all_gather_async(ConstBuffer shard, MutableBuffer out, const Partition& part);
  // All-gather among the T ranks of this rank's node only (hpZ's gather of a node's
  // secondary copy): `node_part` has T ranges, and the rank of local index l = rank() % T
  // holds range l in `shard`; `out` receives node_part.length(). Every rank of the world
  // calls it (each node gathers its own), so it keeps the collectives' one order. Recorded
  // as an all_gather of which nothing crosses nodes.
  Work node_all_gather_async(ConstBuffer shard, MutableBuffer out, const Partition& node_part);
  // Reduce-scatter over the T ranks of this rank's node of the reduction over the whole
  // world: HSDP's gradient reduction (states sharded inside each node, replicated across
  // nodes). `in` holds node_part.length() elements on every rank (node_part has T ranges);
  // `out` receives node_part.count(l), l = rank() % T: range l reduced over all N ranks, the
  // same bits on the P ranks of local index l. `out` may be exactly range l of `in`. Order: with 1
  // < T < N the two-level one (each node's T inputs folded in local rank order in fp32 and rounded
  // to the dtype, then the P node partials folded in node order, divided by N for kAvg, rounded
  // once); otherwise the flat rank order. kSum and kAvg; not under qgZ. Recorded as a
  // reduce_scatter: (T - 1) * c_l * w inside the node, and across nodes an all-reduce of the
  // c_l elements among the ranks of local index l split as Partition(c_l, P), of which node
  // p's rank receives ((P - 1) * s_p + c_l - s_p) * w, s_p its piece.
  Work node_reduce_scatter_async(ConstBuffer in, MutableBuffer out, const Partition& node_part,
                                 ReduceOp op);
  // All-reduce in place: exactly a reduce-scatter over Partition(count, size()) followed by
  // an all-gather, recorded as one all_reduce call.
  Work all_reduce_async(MutableBuffer buf, ReduceOp op);
  // Broadcast `buf` from `root` to every rank.
  Work broadcast_async(MutableBuffer buf, int root);

  void reduce_scatter(ConstBuffer in, MutableBuffer out, const Partition& part, ReduceOp op) {
    reduce_scatter_async(in, out, part, op).wait();
  }
  void all_gather(ConstBuffer shard, MutableBuffer out, const Partition& part) {
    all_gather_async(shard, out, part).wait();
  }
  void all_reduce(MutableBuffer buf, ReduceOp op) { all_reduce_async(buf, op).wait(); }
  void broadcast(MutableBuffer buf, int root) { broadcast_async(buf, root).wait(); }
  // Returns when every rank has called barrier(). Counted as control traffic.
  void barrier();

  // The ranks that call split with the same `color`, as a communicator of their own, numbered
  // by (key, rank), with `options` (their node_ranks counts within the group). Collective:
  // every rank calls it, in the same order. The group's collectives and ledger are its own;
  // an abort of this communicator ends the group's waits too. For ranks that work apart and
  // meet in groups (DiLoCo's islands and columns). InvalidArgument for a split the backend
  // cannot make (MPI: a group's ranks in a process must be consecutive and as many in every
  // process, and only the world splits).
  std::unique_ptr<Communicator> split(int color, int key, const CommOptions& options);

  // Control traffic (loss, overflow flags, partial norms): every rank contributes the same
  // number of values; all receive everyone's, rank-major (values of rank 0 first).
  // Reducing them is the caller's business, in rank order.
  std::vector<double> gather_control(std::span<const double> mine);
  // The sum over ranks, in rank order, of each value; a control all-reduce.
  std::vector<double> sum_control(std::span<const double> mine);
  double sum_control(double mine);
  double max_control(double mine);

  CommLedger& ledger() { return *counts_; }
  const CommLedger& ledger() const { return *counts_; }
  // From now on this communicator's calls are recorded in `ledger` (which must outlive it)
  // instead of its own: a group split from a rank's world counts in the world's ledger, so
  // the rank's one ledger holds all its traffic, under the phase the rank set there.
  void count_in(CommLedger& ledger) { counts_ = &ledger; }

  // Called on the communication thread after each collective ran, with its kind, bytes
  // received and [start, end) on the steady clock (the simulated link's wait included).
  // Set it before the first collective; null turns it off.
  using TraceHook =
      std::function<void(CommKind kind, uint64_t bytes, std::chrono::steady_clock::time_point start,
                         std::chrono::steady_clock::time_point end)>;
  void set_trace_hook(TraceHook hook);

  // Declares this rank failed: peers' pending and next collectives fail naming it. Called
  // by launchers when a rank's code throws; never returns an error itself.
  virtual void abort(const std::string& reason) noexcept = 0;

 protected:
  Communicator(int rank, int size, const CommOptions& options = {});
  // Backends implement blocking primitives; they run on the rank's communication thread in
  // call order, never concurrently with each other. Arguments are already validated.
  virtual void run_reduce_scatter(ConstBuffer in, MutableBuffer out, const Partition& part,
                                  ReduceOp op) = 0;
  virtual void run_all_gather(ConstBuffer shard, MutableBuffer out, const Partition& part) = 0;
  virtual void run_node_all_gather(ConstBuffer shard, MutableBuffer out,
                                   const Partition& node_part) = 0;
  virtual void run_node_reduce_scatter(ConstBuffer in, MutableBuffer out,
                                       const Partition& node_part, ReduceOp op) = 0;
  virtual void run_broadcast(MutableBuffer buf, int root) = 0;
  virtual void run_gather_control(std::span<const double> mine, std::span<double> all) = 0;
  // Must be called by the backend's destructor before its members go away.
  void stop_worker();
  // On the communication thread, as a collective throws: the backend lets go of what the
  // collective held (its peers may wait on it before they free their buffers).
  virtual void collective_failed() noexcept {}
  // split's backend part: this rank's communicator among `members` (world ranks, in the
  // group's order; this rank is members[index]), for split number `split_id` of this
  // communicator; InvalidArgument for a group the backend cannot make.
  virtual std::unique_ptr<Communicator> make_group(uint64_t split_id, std::span<const int> members,
                                                   int index, const CommOptions& options) = 0;
  // The backend's abort record (a ThreadGroup's aborted_flag(): this rank's own abort, or
  // a peer's it can see without communicating). Once it is set the simulated link's waits end
  // early, since the next collective fails anyway. Call it from the backend's constructor,
  // before the first collective; the flag must outlive stop_worker(). A flag, not a virtual
  // call: the communication thread may read it while the backend's destructor runs.
  void watch_abort_flag(const std::atomic<bool>* flag);
  // Ranks per node (the world when CommOptions::node_ranks is 0), and this rank's node's
  // first rank.
  int node_ranks() const { return options_.node_ranks > 0 ? options_.node_ranks : size_; }
  int node_first() const { return rank_ / node_ranks() * node_ranks(); }
  // Whether reduce-scatter and all-gather run the two-level algorithms (CommOptions::two_level
  // over more than one node of more than one rank; otherwise the two are the flat ones).
  bool two_level() const { return options_.two_level && node_ranks() > 1 && node_ranks() < size_; }
  bool quantized_reduce_scatter() const { return options_.qgz_bits != 0; }
  // Whether node_reduce_scatter folds in two levels (1 < T < N) or in flat rank order.
  bool nodes_fold_in_two_levels() const { return node_ranks() > 1 && node_ranks() < size_; }
  const CommOptions& options() const { return options_; }

 private:
  class Worker;
  Work submit(std::function<void()> op, CommKind kind, uint64_t bytes, double min_seconds = 0);
  // The simulated link's settings that apply to this world, for messages.
  std::string link_settings() const;
  // The simulated link's time for `bytes` received over `steps` ring steps (0 when off).
  double link_seconds(uint64_t bytes, uint64_t cross, int steps) const;
  // The options' simulated link as the one model estimate forecasts with (link_model.h).
  LinkModel link_model() const;
  // What this rank receives in a reduce-scatter or an all-gather over `part` with `w` bytes
  // per element: in all, and from peers on other nodes (ledger.h), for the flat or the
  // two-level algorithm as the options say; and how long the simulated link makes it last.
  struct Traffic {
    uint64_t bytes = 0;
    uint64_t cross = 0;
    double seconds = 0;
  };
  Traffic reduce_scatter_traffic(const Partition& part, size_t w) const;
  Traffic all_gather_traffic(const Partition& part, size_t w) const;
  // The two-level algorithms' time: the intra-node phase at the general link over T - 1
  // steps, the cross-node phase at the link between nodes over P - 1 steps.
  double two_level_seconds(uint64_t intra, uint64_t cross) const;
  // Elements of `part` held by the ranks of this rank's node.
  size_t node_count(const Partition& part) const;
  // Elements of `part` held by the ranks of this rank's local index on every node: the
  // ranges a two-level collective moves across nodes for this rank.
  size_t column_count(const Partition& part) const;

  int rank_;
  int size_;
  uint64_t splits_ = 0;  // split() calls so far
  CommOptions options_;
  CommLedger ledger_;
  CommLedger* counts_ = &ledger_;
  std::unique_ptr<Worker> worker_;
};

}  // namespace zerodp
