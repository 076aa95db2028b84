// The `mpi` backend in a build without MPI (cmake -DZERODP_WITH_MPI=OFF, or no MPI found):
// it reports itself unavailable and every entry point says how to get it.
#include "comm/mpi.h"
#include "core/error.h"

namespace zerodp {
namespace {

constexpr const char* kUnavailable =
    "the mpi backend is not available: this zerodp was built without MPI; install "
    "libopenmpi-dev (or libmpich-dev), reconfigure with -DZERODP_WITH_MPI=ON and rebuild, "
    "or use the local backend";

}  // namespace

bool mpi_backend_available() { return false; }

MpiSession::MpiSession(int& /*argc*/, char**& /*argv*/) { throw InvalidArgument(kUnavailable); }

MpiSession::~MpiSession() = default;

// No session can exist in this build, so these are unreachable; they throw all the same.
std::vector<std::string> MpiSession::allgather_text(const std::string& /*mine*/) {
  throw InvalidArgument(kUnavailable);
}

std::unique_ptr<Communicator> MpiSession::make_communicator(const CommOptions& /*options*/) {
  throw InvalidArgument(kUnavailable);
}

std::vector<std::unique_ptr<Communicator>> MpiSession::make_communicators(
    const CommOptions& /*options*/, int /*ranks_per_process*/) {
  throw InvalidArgument(kUnavailable);
}

void MpiSession::abort_job(int /*code*/, bool /*consequence*/) {
  throw InvalidArgument(kUnavailable);
}

}  // namespace zerodp
