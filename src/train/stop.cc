#include "train/stop.h"

#include <unistd.h>

#include <atomic>

#include <fmt/format.h>

namespace zerodp {
namespace {

std::atomic<bool> g_nothing_to_save{false};
static_assert(std::atomic<bool>::is_always_lock_free,
              "a signal handler may only touch lock-free atomics");

extern "C" void on_stop_signal(int signal) {
  const bool first = request_stop(signal);
  if (first && g_nothing_to_save.load()) {
    // Before the first step a stop request would wait for start-up to reach the step
    // loop, which can take long (a large plan, a slow disk) and which `timeout` cannot
    // shorten; there is nothing to save, so the run ends here.
    static constexpr char kMessage[] =
        "\nzerodp: interrupted before the first step, exiting now; nothing was trained\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    ::_exit(128 + signal);
  }
  if (!first) {
    // The second signal: the user will not wait for the step to end.
    static constexpr char kMessage[] = "\nzerodp: second signal, exiting now without saving\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    ::_exit(128 + signal);
  }
}

}  // namespace

void set_nothing_to_save(bool nothing) noexcept { g_nothing_to_save.store(nothing); }

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
