// mpi_plumbing.h is the contract.
#include "comm/mpi_plumbing.h"

#include <algorithm>
#include <climits>
#include <thread>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp::mpi_detail {

// Serializes every MPI call of the process (MPI_THREAD_SERIALIZED).
Mutex& mpi_mutex() {
  static Mutex m;
  return m;
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(length));
}

// Throws CommError naming `what` when an MPI call failed. Called with the mutex held.
void check_mpi(int code, std::string_view what, std::string_view call) {
  if (code == MPI_SUCCESS) return;
  throw CommError(fmt::format("{}: {} failed: {} (do all ranks call the same collectives, in "
                              "the same order, with the same counts?)",
                              what, call, mpi_error_string(code)),
                  -1);
}

std::string_view thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown thread level";
  }
}

int to_int(size_t n) {
  // Every count handed to MPI is a piece of at most kMaxChunkBytes or a rank number.
  return static_cast<int>(std::min(n, static_cast<size_t>(INT_MAX)));
}

// Polls `requests` until all completed, `deadline` passed, `notice` (when not null)
// completed, or `*aborted` (when not null) became true. Spins briefly, then yields, then sleeps
// between polls, so ranks oversubscribed on few cores do not starve each other. Completed requests
// become MPI_REQUEST_NULL.
PollResult poll(std::vector<MPI_Request>& requests, MPI_Request* notice, MPI_Status* notice_status,
                const std::atomic<bool>* aborted, Clock::time_point deadline,
                std::string_view what) {
  std::vector<int> indices(requests.size());
  for (long spins = 0;; ++spins) {
    {
      MutexLock lock(mpi_mutex());
      if (!requests.empty()) {
        int done = 0;
        check_mpi(MPI_Testsome(to_int(requests.size()), requests.data(), &done, indices.data(),
                               MPI_STATUSES_IGNORE),
                  what, "MPI_Testsome");
        if (done == MPI_UNDEFINED) requests.clear();  // every request was already null
      }
      if (notice != nullptr && *notice != MPI_REQUEST_NULL) {
        int arrived = 0;
        check_mpi(MPI_Test(notice, &arrived, notice_status), what, "MPI_Test (abort notice)");
        if (arrived) return PollResult::kNotice;
      }
    }
    if (std::all_of(requests.begin(), requests.end(),
                    [](MPI_Request r) { return r == MPI_REQUEST_NULL; })) {
      return PollResult::kDone;
    }
    if (aborted != nullptr && aborted->load()) return PollResult::kAborted;
    if (Clock::now() > deadline) return PollResult::kTimedOut;
    if (spins > 4000) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else if (spins > 400) {
      std::this_thread::yield();
    }
  }
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Releases point-to-point requests left pending by a failed collective: each is cancelled
// (so a late message is not written into a receive buffer the caller may free by now) and,
// if the cancel does not complete it at once (a send MPI cannot recall, a receive already
// matched), freed to complete on its own. Requests of nonblocking collectives may be neither
// cancelled nor freed: callers drop those.
void release_pending(std::vector<MPI_Request>& requests) {
  MutexLock lock(mpi_mutex());
  for (MPI_Request& request : requests) {
    if (request == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&request);
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) MPI_Request_free(&request);
  }
}

}  // namespace zerodp::mpi_detail
