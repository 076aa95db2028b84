// --trace FILE: a Chrome trace-event file (chrome://tracing, Perfetto) of each rank's
// training: compute spans (forward and backward per unit, the optimizer, verdicts,
// checkpoints) on one row, the collectives on another, so overlap can be seen.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"

#include "core/mutex.h"

namespace zerodp {

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kComputeRow = 0;
  static constexpr int kCommRow = 1;
  static constexpr int kCheckpointRow = 2;  // --checkpoint-async's writer
  // A run keeps at most this many events per rank; later ones are counted, not kept.
  static constexpr size_t kMaxEvents = size_t{1} << 20;

  explicit Tracer(int rank) : rank_(rank) {}

  // Thread-safe: the compute thread and the communication thread both record.
  void record(std::string name, const char* category, Clock::time_point start,
              Clock::time_point end, int row) EXCLUDES(mu_);
  // Sends `comm`'s collectives here (the comm row).
  void attach(Communicator& comm);

  // A compute span from construction to destruction; a null tracer records nothing.
  class Span {
   public:
    Span(Tracer* t, std::string name, const char* category = "compute")
        : t_(t),
          name_(t ? std::move(name) : std::string()),
          category_(category),
          start_(t ? Clock::now() : Clock::time_point()) {}
    ~Span() {
      if (t_) t_->record(std::move(name_), category_, start_, Clock::now(), kComputeRow);
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Tracer* t_;
    std::string name_;
    const char* category_;
    Clock::time_point start_;
  };

  int rank() const { return rank_; }
  uint64_t dropped() const EXCLUDES(mu_);

  // The events as trace-event JSON objects (one per line, without the surrounding array).
  std::vector<std::string> events() const EXCLUDES(mu_);

 private:
  struct Event {
    std::string name;
    const char* category;
    int64_t ts_us;
    int64_t dur_us;
    int row;
  };
  int rank_;
  mutable Mutex mu_;
  std::vector<Event> events_ GUARDED_BY(mu_);
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
};

// Writes one trace file holding every tracer's events (each rank is a process row).
// Throws IoError naming the path.
void write_trace(const std::filesystem::path& path, std::span<const Tracer* const> tracers);

}  // namespace zerodp
