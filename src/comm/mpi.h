// The `mpi` backend: one rank per process, launched by mpirun/srun.
//
// MPI moves bytes only (it has no 16-bit types and fixes no summation order); reductions
// happen locally with comm/reduce.h, so results equal the local backend's bit for bit.
// <mpi.h> is included by the backend's .cc only. When zerodp is built without MPI the
// functions here throw InvalidArgument saying so.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace zerodp {

// Whether this build has the MPI backend.
bool mpi_backend_available();

// Initializes MPI for the life of the object (thread level MPI_THREAD_SERIALIZED or better:
// collectives run on a communication thread) and finalizes it at the end.
class MpiSession {
 public:
  MpiSession(int& argc, char**& argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // A communicator over all processes of the job.
  std::unique_ptr<Communicator> make_communicator(const CommOptions& options = {});
  // Ends every process of the job with `code` (MPI_Abort). The caller prints the reason,
  // naming its rank, first.
  [[noreturn]] void abort_job(int code);

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace zerodp
