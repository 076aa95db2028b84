#include "core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace zerodp::files {
namespace {

std::string_view kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// stat() following links; nullopt when nothing is there (a dangling link included).
std::optional<struct stat> stat_of(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return st;
}

[[noreturn]] void io_fail(std::string_view what, std::string_view doing, const fs::path& path) {
  throw IoError(
      fmt::format("{}: cannot {} '{}': {}", what, doing, path.string(), std::strerror(errno)));
}

fs::path parent_of(const fs::path& target) {
  return target.has_parent_path() ? target.parent_path() : fs::path(".");
}

void fsync_dir(std::string_view what, const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail(what, "open the directory of", dir);
  // Some filesystems refuse fsync on a directory (EINVAL); the rename itself is done.
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_all(std::string_view what, int fd, const fs::path& path, std::string_view text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      errno = n == 0 ? ENOSPC : e;
      io_fail(what, "write", path);
    }
    done += static_cast<size_t>(n);
  }
}

namespace {

std::string temp_name(const fs::path& target) {
  static std::atomic<uint64_t> counter{0};
  return fmt::format(".{}.tmp.{}.{}", target.filename().string(), ::getpid(), counter.fetch_add(1));
}

}  // namespace

fs::path final_target(const fs::path& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) p = path;
  for (int hops = 0; hops < 40; ++hops) {
    if (!fs::is_symlink(p, ec)) break;
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  const fs::path resolved = fs::weakly_canonical(p, ec);
  return ec ? p.lexically_normal() : resolved;
}

std::optional<std::string_view> non_regular_kind(const fs::path& path) {
  const auto st = stat_of(path);
  if (!st || S_ISREG(st->st_mode)) return std::nullopt;
  return kind_of(st->st_mode);
}

void read_in_chunks(std::string_view what, const fs::path& path,
                    const std::function<void(std::span<const std::byte>)>& take) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open {} for reading", what, path.string()));
  std::vector<char> chunk(size_t{1} << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    take(std::as_bytes(std::span(chunk).first(static_cast<size_t>(in.gcount()))));
  }
  if (in.bad()) throw IoError(fmt::format("{}: read error in {}", what, path.string()));
}

uint64_t require_regular_input(std::string_view what, const fs::path& path) {
  const auto st = stat_of(path);
  if (!st) {
    throw InvalidArgument(fmt::format("{} '{}': {}", what, path.string(), std::strerror(errno)));
  }
  if (!S_ISREG(st->st_mode)) {
    throw InvalidArgument(fmt::format("{} '{}' is {}; give a regular file", what, path.string(),
                                      kind_of(st->st_mode)));
  }
  return static_cast<uint64_t>(st->st_size);
}

void check_distinct(std::span<const Named> inputs, std::span<const Named> outputs) {
  struct Seen {
    const Named* named;
    std::optional<struct stat> st;
    fs::path resolved;
  };
  const auto seen = [](const Named& n) { return Seen{&n, stat_of(n.path), final_target(n.path)}; };
  std::vector<Seen> ins, outs;
  for (const Named& n : inputs) ins.push_back(seen(n));
  for (const Named& n : outputs) outs.push_back(seen(n));
  const auto same = [](const Seen& a, const Seen& b) {
    if (a.st && b.st) return a.st->st_dev == b.st->st_dev && a.st->st_ino == b.st->st_ino;
    return !a.st && !b.st && a.resolved == b.resolved;
  };
  const auto inside = [](const Seen& dir, const Seen& out) {
    if (!dir.st || !S_ISDIR(dir.st->st_mode)) return false;
    const fs::path rel = out.resolved.lexically_relative(dir.resolved);
    return !rel.empty() && *rel.begin() != "..";
  };
  for (size_t o = 0; o < outs.size(); ++o) {
    const Seen& out = outs[o];
    for (const Seen& in : ins) {
      if (same(in, out) || inside(in, out)) {
        throw InvalidArgument(fmt::format(
            "{} '{}' would overwrite {} '{}'{}; write the output elsewhere", out.named->what,
            out.named->path.string(), in.named->what, in.named->path.string(),
            same(in, out) ? " (the same file)" : " (it lies inside it)"));
      }
    }
    const bool device = out.st && !S_ISREG(out.st->st_mode) && !S_ISDIR(out.st->st_mode);
    for (size_t p = 0; p < o && !device; ++p) {
      if (same(outs[p], out)) {
        throw InvalidArgument(fmt::format(
            "{} '{}' and {} '{}' are the same file; one would overwrite the other, so give "
            "each its own path",
            outs[p].named->what, outs[p].named->path.string(), out.named->what,
            out.named->path.string()));
      }
    }
  }
}

Output::Output(std::string what, const fs::path& path) : what_(std::move(what)) {
  if (path.empty()) throw InvalidArgument(fmt::format("{}: the path is empty", what_));
  // Decided on the path as given: /dev/stdout's links end in a name like "pipe:[123]" that
  // is no path at all, yet opening /dev/stdout itself works.
  if (const auto st = stat_of(path)) {
    if (S_ISDIR(st->st_mode)) {
      throw InvalidArgument(
          fmt::format("{} '{}' is a directory; give a file path inside it", what_, path.string()));
    }
    in_place_ = !S_ISREG(st->st_mode);
  }
  target_ = in_place_ ? path : final_target(path);
  write_path_ = in_place_ ? target_ : parent_of(target_) / temp_name(target_);
}

Output::~Output() {
  if (!committed_ && !in_place_) {
    std::error_code ec;
    fs::remove(write_path_, ec);
  }
}

void Output::commit() {
  if (committed_) return;
  if (!in_place_) {
    if (::rename(write_path_.c_str(), target_.c_str()) != 0) io_fail(what_, "rename into", target_);
    fsync_dir(what_, parent_of(target_));
  }
  committed_ = true;
}

int open_in_place(std::string_view what, const fs::path& path, int flags) {
  const auto st = stat_of(path);
  const bool fifo = st && S_ISFIFO(st->st_mode);
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC | (fifo ? O_NONBLOCK : 0), 0644);
  if (fd < 0 && fifo && errno == ENXIO) {
    throw IoError(fmt::format(
        "{} '{}' is a FIFO that nobody reads; start its reader first (for example: cat '{}' &)",
        what, path.string(), path.string()));
  }
  if (fd < 0) io_fail(what, "open", path);
  if (fifo && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    io_fail(what, "open", path);
  }
  return fd;
}

void write_output(std::string_view what, const fs::path& path, std::string_view text) {
  Output out{std::string(what), path};
  const int fd = out.in_place() ? open_in_place(what, out.target(), O_WRONLY)
                                : ::open(out.write_path().c_str(),
                                         O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) io_fail(what, "create a file beside", out.target());
  write_all(what, fd, out.in_place() ? out.target() : out.write_path(), text);
  if (!out.in_place() && ::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    io_fail(what, "fsync", out.write_path());
  }
  if (::close(fd) != 0) io_fail(what, "close", out.write_path());
  out.commit();
}

void probe_output(std::string_view what, const fs::path& path) {
  if (path.empty()) throw InvalidArgument(fmt::format("{}: the path is empty", what));
  if (const auto st = stat_of(path)) {
    if (S_ISDIR(st->st_mode)) {
      throw InvalidArgument(
          fmt::format("{} '{}' is a directory; give a file path inside it", what, path.string()));
    }
    if (!S_ISREG(st->st_mode)) {
      if (::access(path.c_str(), W_OK) != 0) io_fail(what, "write to", path);
      return;
    }
  }
  const fs::path target = final_target(path);
  const fs::path dir = parent_of(target);
  const auto dst = stat_of(dir);
  if (!dst || !S_ISDIR(dst->st_mode)) {
    throw InvalidArgument(fmt::format("{} '{}': its directory '{}' does not exist; create it first",
                                      what, path.string(), dir.string()));
  }
  const fs::path probe = dir / temp_name(target);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) io_fail(what, fmt::format("create files in '{}' for", dir.string()), path);
  const char byte = 0;
  const bool wrote = ::write(fd, &byte, 1) == 1;
  const int e = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) {
    errno = e;
    io_fail(what, fmt::format("write files in '{}' for", dir.string()), path);
  }
}

void probe_directory(std::string_view what, const fs::path& dir) {
  if (dir.empty()) throw InvalidArgument(fmt::format("{}: the path is empty", what));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw IoError(
        fmt::format("{}: cannot create the directory '{}': {}", what, dir.string(), ec.message()));
  }
  if (const auto st = stat_of(dir); !st || !S_ISDIR(st->st_mode)) {
    throw InvalidArgument(fmt::format("{} '{}' is {}; give a directory", what, dir.string(),
                                      st ? kind_of(st->st_mode) : "missing"));
  }
  probe_output(what, dir / ".zerodp-probe");
}

}  // namespace zerodp::files
