// A job that fails on purpose, for tests that expect failure (see CMakeLists.txt):
//   throw    rank 1 throws while the others wait in an all-reduce;
//   timeout  rank 0 never arrives at an all-gather the others wait in, 1 s timeout.
// Either way the launcher must print the rank and the reason, and end every rank with a
// non-zero exit code well before rank 0's 30 s nap or the 60 s timeout would.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/launch.h"
#include "core/error.h"

int main(int argc, char** argv) {
  using namespace zerodp;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "throw" && mode != "timeout" && mode != "mismatch") return 2;
  LaunchOptions options{.backend = Backend::kMpi, .ranks = 0, .comm = {.timeout_seconds = 60}};
  if (mode == "timeout") options.comm.timeout_seconds = 1;
  launch(options, argc, argv, [&](Communicator& comm) {
    std::vector<float> buf(1000 * static_cast<size_t>(comm.size()), 1.0f);
    if (mode == "mismatch") {
      // Rank 1 reduces one element more: a bug that would otherwise hang or mix data.
      if (comm.rank() == 1) buf.push_back(1.0f);
      comm.all_reduce(std::span<float>(buf), ReduceOp::kSum);
    } else if (mode == "throw") {
      if (comm.rank() == 1) throw InvalidArgument("injected failure on purpose");
      comm.all_reduce(std::span<float>(buf), ReduceOp::kSum);
    } else {
      if (comm.rank() == 0) {
        std::this_thread::sleep_for(std::chrono::seconds(30));
        return;
      }
      const Partition part(buf.size(), comm.size());
      comm.all_gather(
          std::span<float>(buf).subspan(part.offset(comm.rank()), part.count(comm.rank())),
          std::span<float>(buf), part);
    }
  });
  return 0;
}
