// The `mpi` backend: one rank per process, launched by mpirun/srun.
//
// MPI moves bytes only (it has no 16-bit types and fixes no summation order); reductions
// happen locally with comm/reduce.h, so results equal the local backend's bit for bit.
// <mpi.h> is included by the backend's .cc only. When zerodp is built without MPI the
// functions here throw InvalidArgument saying so.
//
// Wire: point-to-point messages of bytes, each at most ZERODP_MPI_CHUNK_BYTES (default
// 8 MiB; the environment variable must be equal on every rank), so buffers of any size
// work with MPI 3's int counts. A flat or two-level reduce-scatter works in rounds of one
// chunk per peer and holds that many chunks of scratch; qgZ's quantized one exchanges whole
// ranges (its blocks start at each range's start) and holds their packed bytes; the
// all-gathers receive straight into the output. Each
// rank receives the bytes its CommLedger records (a broadcast uses MPI_Ibcast, whose
// algorithm is MPI's). The algorithms are comm/collectives.cc's; the transport is
// mpi_transport.cc.
//
// Failure: a collective that waits past CommOptions::timeout_seconds throws CommTimeout
// naming the ranks whose messages did not arrive. abort(reason) sends the reason to every
// peer, whose pending and next collectives then throw CommError naming this rank; this
// rank's own pending collective stops waiting too. After any failure the communicator
// refuses further collectives. Messages of the failed collective may still be in flight,
// so the job should end: the launcher prints "rank R: <reason>" and calls abort_job(),
// which takes every process down.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace zerodp {

// Whether this build has the MPI backend.
bool mpi_backend_available();

// Initializes MPI for the life of the object (thread level MPI_THREAD_SERIALIZED or better:
// collectives run on a communication thread; CommError if the library offers less) and
// finalizes it at the end. One per process; destroy its communicators first.
class MpiSession {
 public:
  MpiSession(int& argc, char**& argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // A communicator over all processes of the job, on its own duplicate of MPI_COMM_WORLD.
  // Collective: every rank calls it, in the same order. Throws InvalidArgument for a bad
  // timeout or chunk size (or chunk sizes that differ between ranks), CommTimeout if not
  // every rank arrives within the timeout.
  std::unique_ptr<Communicator> make_communicator(const CommOptions& options = {});
  // T = ranks_per_process ranks in this process, to be driven by T threads (one each): the
  // world is size() * T ranks, process p hosting ranks p * T .. p * T + T - 1. The ranks of
  // one process meet at a barrier and read each other's buffers in place; only bytes for
  // other processes go through MPI, so results are the same bits as with one rank per
  // process. A process's ranks must share a node (T divides options.node_ranks), or be the
  // whole job (one process).
  // Collective like make_communicator, and each of the T must be destroyed before the
  // session.
  std::vector<std::unique_ptr<Communicator>> make_communicators(const CommOptions& options,
                                                                int ranks_per_process);
  // Every process's `mine` (its first 255 bytes), in process order, over MPI_COMM_WORLD:
  // start-up facts (hosts, addresses) exchanged before any communicator exists. Collective.
  std::vector<std::string> allgather_text(const std::string& mine);
  // Ends every process of the job with `code` (MPI_Abort). The caller prints the reason,
  // naming its rank, first. `consequence`: this process failed because a peer did, whose
  // own MPI_Abort (and exit code: the job's status names the root cause) should come first,
  // so this one waits a second longer.
  [[noreturn]] void abort_job(int code, bool consequence = false);

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace zerodp
