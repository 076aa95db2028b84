#include "train/stop.h"

#include <unistd.h>

#include <fmt/format.h>

namespace zerodp {
namespace {

extern "C" void on_stop_signal(int signal) {
  if (!request_stop(signal)) {
    // The second signal: the user will not wait for the step to end.
    static constexpr char kMessage[] = "\nzerodp: second signal, exiting now without saving\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    ::_exit(128 + signal);
  }
}

}  // namespace

StopOnSignals::StopOnSignals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // The request is polled (at step boundaries, and in the simulated link's sliced waits), so
  // interrupted system calls simply resume.
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

StopOnSignals::~StopOnSignals() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

std::string signal_name(int signal) {
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGTERM) return "SIGTERM";
  return fmt::format("signal {}", signal);
}

}  // namespace zerodp
