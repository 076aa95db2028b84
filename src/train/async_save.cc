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
#include "train/moments_io.h"
#include "train/offload.h"
#include "train/plan.h"
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

}  // namespace

uint64_t staging_bytes(const RankTrainer& trainer) {
  if (!trainer.group().primary()) return 0;  // an HSDP replica writes no shard
  // The shard's tensors as the file declares them, an outer exchange in flight included.
  const bool outer = trainer.config().islands > 1 && trainer.comm().rank() < trainer.group().size();
  // An exchange is in flight at a boundary only when --outer-delay streams them.
  const bool pending = outer && trainer.config().outer_delay > 0;
  if (trainer.offload() != nullptr) {
    uint64_t own = 0;
    for (const UnitState& u : trainer.state().units()) own += u.own.count();
    return kPendingAt + (pending ? 4 * own : 0);
  }
  // Islands in turn stage every island's shard; island 0's holds the outer state.
  uint64_t bytes = 0;
  for (int v = 0; v < trainer.hosted_islands(); ++v) {
    bytes += kStagingShardSlack;
    for (const safetensors::TensorDecl& t :
         shard_tensors(trainer.state(), outer && v == 0, pending && v == 0)) {
      uint64_t n = safetensors::element_size(t.type);
      for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
      bytes += n;
    }
  }
  return bytes;
}

AsyncSaver::AsyncSaver(RankTrainer& trainer, SaveStats& stats)
    : trainer_(trainer),
      staging_(trainer.ledger(), MemCategory::kCheckpointStaging,
               static_cast<size_t>(staging_bytes(trainer))),
      stats_(stats),
      writer_([this] { writer_loop(); }) {
  if (OffloadTier* tier = trainer_.offload()) {
    tier->set_before_write([this](size_t u) { wait_for_unit(u); });
  }
}

AsyncSaver::~AsyncSaver() {
  {
    MutexLock lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  writer_.join();
  if (OffloadTier* tier = trainer_.offload()) tier->set_before_write(nullptr);
}

void AsyncSaver::wait_for_unit(size_t u) {
  MutexLock lock(mu_);
  if (!reading_ || units_read_ > u) return;
  const Clock::time_point t0 = Clock::now();
  cv_.wait(mu_, [&]() REQUIRES(mu_) { return !reading_ || units_read_ > u; });
  update_waits_ += seconds_since(t0);
}

void AsyncSaver::start(int64_t step, std::vector<checkpoint::StepHistory> history) {
  if (writing()) throw std::logic_error("AsyncSaver::start with a save being written");
  const Clock::time_point t0 = Clock::now();
  CommPhaseScope phase(trainer_.comm().ledger(), CommPhase::kOther);
  const Tracer::Span span(trainer_.tracer(), "checkpoint copy", "checkpoint");
  ++stats_.requested;
  SaveTicket ticket = begin_save(trainer_, step);
  std::vector<Shard> shards;
  size_t at = 0;
  const bool from_offload = ticket.writer && trainer_.offload() != nullptr;
  if (from_offload) {
    shards.push_back(
        {.file = ticket.file,
         .tensors = shard_tensors(trainer_.state(), ticket.outer != nullptr, ticket.pending)});
  }
  if (from_offload && ticket.outer != nullptr && ticket.pending) {
    // The exchange in flight is rewritten by the next round's send: staged now.
    auto* pending = reinterpret_cast<float*>(staging_.data() + kPendingAt);
    for (size_t i = 0; i < trainer_.state().units().size(); ++i) {
      const size_t n = trainer_.state().units()[i].own.count();
      ticket.outer->pending_values(i, {pending, n});
      pending += n;
    }
  }
  for (int v = 0; ticket.writer && !from_offload && v < trainer_.hosted_islands(); ++v) {
    // Islands in turn: island v's shard is rank v N + r's (checkpoint_io.h).
    trainer_.activate_island(v);
    const OuterStep* outer = v == 0 ? ticket.outer : nullptr;
    const bool pending = v == 0 && ticket.pending;
    Shard shard{.file = v == 0
                            ? ticket.file
                            : ticket.temp / checkpoint::rank_file_name(v * trainer_.comm().size() +
                                                                       trainer_.comm().rank()),
                .tensors = shard_tensors(trainer_.state(), outer != nullptr, pending)};
    // Where the file's data section falls on its 4 KiB blocks, so the writer's O_DIRECT
    // writes go from here uncopied.
    const uint64_t header = safetensors::header_bytes(shard.tensors, shard_metadata());
    const auto address = reinterpret_cast<uintptr_t>(staging_.data() + at);
    at += static_cast<size_t>((header - address) % kStagingShardSlack);
    shard.begin = at;
    stream_shard(trainer_.state(), trainer_.store(), outer, pending,
                 [&](std::span<const std::byte> b) {
                   if (b.size() > staging_.size() - at) {
                     trainer_.activate_island(0);
                     throw std::logic_error("checkpoint staging: the shard outgrew its buffer");
                   }
                   stream_copy(staging_.data() + at, b.data(), b.size());
                   at += b.size();
                 });
    shard.bytes = at - shard.begin;
    shards.push_back(std::move(shard));
  }
  trainer_.activate_island(0);
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
  const auto base = static_cast<double>(trainer_.comm().size() + 1);
  const double sum = trainer_.comm().sum_control(
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
  CommPhaseScope phase(trainer_.comm().ledger(), CommPhase::kOther);
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
  Communicator& comm = trainer_.comm();
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
    meta = agree_save(trainer_, ticket, written);
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
    settle_commit(trainer_.config(), done.step, done.owner, any_failed,
                  any_failed ? first_error(trainer_.comm(), error) : "");
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
      std::string error =
          commit_save(trainer_.config(), trainer_.faults(), commit->ticket, commit->meta);
      if (Tracer* t = trainer_.tracer()) {
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
    if (Tracer* t = trainer_.tracer()) {
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

void AsyncSaver::write_from_offload(const Job& job, safetensors::Writer& out,
                                    const std::function<void()>& check) {
  OffloadTier& tier = *trainer_.offload();
  const ShardedState& state = trainer_.state();
  const auto at = reinterpret_cast<uintptr_t>(staging_.data());
  const std::span<std::byte> bounce(
      staging_.data() + ((at + kOffloadAlign - 1) / kOffloadAlign * kOffloadAlign - at),
      kCheckpointReadPiece);
  // The file's order (shard_tensors): per unit its params, master (16-bit), adam_m, adam_v
  // (8-bit: their codes, then the scales and fp32 parts memory holds).
  std::vector<unsigned> arrays{StateStore::kParams};
  if (!state.fp32()) arrays.push_back(StateStore::kMaster);
  arrays.push_back(StateStore::kAdamM);
  arrays.push_back(StateStore::kAdamV);
  const auto write = [&](std::span<const std::byte> b) {
    check();
    out.write(b);
  };
  const SaveTicket& t = *job.ticket;
  const auto* pending = reinterpret_cast<const float*>(staging_.data() + kPendingAt);
  for (size_t i = 0; i < state.units().size(); ++i) {
    const UnitState& u = state.units()[i];
    for (unsigned a : arrays) tier.read_out(i, a, u.opt_own, u.own.count(), bounce, write);
    // The update rewrites the scales with the codes, and a merge the outer weights with the
    // master: each waits for units_read_ below.
    if (state.int8_moments()) stream_int8_moments_in_memory(u, write);
    if (t.outer != nullptr) {
      write(std::as_bytes(t.outer->global(i)));
      write(std::as_bytes(t.outer->momentum(i)));
      if (t.pending) {
        write(std::as_bytes(std::span(pending, u.own.count())));
        pending += u.own.count();
      }
    }
    {
      MutexLock lock(mu_);
      units_read_ = i + 1;
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
  const int rank = trainer_.comm().rank();
  try {
    const auto check_abandoned = [&] {
      if (abandoning())
        throw IoError(fmt::format("the write of {} was abandoned", t.file.string()));
    };
    if (t.writer) {
      // A slow disk, injected: waited out unless the save is abandoned meanwhile.
      if (const double delay = trainer_.faults().shard_write_delay(t.step); delay > 0) {
        MutexLock lock(mu_);
        cv_.wait_for(mu_, std::chrono::duration<double>(delay),
                     [this]() REQUIRES(mu_) { return abandon_; });
      }
    }
    for (const Shard& shard : job.shards) {
      check_abandoned();
      trainer_.faults().shard_write_failure(t.step, shard.file);
      safetensors::Writer out(shard.file, shard.tensors, shard_metadata(),
                              safetensors::WriteMode::kDirect, safetensors::Digest::kCrc32c);
      if (job.from_offload) {
        write_from_offload(job, out, check_abandoned);
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
