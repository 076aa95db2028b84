// The process's stop request: set from anywhere (a signal handler, a test), read by the
// training loop at step boundaries (train/stop.h) and by the comm layer's simulated link,
// whose waits it cuts short so that a stop never waits out a slow simulated network. It
// lives here, below both, because comm must not depend on train.
#pragma once

namespace zerodp {

// Async-signal-safe: one lock-free compare-exchange, so a handler may call it. The first
// request wins; later ones do not overwrite it. True when this call made the request (no
// other was pending).
bool request_stop(int signal) noexcept;
// The signal of the pending request, 0 when none.
int stop_requested() noexcept;
// Forgets a request (tests run several trainings in one process).
void clear_stop_request() noexcept;

}  // namespace zerodp
