#include "comm/launch.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

#include <fmt/core.h>

#include "comm/local.h"
#include "comm/mpi.h"
#include "core/error.h"

namespace zerodp {

std::optional<Backend> parse_backend(std::string_view name) {
  if (name == "local") return Backend::kLocal;
  if (name == "mpi") return Backend::kMpi;
  return std::nullopt;
}

Backend parse_backend_flag(std::string_view text, std::string_view flag) {
  if (const auto b = parse_backend(text)) return *b;
  throw InvalidArgument(fmt::format("{} '{}' is unknown; use local or mpi", flag, text));
}

std::string_view backend_name(Backend b) { return b == Backend::kLocal ? "local" : "mpi"; }

namespace {

// Set by launchers in every process they start: OpenMPI, then MPICH/Hydra and PMIx.
constexpr const char* kLauncherSizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};

}  // namespace

void check_launch_environment(const LaunchOptions& options) {
  if (options.backend != Backend::kLocal) return;
  for (const char* name : kLauncherSizes) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    char* end = nullptr;
    const long size = std::strtol(value, &end, 10);
    if (end != value && size > 1) {
      throw InvalidArgument(fmt::format(
          "this process is one of {} started by an MPI launcher ({}={}), but --backend is "
          "local: each process would train alone and overwrite the others' outputs; pass "
          "--backend mpi",
          size, name, value));
    }
  }
}

void launch(const LaunchOptions& options, int& argc, char**& argv,
            const std::function<void(Communicator&)>& fn) {
  if (options.backend == Backend::kLocal) {
    check_launch_environment(options);
    if (options.ranks < 1) {
      throw InvalidArgument(fmt::format(
          "--ranks {} is invalid; the local backend needs 1 or more ranks", options.ranks));
    }
    run_local(options.ranks, options.comm, fn);
    return;
  }
  MpiSession session(argc, argv);
  if (options.ranks != 0 && options.ranks != session.size()) {
    throw InvalidArgument(fmt::format(
        "--ranks {} does not match the MPI job's {} processes; omit --ranks under mpirun or "
        "pass -np {}",
        options.ranks, session.size(), options.ranks));
  }
  std::unique_ptr<Communicator> comm = session.make_communicator(options.comm);
  try {
    fn(*comm);
  } catch (const std::exception& e) {
    fmt::print(stderr, "zerodp: rank {} of {}: {}\n", session.rank(), session.size(), e.what());
    std::fflush(stderr);
    // Peers learn the reason at once; MPI_Abort then ends every process.
    comm->abort(e.what());
    session.abort_job(options.mpi_exit_code ? options.mpi_exit_code(e) : 1);
  }
  comm.reset();
}

}  // namespace zerodp
