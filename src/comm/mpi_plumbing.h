// The MPI backend's plumbing, shared by its transport (mpi_transport.cc) and its session
// (mpi_session.cc): one mutex that serializes every MPI call of the process
// (MPI_THREAD_SERIALIZED), errors turned into CommError, and the polled wait every collective uses.
// Internal to src/comm: it includes <mpi.h>, which only the backend's .cc files see.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "core/mutex.h"

namespace zerodp::mpi_detail {

using Clock = std::chrono::steady_clock;

// Serializes every MPI call of the process.
Mutex& mpi_mutex();
std::string mpi_error_string(int code);
// Throws CommError naming `what` when an MPI call failed. Called with the mutex held.
void check_mpi(int code, std::string_view what, std::string_view call) REQUIRES(mpi_mutex());
std::string_view thread_level_name(int level);
// A count handed to MPI (a piece of at most the chunk size, or a rank number) as its int.
int to_int(size_t n);

enum class PollResult { kDone, kTimedOut, kNotice, kAborted };

// Polls `requests` until all completed, `deadline` passed, `notice` (when not null)
// completed, or `*aborted` (when not null) became true. Completed requests become
// MPI_REQUEST_NULL. Takes the mutex for each poll.
PollResult poll(std::vector<MPI_Request>& requests, MPI_Request* notice, MPI_Status* notice_status,
                const std::atomic<bool>* aborted, Clock::time_point deadline, std::string_view what)
    EXCLUDES(mpi_mutex());
Clock::time_point deadline_after(double seconds);
// Cancels or frees the point-to-point requests a failed collective left pending.
void release_pending(std::vector<MPI_Request>& requests) EXCLUDES(mpi_mutex());

// The communicators of this process's `threads` rank threads (process `process` of
// `processes`, hosting ranks process * threads ..), over `comm`, which they take over: a
// duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN (mpi_transport.cc).
std::vector<std::unique_ptr<Communicator>> make_process_communicators(MPI_Comm comm, int threads,
                                                                      int process, int processes,
                                                                      const CommOptions& options,
                                                                      size_t chunk_bytes);

}  // namespace zerodp::mpi_detail
