#include "train/trace.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "core/units.h"

namespace zerodp {

namespace {

int64_t micros(Tracer::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

void Tracer::record(std::string name, const char* category, Clock::time_point start,
                    Clock::time_point end, int row) {
  MutexLock lock(mu_);
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back({std::move(name), category, micros(start), micros(end) - micros(start), row});
}

void Tracer::attach(Communicator& comm) {
  comm.set_trace_hook(
      [this](CommKind kind, uint64_t bytes, Clock::time_point start, Clock::time_point end) {
        record(fmt::format("{} {}", comm_kind_name(kind), format_bytes(static_cast<double>(bytes))),
               "comm", start, end, kCommRow);
      });
}

uint64_t Tracer::dropped() const {
  MutexLock lock(mu_);
  return dropped_;
}

std::vector<std::string> Tracer::events() const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  out.reserve(events_.size() + 3);
  const auto meta = [&](const char* what, int tid, const std::string& name) {
    nlohmann::json j{
        {"name", what}, {"ph", "M"}, {"pid", rank_}, {"tid", tid}, {"args", {{"name", name}}}};
    out.push_back(j.dump());
  };
  meta("process_name", 0, fmt::format("rank {}", rank_));
  meta("thread_name", kComputeRow, "compute");
  meta("thread_name", kCommRow, "collectives");
  meta("thread_name", kCheckpointRow, "checkpoint writer");
  for (const Event& e : events_) {
    nlohmann::json j{{"name", e.name},  {"cat", e.category}, {"ph", "X"},   {"ts", e.ts_us},
                     {"dur", e.dur_us}, {"pid", rank_},      {"tid", e.row}};
    out.push_back(j.dump());
  }
  return out;
}

void write_trace(const std::filesystem::path& path, std::span<const Tracer* const> tracers) {
  std::string text = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  for (const Tracer* t : tracers) {
    for (const std::string& e : t->events()) {
      if (!first) text += ",\n";
      text += e;
      first = false;
    }
  }
  text += "\n]}\n";
  files::write_output("--trace", path, text);
}

}  // namespace zerodp
