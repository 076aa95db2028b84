// process_watch.h is the contract.
#include "comm/process_watch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>

#include <fmt/core.h>

#include "core/sysinfo.h"

namespace zerodp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kGoodbye = 'B';
// How long the processes wait for each other's connections: the job has just started, all
// of them are inside MPI_Init's barrier, so a second is generous; a host whose address
// cannot be reached must not hold the job up.
constexpr int kConnectMs = 1000;
constexpr int kAcceptMs = 5000;
// A joining process's first bytes: the job's token, then its process number (network order).
constexpr size_t kTokenBytes = 16;
constexpr size_t kHelloBytes = kTokenBytes + sizeof(uint32_t);
// Connections not yet heard from; beyond this the oldest goes, so a flood of strangers
// cannot take every descriptor while the real peers' connections still get read.
constexpr size_t kMaxPending = 64;
// MpiSession::allgather_text carries this much of a process's text.
constexpr size_t kTextBytes = 255;

using Token = std::array<unsigned char, kTokenBytes>;

// This host's IPv4 addresses but loopback.
std::vector<std::string> own_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) == nullptr) continue;
    if (std::string(text) != "127.0.0.1") out.emplace_back(text);
  }
  ::freeifaddrs(list);
  return out;
}

bool contains(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

std::optional<sockaddr_in> ipv4(const std::string& addr, int port) {
  sockaddr_in out{};
  out.sin_family = AF_INET;
  out.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, addr.c_str(), &out.sin_addr) != 1) return std::nullopt;
  return out;
}

// The address this host sends from to reach `peer` (the kernel's route; no packet leaves):
// the one that peer reaches this host at. Empty when there is no route.
std::string route_source(const std::string& peer) {
  const auto to = ipv4(peer, 9);
  if (!to) return {};
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  sockaddr_in from{};
  socklen_t len = sizeof from;
  char text[INET_ADDRSTRLEN] = {};
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&*to), sizeof *to) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&from), &len) == 0 &&
                  from.sin_addr.s_addr != htonl(INADDR_ANY) &&
                  ::inet_ntop(AF_INET, &from.sin_addr, text, sizeof text) != nullptr;
  ::close(fd);
  return ok ? std::string(text) : std::string();
}

// Where process 0 listens, from every process's "HOST ADDR...": loopback for a peer on its
// host, the source of its route to each address of a peer elsewhere (an address process 0
// has itself, like a container bridge every host has, is no way to that peer), and every
// address of its own for a peer no route reaches.
std::vector<std::string> listen_addresses(const std::vector<std::string>& intros) {
  const std::vector<std::string> own = own_addresses();
  std::vector<std::string> out;
  const auto add = [&](const std::string& a) {
    if (!contains(out, a)) out.push_back(a);
  };
  std::string zero_host;
  std::istringstream(intros[0]) >> zero_host;
  for (size_t p = 1; p < intros.size(); ++p) {
    std::istringstream in(intros[p]);
    std::string host;
    in >> host;
    bool reached = host == zero_host;
    if (reached) add("127.0.0.1");
    for (std::string a; in >> a;) {
      if (contains(own, a)) continue;
      if (const std::string from = route_source(a); !from.empty()) {
        add(from);
        reached = true;
      }
    }
    if (!reached) {
      for (const std::string& a : own) add(a);
    }
  }
  return out;
}

struct Listener {
  std::string address;
  int port = 0;
  int fd = -1;
};

std::optional<Listener> listen_on(const std::string& address) {
  auto at = ipv4(address, 0);
  if (!at) return std::nullopt;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  socklen_t len = sizeof *at;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&*at), sizeof *at) != 0 ||
      ::listen(fd, SOMAXCONN) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&*at), &len) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  return Listener{address, ntohs(at->sin_port), fd};
}

std::string to_hex(const Token& token) {
  std::string out;
  for (const unsigned char b : token) out += fmt::format("{:02x}", b);
  return out;
}

std::optional<Token> from_hex(const std::string& text) {
  if (text.size() != 2 * kTokenBytes) return std::nullopt;
  Token out{};
  for (size_t i = 0; i < kTokenBytes; ++i) {
    unsigned value = 0;
    if (std::sscanf(text.c_str() + 2 * i, "%2x", &value) != 1) return std::nullopt;
    out[i] = static_cast<unsigned char>(value);
  }
  return out;
}

std::optional<Token> random_token() {
  Token out{};
  size_t have = 0;
  while (have < out.size()) {
    const ssize_t got = ::getrandom(out.data() + have, out.size() - have, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return std::nullopt;
    have += static_cast<size_t>(got);
  }
  return out;
}

// Whether `given` is the token, in time that does not depend on where they differ: timing
// must not let a stranger find the token a byte at a time.
bool same_token(const unsigned char* given, const Token& token) {
  unsigned char diff = 0;
  for (size_t i = 0; i < kTokenBytes; ++i) diff |= static_cast<unsigned char>(given[i] ^ token[i]);
  return diff == 0;
}

// A connected socket to addr:port within kConnectMs, or -1.
int connect_within(const std::string& addr, int port) {
  const auto to = ipv4(addr, port);
  if (!to) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&*to), sizeof *to) != 0 &&
      errno != EINPROGRESS) {
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

struct Pending {
  int fd = -1;
  Clock::time_point deadline;
  std::array<unsigned char, kHelloBytes> hello{};
  size_t have = 0;
};

struct Joined {
  std::vector<std::pair<int, int>> peers;  // process, fd
  int refused = 0;                         // connections that were not a waited-for peer
};

int ms_until(Clock::time_point t) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(left, 0));
}

// Reads what a pending connection sent; true when it is done with (joined or refused).
bool hear(Pending& p, const Token& token, std::vector<bool>& joined, Joined& out) {
  const ssize_t got = ::recv(p.fd, p.hello.data() + p.have, kHelloBytes - p.have, 0);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  if (got > 0) p.have += static_cast<size_t>(got);
  if (got > 0 && p.have < kHelloBytes) return false;
  uint32_t who = 0;
  std::memcpy(&who, p.hello.data() + kTokenBytes, sizeof who);
  who = ntohl(who);
  if (got > 0 && same_token(p.hello.data(), token) && who >= 1 && who < joined.size() &&
      !joined[who]) {
    joined[who] = true;
    out.peers.emplace_back(static_cast<int>(who), p.fd);
  } else {
    ::close(p.fd);
    ++out.refused;
  }
  return true;
}

// Process 0's side: every peer's connection within kAcceptMs. Connections are read side by
// side, each given kConnectMs to say who it is, so a silent one delays no other.
Joined accept_peers(const std::vector<Listener>& listeners, const Token& token, int n) {
  const Clock::time_point end = Clock::now() + std::chrono::milliseconds(kAcceptMs);
  std::vector<bool> joined(static_cast<size_t>(n), false);
  std::vector<Pending> pending;
  Joined out;
  const auto refuse = [&](size_t i) {
    ::close(pending[i].fd);
    pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
    ++out.refused;
  };
  while (out.peers.size() + 1 < static_cast<size_t>(n) && Clock::now() < end) {
    for (size_t i = pending.size(); i-- > 0;) {
      if (pending[i].deadline <= Clock::now()) refuse(i);
    }
    Clock::time_point wake = end;
    std::vector<pollfd> fds;
    for (const Listener& l : listeners) fds.push_back({l.fd, POLLIN, 0});
    for (const Pending& p : pending) {
      fds.push_back({p.fd, POLLIN, 0});
      wake = std::min(wake, p.deadline);
    }
    if (::poll(fds.data(), fds.size(), ms_until(wake)) < 0 && errno != EINTR) break;
    for (size_t i = pending.size(); i-- > 0;) {
      if (fds[listeners.size() + i].revents != 0 && hear(pending[i], token, joined, out)) {
        pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
      }
    }
    for (size_t l = 0; l < listeners.size(); ++l) {
      if (fds[l].revents == 0) continue;
      for (int fd; (fd = ::accept4(listeners[l].fd, nullptr, nullptr,
                                   SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
        if (pending.size() == kMaxPending) refuse(0);
        pending.push_back({fd, Clock::now() + std::chrono::milliseconds(kConnectMs)});
      }
    }
  }
  for (const Pending& p : pending) ::close(p.fd);
  out.refused += static_cast<int>(pending.size());
  return out;
}

}  // namespace

ProcessWatch::ProcessWatch(MpiSession& session, int ranks_per_process,
                           const BeforeJoin& before_join)
    : me_(session.rank()), ranks_per_process_(ranks_per_process) {
  // Every process: "HOST ADDR...", its addresses for process 0 to choose where to listen.
  std::string intro = host_name();
  for (const std::string& a : own_addresses()) intro += " " + a;
  const std::vector<std::string> intros = session.allgather_text(intro);
  for (const std::string& text : intros) {
    std::string host;
    std::istringstream(text) >> host;
    hosts_.push_back(host);
  }
  if (me_ == 0) {
    open_watch(session, intros);
  } else {
    join_watch(session, before_join);
  }
  if (::pipe2(wake_, O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
  if (!peers_.empty() && wake_[0] >= 0) watcher_ = std::thread([this] { watch(); });
}

void ProcessWatch::open_watch(MpiSession& session, const std::vector<std::string>& intros) {
  const int n = session.size();
  const std::optional<Token> token = random_token();
  std::vector<Listener> listeners;
  // "TOKEN ADDR:PORT...", or "-": no watch.
  std::string endpoints;
  for (const std::string& a : token ? listen_addresses(intros) : std::vector<std::string>{}) {
    const std::optional<Listener> l = listen_on(a);
    if (!l) continue;
    const std::string entry = fmt::format(" {}:{}", l->address, l->port);
    if (2 * kTokenBytes + endpoints.size() + entry.size() > kTextBytes) {
      ::close(l->fd);
      continue;
    }
    endpoints += entry;
    listeners.push_back(*l);
  }
  session.allgather_text(listeners.empty() ? std::string("-") : to_hex(*token) + endpoints);
  const Joined joined = listeners.empty() ? Joined{} : accept_peers(listeners, *token, n);
  std::string where;
  for (const Listener& l : listeners) {
    where += fmt::format("{}{}:{}", where.empty() ? "" : ", ", l.address, l.port);
    ::close(l.fd);
  }
  for (const auto& [process, fd] : joined.peers) peers_.push_back({process, fd, false});
  const int missing = n - 1 - static_cast<int>(joined.peers.size());
  if (missing > 0) {
    fmt::print(stderr,
               "zerodp: warning: {} of {} processes could not connect to process 0's watch "
               "(TCP {} on {}{}); a process of theirs that dies is named by mpirun only\n",
               missing, n - 1, where.empty() ? "-" : where, hosts_[0],
               joined.refused == 0
                   ? ""
                   : fmt::format("; {} connection(s) without this job's token turned away",
                                 joined.refused));
  }
}

void ProcessWatch::join_watch(MpiSession& session, const BeforeJoin& before_join) {
  std::istringstream offer(session.allgather_text("").front());
  std::string hex;
  offer >> hex;
  const std::optional<Token> token = from_hex(hex);
  if (!token) return;
  // Loopback first on process 0's host; elsewhere, never loopback or an address of this
  // host's own: the token would go to whatever listens here.
  const bool same_host = hosts_[0] == hosts_[static_cast<size_t>(me_)];
  const std::vector<std::string> own = same_host ? std::vector<std::string>{} : own_addresses();
  std::vector<std::pair<std::string, int>> order;
  for (std::string entry; offer >> entry;) {
    const size_t colon = entry.rfind(':');
    if (colon == std::string::npos) continue;
    std::string address = entry.substr(0, colon);
    const int port = std::atoi(entry.c_str() + colon + 1);
    if (port <= 0 || contains(own, address)) continue;
    if (address == "127.0.0.1" && !same_host) continue;
    const auto at = address == "127.0.0.1" ? order.begin() : order.end();
    order.insert(at, {std::move(address), port});
  }
  if (before_join && !order.empty()) before_join(order[0].first, order[0].second);
  std::array<unsigned char, kHelloBytes> hello{};
  std::copy(token->begin(), token->end(), hello.begin());
  const uint32_t who = htonl(static_cast<uint32_t>(me_));
  std::memcpy(hello.data() + kTokenBytes, &who, sizeof who);
  for (const auto& [address, port] : order) {
    const int fd = connect_within(address, port);
    if (fd < 0) continue;
    if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(hello.size())) {
      peers_.push_back({0, fd, false});
      break;
    }
    ::close(fd);
  }
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
