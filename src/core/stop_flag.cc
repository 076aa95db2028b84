#include "core/stop_flag.h"

#include <atomic>

namespace zerodp {
namespace {

std::atomic<int> g_stop{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "a signal handler may only touch lock-free atomics");

}  // namespace

bool request_stop(int signal) noexcept {
  int none = 0;
  return g_stop.compare_exchange_strong(none, signal);
}

int stop_requested() noexcept { return g_stop.load(std::memory_order_relaxed); }

void clear_stop_request() noexcept { g_stop.store(0); }

}  // namespace zerodp
