// A two-process job whose process 1 lets a stranger reach process 0's watch first (see
// CMakeLists.txt):
//   stranger  one connection sends a wrong token with process 1's number, another only the
//             number, and both close; the job must go on to a normal end, no loss reported;
//   silent    a connection every 0.6 s for 2.4 s says nothing and stays open; process 1 then
//             joins, meets process 0 and kills itself, and process 0 must name it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi.h"
#include "comm/process_watch.h"

namespace {

int connect_to(const std::string& address, int port) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, address.c_str(), &to.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_and_close(int fd, const std::vector<unsigned char>& bytes) {
  if (fd < 0) return;
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace zerodp;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "stranger" && mode != "silent") return 2;
  MpiSession session(argc, argv);
  std::vector<int> held;
  const auto stranger = [&](const std::string& address, int port) {
    if (mode == "stranger") {
      std::vector<unsigned char> wrong_token(16, 0);
      const uint32_t one = htonl(1);
      const auto* p = reinterpret_cast<const unsigned char*>(&one);
      wrong_token.insert(wrong_token.end(), p, p + sizeof one);
      send_and_close(connect_to(address, port), wrong_token);
      const int32_t bare = 1;
      const auto* b = reinterpret_cast<const unsigned char*>(&bare);
      send_and_close(connect_to(address, port), {b, b + sizeof bare});
      return;
    }
    for (int i = 0; i < 5; ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(600));
      held.push_back(connect_to(address, port));
    }
  };
  ProcessWatch watch(session, 1, stranger);
  auto comm = session.make_communicator({.timeout_seconds = 60});
  comm->barrier();
  if (mode == "silent") {
    if (session.rank() == 1) std::raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  }
  // A loss report, true or false, comes within milliseconds of a close.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  comm->barrier();
  return 0;
}
