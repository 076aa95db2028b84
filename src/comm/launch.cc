#include "comm/launch.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "comm/local.h"
#include "comm/mpi.h"
#include "comm/process_watch.h"
#include "comm/world_shape.h"
#include "core/error.h"
#include "core/sysinfo.h"

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

namespace {

// The world's options once its size is known: islands are nodes unless --node-ranks said
// otherwise.
CommOptions world_options(const LaunchOptions& options, int world) {
  CommOptions o = options.comm;
  if (options.islands > 1 && o.node_ranks == 0 && world % options.islands == 0) {
    o.node_ranks = world / options.islands;
  }
  return o;
}

// The MPI job's rank count (its processes x --ranks-per-process), checked against --ranks
// when that was given.
int mpi_world(const LaunchOptions& options, int processes) {
  const int per_process = options.ranks_per_process;
  const int world = processes * per_process;
  if (options.ranks != 0 && options.ranks != world) {
    throw InvalidArgument(
        per_process == 1
            ? fmt::format("--ranks {} does not match the MPI job's {} processes; omit --ranks "
                          "under mpirun or pass -np {}",
                          options.ranks, processes, options.ranks)
            : fmt::format("--ranks {} does not match the MPI job's {} processes x "
                          "--ranks-per-process {} = {} ranks; omit --ranks under mpirun",
                          options.ranks, processes, per_process, world));
  }
  return world;
}

// Which of a process's rank threads failed first in cause (errors.size() when none did): the
// first whose error is its own, else the first that failed. A CommError only repeats a peer's
// failure, so it is a rank's own error only when it is a CommTimeout, which the rank
// diagnosed itself.
size_t root_cause(const std::vector<std::exception_ptr>& errors) {
  size_t cause = errors.size();
  bool cause_is_own = false;
  for (size_t l = 0; l < errors.size(); ++l) {
    if (!errors[l] || cause_is_own) continue;
    bool own = true;
    try {
      std::rethrow_exception(errors[l]);
    } catch (const CommTimeout&) {
    } catch (const CommError&) {
      own = false;
    } catch (...) {
    }
    if (cause == errors.size() || own) {
      cause = l;
      cause_is_own = own;
    }
  }
  return cause;
}

}  // namespace

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
  check_process_ranks(options.ranks_per_process, /*mpi=*/true, options.comm.node_ranks,
                      /*processes=*/0);
  const int per_process = options.ranks_per_process;
  if (per_process > 1) check_startable_threads(per_process);
  MpiSession session(argc, argv);
  const int world = mpi_world(options, session.size());
  std::optional<ProcessWatch> watch;
  if (session.size() > 1) watch.emplace(session, per_process);
  std::vector<std::unique_ptr<Communicator>> comms =
      session.make_communicators(world_options(options, world), per_process);
  // Processes on several hosts: a failure names the host it happened on (mpirun's own lines
  // name the launcher's view of it, an address), and peers repeat it with the reason.
  const std::string host = host_name();
  const auto reason = [&](const char* what) { return fmt::format("on {}: {}", host, what); };
  auto fail = [&](int rank, const std::exception& e) {
    // This process names its own failure; its peers must not report it lost as well.
    if (watch) watch->goodbye();
    fmt::print(stderr, "zerodp: rank {} of {} on {}: {}\n", rank, world, host, e.what());
    std::fflush(stderr);
    // A failure another rank caused (not a timeout, which this rank diagnosed itself) lets
    // that rank's abort set the job's exit status.
    const auto* comm_error = dynamic_cast<const CommError*>(&e);
    const bool consequence = comm_error != nullptr &&
                             dynamic_cast<const CommTimeout*>(&e) == nullptr &&
                             comm_error->failed_rank() >= 0 && comm_error->failed_rank() != rank;
    session.abort_job(options.mpi_exit_code ? options.mpi_exit_code(e) : 1, consequence);
  };
  if (per_process == 1) {
    try {
      fn(*comms[0]);
    } catch (const std::exception& e) {
      // Peers learn the reason at once; MPI_Abort then ends every process.
      comms[0]->abort(reason(e.what()));
      fail(comms[0]->rank(), e);
    }
    comms.clear();
    return;
  }
  if (const int cores = usable_cores(); cores < per_process) {
    // Not an error: oversubscribed ranks still train, only slower.
    fmt::print(stderr,
               "zerodp: warning: process {} runs {} ranks but may use {} core(s) (its CPU "
               "affinity; mpirun binds each process to one core by default for 2 or fewer "
               "processes): start it with --bind-to none, or --map-by ppr:1:node:pe={}\n",
               session.rank(), per_process, cores, per_process);
  }
  // Ranks as threads, as run_local runs them; the first to fail aborts the others.
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t l = 0; l < comms.size(); ++l) {
    threads.emplace_back([&, l] {
      Communicator& comm = *comms[l];
      try {
        fn(comm);
      } catch (const std::exception& e) {
        errors[l] = std::current_exception();
        comm.abort(reason(e.what()));
      } catch (...) {
        errors[l] = std::current_exception();
        comm.abort(reason("unknown exception"));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (const size_t cause = root_cause(errors); cause < errors.size()) {
    try {
      std::rethrow_exception(errors[cause]);
    } catch (const std::exception& e) {
      fail(comms[cause]->rank(), e);
    } catch (...) {
      fail(comms[cause]->rank(), Error("unknown exception"));
    }
  }
  comms.clear();
}

}  // namespace zerodp
