// async_save.h is the contract.
#include "train/async_save.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include <fmt/core.h>

#include "checkpoint/safetensors.h"
#include "checkpoint/store.h"
#include "comm/ledger.h"
#include "core/error.h"
#include "core/stop_flag.h"
#include "core/stream_copy.h"
#include "train/offload.h"
#include "train/plan.h"
#include "train/rank_trainer.h"
#include "train/trace.h"

namespace zerodp {
namespace {

using Clock = std::chrono::steady_clock;

// What the writer hands write(2) at once: an abandoned save stops within one piece.
constexpr size_t kWritePiece = size_t{16} << 20;

// How often a wait for the staging looks for a stop request.
constexpr auto kStopPoll = std::chrono::milliseconds(10);

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The calling thread's CPU time.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Offloaded, the staging is the bounce buffer and then, with an exchange in flight, its values.
constexpr size_t kPendingAt = kCheckpointReadPiece + kOffloadAlign;

// The staging an asynchronous save of `largest` (the largest shards the rank writes, an
// outer exchange in flight included) takes: every shard's bytes, or with the states
// offloaded the bounce buffer and what is copied at the boundary. The planner's
// checkpoint_staging_bytes counts the same.
uint64_t staging_bytes(const RankShards& largest, bool offloaded) {
  if (!largest.writer) return 0;  // an HSDP replica writes no shard
  uint64_t bytes = 0;
  if (offloaded) {
    bytes = kPendingAt;
    for (const ShardTensor& t : largest.held.front().tensors) {
      if (t.copy_at_boundary) bytes += t.byte_count();
    }
    return bytes;
  }
  // Islands in turn stage every island's shard.
  for (const RankShards::Island& island : largest.held) {
    bytes += kStagingShardSlack;
    for (const ShardTensor& t : island.tensors) bytes += t.byte_count();
  }
  return bytes;
}

}  // namespace

std::unique_ptr<Saver> make_saver(RankTrainer& trainer, SaveStats& stats) {
  const TrainConfig& cfg = trainer.config();
  if (cfg.checkpoint_dir.empty()) return nullptr;
  SaveParty party{.comm = &trainer.comm(),
                  .cfg = &cfg,
                  .faults = &trainer.faults(),
                  .tracer = trainer.tracer(),
                  .files_per_rank = trainer.hosted_islands(),
                  .content = [&trainer](int64_t step) { return save_content(trainer, step); }};
  if (!cfg.checkpoint_async) return std::make_unique<SyncSaver>(std::move(party), stats);
  // An exchange is in flight at a boundary only when --outer-delay streams them.
  const uint64_t staging =
      staging_bytes(rank_shards(trainer, cfg.outer_delay > 0), trainer.offload() != nullptr);
  return std::make_unique<AsyncSaver>(std::move(party), stats, trainer.ledger(), staging,
                                      trainer.offload());
}

AsyncSaver::AsyncSaver(SaveParty party, SaveStats& stats, MemoryLedger& ledger, uint64_t staging,
                       OffloadTier* offload)
    : party_(std::move(party)),
      offload_(offload),
      sync_(party_, stats),
      staging_(ledger, MemCategory::kCheckpointStaging, static_cast<size_t>(staging)),
      stats_(stats),
      writer_([this] { writer_loop(); }) {
  if (offload_ != nullptr) offload_->set_before_write([this](size_t u) { wait_for_unit(u); });
}

AsyncSaver::~AsyncSaver() {
  {
    MutexLock lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  writer_.join();
  if (offload_ != nullptr) offload_->set_before_write(nullptr);
}

void AsyncSaver::wait_for_unit(size_t u) {
  MutexLock lock(mu_);
  if (!reading_ || units_read_ > u) return;
  const Clock::time_point t0 = Clock::now();
  cv_.wait(mu_, [&]() REQUIRES(mu_) { return !reading_ || units_read_ > u; });
  update_waits_ += seconds_since(t0);
}

std::optional<int64_t> AsyncSaver::at_boundary(const SaveBoundary& b) {
  const TrainConfig& cfg = *party_.cfg;
  const bool ending = b.last || b.interrupted || b.stopping;
  std::optional<int64_t> committed;
  if (b.interrupted && busy()) {
    // The signal's own save follows only a save in flight that finished in time: a disk too
    // slow for that would hold the stop up as long again.
    committed = finish_on_signal(cfg.checkpoint_signal_wait);
    if (!committed) return std::nullopt;
  }
  const Wait wait = ending                               ? Wait::kForAll
                    : b.due && !cfg.checkpoint_skip_busy ? Wait::kForStaging
                                                         : Wait::kNo;
  if (const std::optional<int64_t> now = poll(wait)) committed = now;
  if (b.due && !ending) {
    if (writing()) {
      ++stats_.requested;
      ++stats_.skipped;
    } else {
      start(b.step, *b.history);
    }
    return committed;
  }
  if (const std::optional<int64_t> saved = sync_.at_boundary(b)) return saved;
  return committed;
}

std::vector<AsyncSaver::Shard> AsyncSaver::stage(const SaveTicket& ticket,
                                                 const RankShards& shards) {
  std::vector<Shard> staged;
  if (!shards.writer) return staged;
  size_t at = 0;
  HeldIslands& islands = *shards.islands;
  islands.for_each([&](int v) {
    const RankShards::Island& island = shards.held[static_cast<size_t>(v)];
    Shard shard{.file = ticket.file(island.file),
                .tensors = shard_decls(island.tensors),
                .begin = 0,
                .bytes = 0,
                .sources = {}};
    // Where the file's data section falls on its 4 KiB blocks, so the writer's O_DIRECT
    // writes go from here uncopied.
    const uint64_t header = safetensors::header_bytes(shard.tensors, shard_metadata());
    const auto address = reinterpret_cast<uintptr_t>(staging_.data() + at);
    at += static_cast<size_t>((header - address) % kStagingShardSlack);
    shard.begin = at;
    stream_shard(island.tensors, islands.store(), [&](std::span<const std::byte> b) {
      if (b.size() > staging_.size() - at) {
        throw std::logic_error("checkpoint staging: the shard outgrew its buffer");
      }
      stream_copy(staging_.data() + at, b.data(), b.size());
      at += b.size();
    });
    shard.bytes = at - shard.begin;
    staged.push_back(std::move(shard));
  });
  return staged;
}

AsyncSaver::Shard AsyncSaver::from_offload(const SaveTicket& ticket, const RankShards& shards) {
  const RankShards::Island& island = shards.held.front();
  Shard shard{.file = ticket.file(island.file),
              .tensors = shard_decls(island.tensors),
              .begin = 0,
              .bytes = 0,
              .sources = island.tensors};
  // After the bounce buffer: what the next step rewrites without waiting for the writer
  // (an outer exchange in flight, which the next round's send overwrites).
  size_t at = kPendingAt;
  for (ShardTensor& t : shard.sources) {
    if (!t.copy_at_boundary) continue;
    const size_t begin = at;
    t.bytes([&](std::span<const std::byte> b) {
      if (b.size() > staging_.size() - at) {
        throw std::logic_error("checkpoint staging: the shard outgrew its buffer");
      }
      std::memcpy(staging_.data() + at, b.data(), b.size());
      at += b.size();
    });
    const std::span<const std::byte> copy(staging_.data() + begin, at - begin);
    t.bytes = [copy](const ByteSink& sink) { sink(copy); };
  }
  return shard;
}

void AsyncSaver::start(int64_t step, std::vector<checkpoint::StepHistory> history) {
  if (writing()) throw std::logic_error("AsyncSaver::start with a save being written");
  const Clock::time_point t0 = Clock::now();
  CommPhaseScope phase(party_.comm->ledger(), CommPhase::kOther);
  const Tracer::Span span(party_.tracer, "checkpoint copy", "checkpoint");
  ++stats_.requested;
  SaveContent content = party_.content(step);
  SaveTicket ticket = begin_save(party_, step, std::move(content.meta));
  const bool from_offload = content.shards.writer && offload_ != nullptr;
  std::vector<Shard> shards;
  if (from_offload) {
    shards.push_back(this->from_offload(ticket, content.shards));
  } else {
    shards = stage(ticket, content.shards);
  }
  ticket_ = std::move(ticket);
  {
    MutexLock lock(mu_);
    job_ = Job{.ticket = &*ticket_,
               .shards = std::move(shards),
               .history = std::move(history),
               .from_offload = from_offload};
    done_ = false;
    // From here until the writer has read a unit, the next update waits before rewriting it.
    reading_ = from_offload;
    units_read_ = 0;
    update_waits_ = 0;
  }
  cv_.notify_all();
  stall_ += seconds_since(t0);
}

AsyncSaver::Progress AsyncSaver::exchange(const Progress& mine) {
  // Each count is at most the world's size, so as digits in base size + 1 the sum of the
  // ranks' values holds the three sums exactly.
  const auto base = static_cast<double>(party_.comm->size() + 1);
  const double sum = party_.comm->sum_control(
      static_cast<double>(mine.unwritten) +
      base *
          (static_cast<double>(mine.uncommitted) +
           base * (static_cast<double>(mine.failed) + base * static_cast<double>(mine.stopping))));
  const auto b = static_cast<int64_t>(base);
  auto n = static_cast<int64_t>(std::llround(sum));
  Progress all;
  all.unwritten = n % b;
  n /= b;
  all.uncommitted = n % b;
  n /= b;
  all.failed = n % b;
  all.stopping = n / b;
  return all;
}

std::optional<int64_t> AsyncSaver::poll(Wait wait) {
  std::optional<int64_t> committed;
  CommPhaseScope phase(party_.comm->ledger(), CommPhase::kOther);
  while (busy()) {
    const Clock::time_point t0 = Clock::now();
    Progress mine;
    {
      MutexLock lock(mu_);
      // Waiting for the staging, the commit in flight is not waited for: the writer runs it
      // before the next save's write, so by the time every rank's write is done it is too.
      if (wait == Wait::kForAll) {
        cv_.wait(mu_, [this]() REQUIRES(mu_) { return own_part_done(); });
      } else if (wait == Wait::kForStaging) {
        // A stop request ends the wait: the due save is given up, and the next boundary's
        // signal save waits for the write in flight no longer than --checkpoint-signal-wait.
        // The writer cannot see the request (it comes from a signal handler), so the wait is
        // sliced.
        while (
            !cv_.wait_for(mu_, kStopPoll, [this]() REQUIRES(mu_) { return !ticket_ || done_; })) {
          if (stop_requested() != 0) {
            mine.stopping = 1;
            break;
          }
        }
      }
      mine.unwritten = ticket_ && !done_ ? 1 : 0;
      if (committing_ && committing_->owner) {
        mine.uncommitted = committed_ ? 0 : 1;
        mine.failed = committed_ && !commit_error_.empty() ? 1 : 0;
      }
    }
    const Progress all = exchange(mine);
    charge(seconds_since(t0));
    // The older save first: its commit was handed over before the newer one's write.
    if (committing_ && all.uncommitted == 0) committed = settle(all.failed > 0);
    if (ticket_ && all.unwritten == 0) hand_over_commit();
    if (wait == Wait::kNo || (wait == Wait::kForStaging && (!writing() || all.stopping > 0))) break;
  }
  return committed;
}

std::optional<int64_t> AsyncSaver::finish_on_signal(double limit) {
  if (!busy()) return std::nullopt;
  const Clock::time_point t0 = Clock::now();
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  bool done = false;
  {
    MutexLock lock(mu_);
    cv_.wait_until(mu_, deadline, [this]() REQUIRES(mu_) { return own_part_done(); });
    done = !ticket_ || done_;
  }
  Communicator& comm = *party_.comm;
  CommPhaseScope phase(comm.ledger(), CommPhase::kOther);
  // One agreement: a rank still writing at its deadline abandons the save for everyone.
  const bool written = comm.sum_control(done ? 0.0 : 1.0) == 0;
  charge(seconds_since(t0));
  if (written) return poll(Wait::kForAll);
  const Clock::time_point t1 = Clock::now();
  {
    MutexLock lock(mu_);
    abandon_ = true;
  }
  cv_.notify_all();
  {
    // The writer commits the save before this one ahead of this one's write, so once the
    // write has stopped that commit is done too.
    MutexLock lock(mu_);
    cv_.wait(mu_, [this]() REQUIRES(mu_) { return done_; });
    done_ = false;
    abandon_ = false;
  }
  // Every writer has stopped: the temporary is nobody's.
  (void)comm.sum_control(0.0);
  if (ticket_->owner) {
    std::error_code ec;
    std::filesystem::remove_all(ticket_->temp, ec);
  }
  stats_.abandoned = ticket_->step;
  ticket_.reset();
  stall_ += seconds_since(t1);
  // The save before, agreed and committed by its owner, is settled as at any boundary.
  (void)poll(Wait::kForAll);
  if (stall_ > 0) {
    stats_.stall_seconds.push_back(stall_);
    stall_ = 0;
  }
  return std::nullopt;
}

void AsyncSaver::hand_over_commit() {
  const Clock::time_point t0 = Clock::now();
  ShardWritten written;
  {
    MutexLock lock(mu_);
    stall_ += update_waits_;
    written = std::move(written_);
    stats_.write_seconds.push_back(write_seconds_);
    stats_.write_cpu_seconds.push_back(write_cpu_seconds_);
    done_ = false;
  }
  SaveTicket ticket = std::move(*ticket_);
  ticket_.reset();
  checkpoint::Meta meta;
  try {
    meta = agree_save(party_, ticket, written);
  } catch (...) {
    stats_.stall_seconds.push_back(stall_ + seconds_since(t0));
    stall_ = 0;
    throw;
  }
  const int64_t step = ticket.step;
  const bool owner = ticket.owner;
  if (owner) {
    MutexLock lock(mu_);
    commit_job_ = CommitJob{.ticket = std::move(ticket), .meta = std::move(meta)};
    committed_ = false;
    commit_error_.clear();
  }
  cv_.notify_all();
  committing_ = Committing{.step = step, .owner = owner, .stall = stall_ + seconds_since(t0)};
  stall_ = 0;
}

int64_t AsyncSaver::settle(bool any_failed) {
  const Clock::time_point t0 = Clock::now();
  std::string error;
  {
    MutexLock lock(mu_);
    if (committing_->owner) {
      error = commit_error_;
      // The writer's time on this save: its files, then the commit.
      if (!stats_.write_seconds.empty()) {
        stats_.write_seconds.back() += commit_seconds_;
        stats_.write_cpu_seconds.back() += commit_cpu_seconds_;
      }
    }
    committed_ = false;
  }
  const Committing done = *committing_;
  committing_.reset();
  try {
    settle_commit(*party_.cfg, done.step, done.owner, any_failed,
                  any_failed ? first_error(*party_.comm, error) : "");
  } catch (...) {
    stats_.stall_seconds.push_back(done.stall + seconds_since(t0));
    throw;
  }
  ++stats_.committed;
  stats_.stall_seconds.push_back(done.stall + seconds_since(t0));
  return done.step;
}

void AsyncSaver::writer_loop() {
  while (true) {
    std::optional<CommitJob> commit;
    Job job;
    {
      MutexLock lock(mu_);
      while (!job_ && !commit_job_ && !quit_) cv_.wait(mu_);
      // A save handed over is written, and an agreed one committed, even when the run is
      // ending: its temporary is then complete, or absent.
      if (commit_job_) {
        commit = std::move(commit_job_);
        commit_job_.reset();
      } else if (job_) {
        job = std::move(*job_);
        job_.reset();
      } else {
        return;
      }
    }
    const Clock::time_point t0 = Clock::now();
    const double cpu0 = thread_cpu_seconds();
    if (commit) {
      std::string error = commit_save(party_, commit->ticket, commit->meta);
      if (Tracer* t = party_.tracer) {
        t->record(fmt::format("checkpoint commit, step {}", commit->ticket.step), "checkpoint", t0,
                  Clock::now(), Tracer::kCheckpointRow);
      }
      {
        MutexLock lock(mu_);
        commit_error_ = std::move(error);
        commit_seconds_ = seconds_since(t0);
        commit_cpu_seconds_ = thread_cpu_seconds() - cpu0;
        committed_ = true;
      }
      cv_.notify_all();
      continue;
    }
    ShardWritten written = write(job);
    if (Tracer* t = party_.tracer) {
      t->record(fmt::format("checkpoint write, step {}", job.ticket->step), "checkpoint", t0,
                Clock::now(), Tracer::kCheckpointRow);
    }
    {
      MutexLock lock(mu_);
      written_ = std::move(written);
      write_seconds_ = seconds_since(t0);
      write_cpu_seconds_ = thread_cpu_seconds() - cpu0;
      done_ = true;
    }
    cv_.notify_all();
  }
}

void AsyncSaver::write_from_offload(const Shard& shard, safetensors::Writer& out,
                                    const std::function<void()>& check) {
  const auto at = reinterpret_cast<uintptr_t>(staging_.data());
  const std::span<std::byte> bounce(
      staging_.data() + ((at + kOffloadAlign - 1) / kOffloadAlign * kOffloadAlign - at),
      kCheckpointReadPiece);
  const auto write = [&](std::span<const std::byte> b) {
    check();
    out.write(b);
  };
  const std::vector<ShardTensor>& tensors = shard.sources;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const ShardTensor& t = tensors[k];
    if (t.array != 0) {
      offload_->read_out(t.unit, t.array, t.range.begin, t.range.count(), bounce, write);
    } else {
      t.bytes(write);
    }
    if (k + 1 < tensors.size() && tensors[k + 1].unit == t.unit) continue;
    // The unit's tensors are all read: the update may rewrite it (it rewrites the scales
    // with the codes, and a merge the outer weights with the master), having waited for this.
    {
      MutexLock lock(mu_);
      units_read_ = t.unit + 1;
    }
    cv_.notify_all();
  }
}

ShardWritten AsyncSaver::write(const Job& job) {
  const SaveTicket& t = *job.ticket;
  // However the write ends, the update must not wait for reads that will not come.
  struct ReadsEnd {
    AsyncSaver& s;
    ~ReadsEnd() {
      {
        MutexLock lock(s.mu_);
        s.reading_ = false;
      }
      s.cv_.notify_all();
    }
  } reads_end{*this};
  ShardWritten w;
  const int rank = party_.comm->rank();
  try {
    const auto check_abandoned = [&] {
      if (abandoning())
        throw IoError(fmt::format("the write of {} was abandoned", t.file(rank).string()));
    };
    if (!job.shards.empty()) {
      // A slow disk, injected: waited out unless the save is abandoned meanwhile.
      if (const double delay = party_.faults->shard_write_delay(t.step); delay > 0) {
        MutexLock lock(mu_);
        cv_.wait_for(mu_, std::chrono::duration<double>(delay),
                     [this]() REQUIRES(mu_) { return abandon_; });
      }
    }
    for (const Shard& shard : job.shards) {
      check_abandoned();
      party_.faults->shard_write_failure(t.step, shard.file);
      safetensors::Writer out(shard.file, shard.tensors, shard_metadata(),
                              safetensors::WriteMode::kDirect, safetensors::Digest::kCrc32c);
      if (job.from_offload) {
        write_from_offload(shard, out, check_abandoned);
      } else {
        // In pieces, so that an abandoned save stops within one.
        for (size_t at = 0; at < shard.bytes; at += kWritePiece) {
          check_abandoned();
          out.write({staging_.data() + shard.begin + at, std::min(kWritePiece, shard.bytes - at)});
        }
      }
      const std::string crc = out.finish();
      w.files.push_back({crc, std::filesystem::file_size(shard.file)});
    }
    check_abandoned();
    if (rank == 0) w.history = checkpoint::write_history(t.temp, job.history);
  } catch (const std::exception& e) {
    w.error = e.what();
  }
  checkpoint::failpoint("shard-written", rank);
  return w;
}

}  // namespace zerodp
