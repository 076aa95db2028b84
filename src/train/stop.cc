#include "train/stop.h"

#include <unistd.h>

#include <atomic>

#include <fmt/format.h>

namespace zerodp {
namespace {

std::atomic<int> g_stop{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "a signal handler may only touch lock-free atomics");

extern "C" void on_stop_signal(int signal) {
  int none = 0;
  if (!g_stop.compare_exchange_strong(none, signal)) {
    // The second signal: the user will not wait for the step to end.
    static constexpr char kMessage[] = "\nzerodp: second signal, exiting now without saving\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    ::_exit(128 + signal);
  }
}

}  // namespace

void request_stop(int signal) {
  int none = 0;
  g_stop.compare_exchange_strong(none, signal);
}

int stop_requested() { return g_stop.load(std::memory_order_relaxed); }

void clear_stop_request() { g_stop.store(0); }

StopOnSignals::StopOnSignals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // The request is read at step boundaries, so interrupted system calls simply resume.
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
