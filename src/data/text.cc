#include "data/text.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/core.h>

#include "core/error.h"
#include "core/files.h"
#include "core/sha256.h"
#include "core/sysinfo.h"
#include "core/units.h"
#include "data/gzip.h"

extern char** environ;  // the child runs with our environment

namespace zerodp {
namespace {

constexpr const char* kInstallHint =
    "install the Debian package bible-kjv (apt-get install bible-kjv), which provides it";

// Closes a file descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

struct ProgramResult {
  int wait_status = 0;
  std::vector<uint8_t> out;  // stdout
  std::string err;           // stderr
};

std::string command_text(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    out += a;
  }
  return out + " </dev/null";
}

// Runs argv with stdin from /dev/null, collecting stdout and stderr. posix_spawn (not
// fork) so it is safe while other rank threads run.
ProgramResult run_program(const std::vector<std::string>& argv) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    throw IoError(fmt::format("kjv: cannot create a pipe: {}", std::strerror(errno)));
  }
  Fd out_read(out_pipe[0]), out_write(out_pipe[1]);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw IoError(fmt::format("kjv: cannot create a pipe: {}", std::strerror(errno)));
  }
  Fd err_read(err_pipe[0]), err_write(err_pipe[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_write.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err_write.get(), 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));  // POSIX API
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawn_rc =
      ::posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_rc == ENOENT) {
    throw IoError(fmt::format("kjv: the program `{}` was not found{}; {}", argv[0],
                              argv[0].find('/') == std::string::npos ? " on PATH" : "",
                              kInstallHint));
  }
  if (spawn_rc != 0) {
    throw IoError(fmt::format("kjv: cannot run `{}`: {}; {}", argv[0], std::strerror(spawn_rc),
                              kInstallHint));
  }
  out_write.reset();
  err_write.reset();

  ProgramResult result;
  pollfd fds[2] = {{out_read.get(), POLLIN, 0}, {err_read.get(), POLLIN, 0}};
  char chunk[1 << 16];
  while (fds[0].fd >= 0 || fds[1].fd >= 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      throw IoError(
          fmt::format("kjv: poll on `{}`'s output failed: {}", argv[0], std::strerror(errno)));
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t got = ::read(fds[i].fd, chunk, sizeof(chunk));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        fds[i].fd = -1;  // EOF (or error: the exit status will tell)
        continue;
      }
      if (i == 0) {
        result.out.insert(result.out.end(), chunk, chunk + got);
      } else if (result.err.size() < 4096) {  // enough to explain a failure
        result.err.append(chunk, static_cast<size_t>(got));
      }
    }
  }
  while (::waitpid(pid, &result.wait_status, 0) < 0) {
    if (errno != EINTR) {
      throw IoError(fmt::format("kjv: waiting for `{}` failed: {}", argv[0], std::strerror(errno)));
    }
  }
  return result;
}

// Writes bytes to `path` through a unique temporary file in the same directory and a
// rename, so readers see either no file or the complete one.
void write_file_atomically(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = fmt::format("{}.tmp.{}.{}", path.string(), ::getpid(), counter.fetch_add(1));
    // O_EXCL: never write into another process's temporary file.
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt >= 100)) {
      throw IoError(fmt::format("kjv: cannot create {}: {}; choose a writable cache directory", tmp,
                                std::strerror(errno)));
    }
  }
  Fd owned(fd);
  auto fail = [&](const char* what) {
    const int saved = errno;
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("kjv: {} {} failed: {}", what, tmp, std::strerror(saved)));
  };
  size_t written_bytes = 0;
  while (written_bytes < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written_bytes, bytes.size() - written_bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing");
    written_bytes += static_cast<size_t>(n);
  }
  // Data on disk before the rename makes it visible, so a power cut cannot leave a
  // complete-looking name over missing data (verification on load would catch it anyway).
  if (::fsync(fd) != 0) fail("fsync of");
  owned.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming into place");
}

bool verifies(std::span<const uint8_t> bytes) {
  if (bytes.size() != kKjvBytes) return false;
  return sha256_hex(std::as_bytes(bytes)) == kKjvSha256;
}

}  // namespace

KjvText load_kjv(const std::filesystem::path& cache_dir, const std::string& bible_program) {
  KjvText result;
  result.cache_file = cache_dir / kKjvCacheName;
  std::error_code ec;
  if (std::filesystem::exists(result.cache_file, ec)) {
    result.bytes = read_file_bytes(result.cache_file);
    if (verifies(result.bytes)) return result;
    result.replaced_bad_cache = true;
  }

  const std::vector<std::string> argv = {bible_program, "-f", "gen1:1-rev22:21"};
  ProgramResult run = run_program(argv);
  const int status = run.wait_status;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw IoError(fmt::format(
        "kjv: `{}` {} {}; stderr: {}; check that the Debian package bible-kjv is installed "
        "and works (apt-get install --reinstall bible-kjv)",
        command_text(argv), WIFEXITED(status) ? "exited with status" : "was killed by signal",
        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
        run.err.empty() ? "(empty)" : run.err));
  }
  if (!verifies(run.out)) {
    throw CorruptData(fmt::format(
        "kjv: `{}` printed {} bytes with SHA-256 {}; expected {} bytes with SHA-256 {}. "
        "This bible-kjv prints a different text; zerodp pins the text printed by Debian's "
        "bible-kjv 4.38 so that runs are comparable",
        command_text(argv), run.out.size(), sha256_hex(std::as_bytes(std::span(run.out))),
        kKjvBytes, kKjvSha256));
  }

  std::filesystem::create_directories(cache_dir, ec);
  if (ec) {
    throw IoError(fmt::format("kjv: cannot create the cache directory {}: {}", cache_dir.string(),
                              ec.message()));
  }
  write_file_atomically(result.cache_file, run.out);
  result.bytes = std::move(run.out);
  result.prepared = true;
  return result;
}

std::filesystem::path default_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::filesystem::path(xdg) / "zerodp";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') {
    return std::filesystem::path(home) / ".cache" / "zerodp";
  }
  throw IoError(
      "data: no cache directory: neither XDG_CACHE_HOME (absolute) nor HOME is set; set one "
      "of them or pass a cache directory explicitly");
}

std::vector<uint8_t> read_text_corpus(const std::filesystem::path& path) {
  // Refused before reading: a FIFO would block, a device never end, and a corpus past the
  // machine's memory would be read for minutes only to fail or swap.
  const uint64_t size = files::require_regular_input("--data", path);
  if (const auto available = available_memory(); available && size > *available) {
    throw OutOfMemory(fmt::format(
        "--data '{}' is {}, more than the {} of memory this machine has available to hold it; "
        "use a smaller corpus or a machine with more memory",
        path.string(), format_bytes(static_cast<double>(size)),
        format_bytes(static_cast<double>(*available))));
  }
  std::vector<uint8_t> bytes = read_file_bytes(path);
  if (bytes.empty()) {
    throw InvalidArgument(
        fmt::format("{}: the file is empty; a text corpus needs at least a few windows of "
                    "seq_len + 1 bytes",
                    path.string()));
  }
  return bytes;
}

}  // namespace zerodp
