// process_watch.h is the contract.
#include "comm/process_watch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

#include <fmt/core.h>

#include "core/sysinfo.h"

namespace zerodp {
namespace {

constexpr char kGoodbye = 'B';
// How long the processes wait for each other's connections: the job has just started, all
// of them are inside MPI_Init's barrier, so a second is generous; a host whose address
// cannot be reached must not hold the job up.
constexpr int kConnectMs = 1000;
constexpr int kAcceptMs = 5000;

// Process 0's IPv4 addresses, loopback last: where the others may reach it.
std::vector<std::string> own_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) == nullptr) continue;
      if (std::string(text) != "127.0.0.1") out.emplace_back(text);
    }
    ::freeifaddrs(list);
  }
  out.emplace_back("127.0.0.1");
  return out;
}

// A connected socket to addr:port within kConnectMs, or -1.
int connect_within(const std::string& addr, int port) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, addr.c_str(), &to.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t len = sizeof err;
  if (::poll(&p, 1, kConnectMs) != 1 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
      err != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

ProcessWatch::ProcessWatch(MpiSession& session, int ranks_per_process)
    : me_(session.rank()), ranks_per_process_(ranks_per_process) {
  const int n = session.size();
  int listener = -1;
  int port = 0;
  std::string mine = host_name();
  if (me_ == 0) {
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof any;
    if (listener >= 0 && ::bind(listener, reinterpret_cast<sockaddr*>(&any), sizeof any) == 0 &&
        ::listen(listener, n) == 0 &&
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&any), &len) == 0) {
      port = ntohs(any.sin_port);
    }
    for (const std::string& a : own_addresses()) mine += " " + a;
    mine = fmt::format("{} {}", port, mine);
  }
  // Process 0: "PORT HOST ADDR...", the others: "HOST".
  const std::vector<std::string> all = session.allgather_text(mine);
  std::vector<std::string> zero_addrs;
  {
    std::istringstream in(all[0]);
    std::string host;
    in >> port >> host;
    hosts_.push_back(host);
    for (std::string a; in >> a;) zero_addrs.push_back(a);
  }
  for (int p = 1; p < n; ++p) hosts_.push_back(all[static_cast<size_t>(p)]);
  if (me_ == 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kAcceptMs);
    int connected = 0;
    while (port > 0 && connected < n - 1) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      pollfd p{listener, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) != 1) break;
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      int32_t who = -1;
      pollfd r{fd, POLLIN, 0};
      if (::poll(&r, 1, kConnectMs) != 1 || ::read(fd, &who, sizeof who) != sizeof who || who < 1 ||
          who >= n) {
        ::close(fd);
        continue;
      }
      peers_.push_back({who, fd, false});
      ++connected;
    }
    if (listener >= 0) ::close(listener);
    if (connected < n - 1) {
      fmt::print(stderr,
                 "zerodp: warning: {} of {} processes could not connect to process 0's watch "
                 "(TCP port {} on {}); a process of theirs that dies is named by mpirun only\n",
                 n - 1 - connected, n - 1, port, hosts_[0]);
    }
  } else if (port > 0) {
    // The same host first: its loopback always reaches it.
    std::vector<std::string> order;
    if (hosts_[0] == hosts_[static_cast<size_t>(me_)]) order.emplace_back("127.0.0.1");
    for (const std::string& a : zero_addrs) order.push_back(a);
    for (const std::string& a : order) {
      const int fd = connect_within(a, port);
      if (fd < 0) continue;
      const int32_t who = me_;
      if (::write(fd, &who, sizeof who) == sizeof who) {
        peers_.push_back({0, fd, false});
        break;
      }
      ::close(fd);
    }
  }
  if (::pipe2(wake_, O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
  if (!peers_.empty() && wake_[0] >= 0) watcher_ = std::thread([this] { watch(); });
}

ProcessWatch::~ProcessWatch() {
  goodbye();
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
  if (watcher_.joinable()) watcher_.join();
  for (const Peer& p : peers_) {
    if (p.fd >= 0) ::close(p.fd);
  }
  for (const int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

void ProcessWatch::goodbye() {
  if (leaving_.exchange(true)) return;
  for (const Peer& p : peers_) (void)!::send(p.fd, &kGoodbye, 1, MSG_NOSIGNAL);
}

void ProcessWatch::watch() {
  for (;;) {
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}};
    std::vector<Peer*> who{nullptr};
    for (Peer& p : peers_) {
      if (p.done) continue;
      fds.push_back({p.fd, POLLIN, 0});
      who.push_back(&p);
    }
    if (fds.size() == 1) return;
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0) return;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char c = 0;
      const ssize_t got = ::recv(fds[i].fd, &c, 1, 0);
      if (got < 0 && errno == EINTR) continue;
      who[i]->done = true;
      if (got == 1 && c == kGoodbye) continue;
      if (!leaving_.load()) report_loss(*who[i]);
    }
  }
}

void ProcessWatch::report_loss(const Peer& peer) const {
  const int first = peer.process * ranks_per_process_;
  const std::string ranks =
      ranks_per_process_ == 1 ? fmt::format("rank {}", first)
                              : fmt::format("ranks {}..{}", first, first + ranks_per_process_ - 1);
  fmt::print(stderr,
             "zerodp: lost process {} ({}) on host {}: it ended without a word (killed, out of "
             "memory, or its host went down), seen by process {} on {}; the job cannot go on\n",
             peer.process, ranks, hosts_[static_cast<size_t>(peer.process)], me_,
             hosts_[static_cast<size_t>(me_)]);
  std::fflush(stderr);
}

}  // namespace zerodp
