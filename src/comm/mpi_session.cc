// The MPI backend's session (comm/mpi.h): MPI's life in the process, and the communicators
// of its rank threads, each a TransportCommunicator (comm/collectives.h) over the MPI
// transport (mpi_transport.cc).

// Keep the deprecated C++ bindings out: they are not used and warn under -Wall.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "comm/mpi.h"
#include "comm/mpi_plumbing.h"
#include "comm/transport.h"
#include "comm/world_shape.h"
#include "core/error.h"

namespace zerodp {
namespace {

using namespace mpi_detail;

// Default upper bound of one message, and of one reduce-scatter round per peer. Large enough
// that per-message overhead is noise, small enough to bound the scratch buffer.
constexpr size_t kDefaultChunkBytes = size_t{8} << 20;
constexpr size_t kMaxChunkBytes = size_t{1} << 30;  // below INT_MAX: MPI 3 counts are int
constexpr const char* kChunkEnv = "ZERODP_MPI_CHUNK_BYTES";
// Reads ZERODP_MPI_CHUNK_BYTES (tests set it small to exercise the split paths).
size_t chunk_bytes_from_env() {
  const char* text = std::getenv(kChunkEnv);
  if (text == nullptr || *text == '\0') return kDefaultChunkBytes;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || value == 0 || value > kMaxChunkBytes || text[0] == '-') {
    throw InvalidArgument(fmt::format("{}={} is not a valid chunk size; use a byte count in 1..{}",
                                      kChunkEnv, text, kMaxChunkBytes));
  }
  return static_cast<size_t>(value);
}

}  // namespace

bool mpi_backend_available() { return true; }

MpiSession::MpiSession(int& argc, char**& argv) {
  MutexLock lock(mpi_mutex());
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    throw InvalidArgument(
        "mpi: MPI is already initialized in this process; create one MpiSession per process");
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    throw CommError(fmt::format("mpi: the MPI library provides {}, zerodp needs "
                                "MPI_THREAD_SERIALIZED or better (collectives run on a "
                                "communication thread); use an MPI built with thread support",
                                thread_level_name(provided)),
                    -1);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() {
  MutexLock lock(mpi_mutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::vector<std::string> MpiSession::allgather_text(const std::string& mine) {
  constexpr size_t kSlot = 256;
  std::vector<char> out(kSlot, '\0');
  std::copy_n(mine.data(), std::min(mine.size(), kSlot - 1), out.begin());
  std::vector<char> all(kSlot * static_cast<size_t>(size_), '\0');
  {
    MutexLock lock(mpi_mutex());
    MPI_Allgather(out.data(), static_cast<int>(kSlot), MPI_CHAR, all.data(),
                  static_cast<int>(kSlot), MPI_CHAR, MPI_COMM_WORLD);
  }
  std::vector<std::string> texts;
  for (int p = 0; p < size_; ++p) texts.emplace_back(all.data() + static_cast<size_t>(p) * kSlot);
  return texts;
}

std::unique_ptr<Communicator> MpiSession::make_communicator(const CommOptions& options) {
  return std::move(make_communicators(options, 1).front());
}

std::vector<std::unique_ptr<Communicator>> MpiSession::make_communicators(
    const CommOptions& options, int ranks_per_process) {
  if (!(options.timeout_seconds > 0)) {
    throw InvalidArgument(
        fmt::format("mpi: timeout_seconds is {}; a collective's timeout must be positive",
                    options.timeout_seconds));
  }
  const int t = ranks_per_process;
  check_process_ranks(t, /*mpi=*/true, options.node_ranks, size_);
  const size_t chunk_bytes = chunk_bytes_from_env();
  const auto deadline = deadline_after(options.timeout_seconds);
  constexpr std::string_view what = "mpi: creating a communicator";

  // A private duplicate of MPI_COMM_WORLD: its traffic cannot meet anyone else's.
  // MPI_Comm_idup rather than MPI_Comm_dup, so the mutex is not held while ranks gather.
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
  {
    MutexLock lock(mpi_mutex());
    check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, &comm, requests.data()), what, "MPI_Comm_idup");
  }
  if (poll(requests, nullptr, nullptr, nullptr, deadline, what) != PollResult::kDone) {
    throw CommTimeout(fmt::format("{} on rank {} timed out after {} s: not every rank called "
                                  "make_communicator",
                                  what, rank_, options.timeout_seconds),
                      -1);
  }
  auto free_comm = [&comm] {
    MutexLock lock(mpi_mutex());
    MPI_Comm_free(&comm);
  };
  try {
    {
      MutexLock lock(mpi_mutex());
      check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), what, "MPI_Comm_set_errhandler");
    }
    // Every rank must split messages the same way: agree on the chunk size.
    std::vector<uint64_t> chunks(static_cast<size_t>(size_));
    const uint64_t mine = chunk_bytes;
    requests.assign(1, MPI_REQUEST_NULL);
    {
      MutexLock lock(mpi_mutex());
      check_mpi(MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, chunks.data(), sizeof mine, MPI_BYTE,
                               comm, requests.data()),
                what, "MPI_Iallgather");
    }
    if (poll(requests, nullptr, nullptr, nullptr, deadline, what) != PollResult::kDone) {
      throw CommTimeout(fmt::format("{} on rank {} timed out after {} s agreeing on the chunk size",
                                    what, rank_, options.timeout_seconds),
                        -1);
    }
    for (int r = 0; r < size_; ++r) {
      if (chunks[static_cast<size_t>(r)] != mine) {
        throw InvalidArgument(
            fmt::format("{}: {} is {} on rank {} but {} on rank {}; set it the same on every rank",
                        what, kChunkEnv, mine, rank_, chunks[static_cast<size_t>(r)], r));
      }
    }
    // Tags carry both ends' local indices: T^2 of them per kind must fit MPI's tag range.
    void* attribute = nullptr;
    int found = 0;
    {
      MutexLock lock(mpi_mutex());
      check_mpi(MPI_Comm_get_attr(comm, MPI_TAG_UB, &attribute, &found), what, "MPI_Comm_get_attr");
    }
    const long long tag_ub = found ? *static_cast<int*>(attribute) : 32767;
    const long long needed = static_cast<long long>(kPhaseCount) * t * t - 1;
    if (needed > tag_ub) {
      throw InvalidArgument(fmt::format(
          "--ranks-per-process {} needs message tags up to {}, but this MPI's largest is {}; "
          "use at most {} ranks per process",
          t, needed, tag_ub,
          static_cast<int>(std::sqrt(static_cast<double>(tag_ub + 1) / kPhaseCount))));
    }
  } catch (...) {
    free_comm();
    throw;
  }
  return make_process_communicators(comm, t, rank_, size_, options, chunk_bytes);
}

// Ends holding the MPI mutex on purpose (checked: the analysis knows std::abort never returns).
void MpiSession::abort_job(int code, bool consequence) {
  // Launchers forward output asynchronously, and MPICH's Hydra drops what a rank printed
  // just before MPI_Abort about one time in ten: give the reason a moment to get out.
  std::fflush(stdout);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(consequence ? 1200 : 200));
  // Held until the process ends: no other thread may enter MPI meanwhile.
  mpi_mutex().lock();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; if it ever did, the job must still end
}

}  // namespace zerodp
