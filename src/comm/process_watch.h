// Naming a process that died under mpirun.
//
// A process that is killed (SIGKILL, the OOM killer, its host going down) takes part in no
// protocol: its peers block in a collective until mpirun's teardown kills them too, and the
// only line the user gets is mpirun's ("process rank 1 with PID 0 on node 10.0.0.2 exited
// on signal 9"), which names an MPI process by the launcher's view of its host, not zerodp's
// ranks. A ProcessWatch is one TCP connection from every process to process 0, used for
// nothing but to close: the kernel closes a dead process's sockets at once, on any host, so
// process 0 names the lost process, its ranks and its host (and every other process names
// process 0 if that is the one lost) within milliseconds, before the teardown reaches it.
// A normal end says goodbye first, so it is never taken for a loss.
//
// Process 0 listens only on the addresses its peers reach it at (loopback for a peer on its
// own host, the interface its route to a peer leaves by for one elsewhere), and only a
// connection that opens with the job's token (random, made by process 0 and shared over MPI,
// which strangers do not see) and the number of a process it still waits for counts.
// Anything else is closed and forgotten; a connection that says nothing is dropped after a
// second, while the real peers' connections are read beside it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi.h"

namespace zerodp {

class ProcessWatch {
 public:
  // Runs on every process but 0 with the address and port it is about to join process 0's
  // watch at, just before it does: tests connect there as a stranger would, first.
  using BeforeJoin = std::function<void(const std::string& address, int port)>;

  // Collective over the session's processes, before any communicator. Never fails the job:
  // where a connection cannot be made it says so once and watches the rest.
  ProcessWatch(MpiSession& session, int ranks_per_process, const BeforeJoin& before_join = {});
  ~ProcessWatch();  // goodbye(), then the watcher stops
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  // This process is ending (done, or failing with its own message): closed connections are
  // no longer losses, and peers are told not to report this one.
  void goodbye();

 private:
  struct Peer {
    int process = 0;
    int fd = -1;
    bool done = false;  // said goodbye, or already reported
  };
  void open_watch(MpiSession& session, const std::vector<std::string>& intros);
  void join_watch(MpiSession& session, const BeforeJoin& before_join);
  void watch();
  void report_loss(const Peer& peer) const;

  int me_ = 0;
  int ranks_per_process_ = 1;
  std::vector<std::string> hosts_;  // by process
  std::vector<Peer> peers_;
  int wake_[2] = {-1, -1};  // a pipe that stops the watcher
  std::atomic<bool> leaving_{false};
  std::thread watcher_;
};

}  // namespace zerodp
