// Stopping a run early and cleanly: a stop is requested from anywhere (a signal handler, a
// test), every rank learns of it in the step's control exchange, and all of them stop after
// the same step, save and report. docs/reliability.md, "Interrupts and outputs".
#pragma once

#include <csignal>
#include <string>

#include "core/error.h"
#include "core/stop_flag.h"

namespace zerodp {

// A stop requested before anything could be done to save (the first step not yet taken).
class Interrupted : public Error {
 public:
  Interrupted(const std::string& what, int signal) : Error(what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// request_stop, stop_requested and clear_stop_request: core/stop_flag.h, where the comm
// layer's simulated link reads the request too.

// SIGINT and SIGTERM request a stop; a second one ends the process at once with 128 +
// signal, for a user who does not want to wait for the step. Restores the previous
// handlers when it goes out of scope.
class StopOnSignals {
 public:
  StopOnSignals();
  ~StopOnSignals();
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// While true, the first SIGINT or SIGTERM ends the process at once with 128 + signal: the
// run is starting up and has nothing to save. The engine sets it from its start until its
// ranks reach their steps.
void set_nothing_to_save(bool nothing) noexcept;

// "SIGINT", "SIGTERM", or "signal N".
std::string signal_name(int signal);

}  // namespace zerodp
