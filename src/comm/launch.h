// Starting the ranks of a job on either backend, with one failure policy.
//
// local: `ranks` threads in this process; if one throws, the others' collectives fail
//        naming it and launch() rethrows the root cause.
// mpi:   this process hosts ranks_per_process ranks of an mpirun job (one on the caller's
//        thread, or that many threads); `ranks` must be 0 or equal the job's size times
//        ranks_per_process. If fn throws, the error is printed as "rank R: <reason>" and the
//        whole job is ended with the exit code `mpi_exit_code` gives for the error
//        (MPI_Abort), so no rank hangs and the job's status still says what kind of failure
//        it was.
#pragma once

#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "comm/communicator.h"

namespace zerodp {

enum class Backend { kLocal, kMpi };
std::optional<Backend> parse_backend(std::string_view name);
// The same for a flag's value: throws InvalidArgument "--backend 'tcp' is unknown; use local
// or mpi".
Backend parse_backend_flag(std::string_view text, std::string_view flag = "--backend");
std::string_view backend_name(Backend b);

struct LaunchOptions {
  Backend backend = Backend::kLocal;
  int ranks = 2;  // local: thread count; mpi: 0 = the job's size x ranks_per_process, else
                  // must equal it
  // mpi: ranks each process hosts, as threads (MpiSession::make_communicators).
  int ranks_per_process = 1;
  CommOptions comm;
  // DiLoCo's islands (train --islands): with comm.node_ranks 0, each island of
  // world / islands ranks is a node, as the engine's islands take them.
  int islands = 1;
  // Exit status of an MPI job ended by an error; null: 1 for every error.
  std::function<int(const std::exception&)> mpi_exit_code = nullptr;
};

void launch(const LaunchOptions& options, int& argc, char**& argv,
            const std::function<void(Communicator&)>& fn);

// Refuses (InvalidArgument) a local-backend run that an MPI launcher started as one of
// several processes: each would train alone, on the same data, into the same outputs.
// launch() checks it; callers with work to do before launching check it first.
void check_launch_environment(const LaunchOptions& options);

}  // namespace zerodp
