// zerodp bench-io DIR: the sequential write and read bandwidth of the file system under DIR,
// the figure an offload tier's step time rests on, measured as fio would (one stream of
// large blocks) and past the page cache: with O_DIRECT where the file system takes it, else
// by syncing the written file and dropping its pages before reading it back.
//
// The scratch file is unlinked as soon as it is open, so it leaves nothing behind however
// the process ends; its space is checked against the free space first, so a run never fills
// the disk.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/units.h"

namespace zerodp::cli {
namespace {

using Clock = std::chrono::steady_clock;

// O_DIRECT wants buffers, offsets and lengths aligned to the logical block size; 4 KiB
// covers every common device.
constexpr size_t kAlign = 4096;

struct Config {
  std::string dir;
  std::string size = "1GiB";
  std::string block = "4MiB";
  std::string direct = "auto";
  int repeats = 2;
  bool json = false;
};

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};

std::string errno_text(int err) { return std::strerror(err); }

// The scratch file, open and already unlinked; closed on destruction.
class Scratch {
 public:
  Scratch(const std::filesystem::path& dir, bool direct) {
    path_ = dir / fmt::format(".zerodp-bench-io-{}", ::getpid());
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (direct ? O_DIRECT : 0);
    fd_ = ::open(path_.c_str(), flags, 0600);
    if (fd_ < 0) {
      err_ = errno;
      return;
    }
    ::unlink(path_.c_str());
  }
  ~Scratch() {
    if (fd_ >= 0) ::close(fd_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  int fd() const { return fd_; }
  int error() const { return err_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  int err_ = 0;
};

// Block k's bytes: a pattern that names k, so a read that returns another block is caught.
void fill_block(std::byte* p, size_t bytes, uint64_t k) {
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = (k + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
    std::memcpy(p + i, &v, 8);
  }
}

bool block_matches(const std::byte* p, size_t bytes, uint64_t k) {
  for (size_t i = 0; i + 8 <= bytes; i += 4096) {
    const uint64_t want = (k + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
    uint64_t got = 0;
    std::memcpy(&got, p + i, 8);
    if (got != want) return false;
  }
  return true;
}

struct Pass {
  double write_seconds = 0;
  // Before the fdatasync: what a scratch file that is never synced (the offload tier's) sees.
  // With O_DIRECT the data has left this machine's memory, though a VM's host may cache it.
  double unsynced_write_seconds = 0;
  double read_seconds = 0;
  double update_seconds = 0;  // every block read and written back, alternating
  uint64_t wrong_blocks = 0;
};

Pass run_pass(const Scratch& f, std::byte* buf, uint64_t size, uint64_t block, bool direct) {
  const std::string where = f.path().string();
  const uint64_t blocks = size / block;
  Pass p;
  auto t0 = Clock::now();
  for (uint64_t k = 0; k < blocks; ++k) {
    fill_block(buf, block, k);
    for (uint64_t done = 0; done < block;) {
      const ssize_t n =
          ::pwrite(f.fd(), buf + done, block - done, static_cast<off_t>(k * block + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw IoError(fmt::format("bench-io: writing {} at byte {}: {}", where, k * block + done,
                                  errno_text(errno)));
      }
      done += static_cast<uint64_t>(n);
    }
  }
  p.unsynced_write_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (::fdatasync(f.fd()) != 0) {
    throw IoError(fmt::format("bench-io: syncing {}: {}", where, errno_text(errno)));
  }
  p.write_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // Without O_DIRECT the written pages are clean now: dropping them makes the reads go to
  // the device, not to memory.
  if (!direct) (void)::posix_fadvise(f.fd(), 0, static_cast<off_t>(size), POSIX_FADV_DONTNEED);
  t0 = Clock::now();
  for (uint64_t k = 0; k < blocks; ++k) {
    for (uint64_t done = 0; done < block;) {
      const ssize_t n =
          ::pread(f.fd(), buf + done, block - done, static_cast<off_t>(k * block + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw IoError(
            fmt::format("bench-io: reading {} at byte {}: {}", where, k * block + done,
                        n == 0 ? std::string("unexpected end of file") : errno_text(errno)));
      }
      done += static_cast<uint64_t>(n);
    }
    if (!block_matches(buf, block, k)) ++p.wrong_blocks;
  }
  p.read_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // The offload tier's pattern (train/offload.h): the file as three regions (master, adam_m,
  // adam_v), one stream that reads block k + 1 of each while block k of each is written
  // back, the same bytes it read, so the file stays verifiable.
  const uint64_t per = blocks / 3;
  void* raw = nullptr;
  if (per > 0 && ::posix_memalign(&raw, kAlign, 6 * block) != 0) {
    throw OutOfMemory("bench-io: cannot allocate the update pass's six blocks");
  }
  const std::unique_ptr<std::byte, AlignedFree> slots(static_cast<std::byte*>(raw));
  const auto move = [&](bool write, uint64_t k, int region) {
    std::byte* b = slots.get() + ((k % 2) * 3 + static_cast<uint64_t>(region)) * block;
    const uint64_t first = (static_cast<uint64_t>(region) * per + k) * block;
    for (uint64_t done = 0; done < block;) {
      const off_t at = static_cast<off_t>(first + done);
      const ssize_t n = write ? ::pwrite(f.fd(), b + done, block - done, at)
                              : ::pread(f.fd(), b + done, block - done, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw IoError(fmt::format(
            "bench-io: {} {} at byte {}: {}", write ? "writing" : "reading", where, first + done,
            n == 0 ? std::string("unexpected end of file") : errno_text(errno)));
      }
      done += static_cast<uint64_t>(n);
    }
  };
  t0 = Clock::now();
  for (int r = 0; r < 3 && per > 0; ++r) move(false, 0, r);
  for (uint64_t k = 0; k < per; ++k) {
    for (int r = 0; r < 3 && k + 1 < per; ++r) move(false, k + 1, r);
    for (int r = 0; r < 3; ++r) move(true, k, r);
  }
  p.update_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return p;
}

// `bytes` as a flag value: the largest binary unit that writes it whole ("12MiB", "4100").
std::string flag_bytes(uint64_t bytes) {
  static constexpr struct {
    const char* name;
    uint64_t scale;
  } kUnits[] = {{"GiB", uint64_t{1} << 30}, {"MiB", uint64_t{1} << 20}, {"KiB", uint64_t{1} << 10}};
  for (const auto& u : kUnits) {
    if (bytes >= u.scale && bytes % u.scale == 0)
      return fmt::format("{}{}", bytes / u.scale, u.name);
  }
  return fmt::format("{}", bytes);
}

// ", or --block B" with the largest valid block (a multiple of 4 KiB that divides `size`)
// that gives `size` three blocks or more; empty when none does.
std::string smaller_block_advice(uint64_t size) {
  for (uint64_t b = size / 3 / kAlign * kAlign; b >= kAlign; b -= kAlign) {
    if (size % b == 0) return fmt::format(", or --block {}", flag_bytes(b));
  }
  return "";
}

// The directory and the sizes, checked before anything is written; returns {block, size}.
std::pair<uint64_t, uint64_t> checked_sizes(const Config& cfg) {
  namespace fs = std::filesystem;
  const fs::path dir(cfg.dir);
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    throw InvalidArgument(
        fmt::format("bench-io: {} does not exist; give a directory on the "
                    "disk to measure, e.g. the one --offload-dir would use",
                    cfg.dir));
  }
  if (!fs::is_directory(dir, ec)) {
    throw InvalidArgument(
        fmt::format("bench-io: {} is not a directory; give the directory "
                    "whose disk to measure",
                    cfg.dir));
  }
  const uint64_t block = parse_bytes(cfg.block, "--block");
  const uint64_t size = parse_bytes(cfg.size, "--size");
  if (block < kAlign || block % kAlign != 0 || block > (uint64_t{1} << 30)) {
    throw InvalidArgument(fmt::format(
        "--block {} is invalid; use a multiple of 4KiB up to 1GiB, e.g. 4MiB", cfg.block));
  }
  if (size < block || size % block != 0) {
    throw InvalidArgument(
        fmt::format("--size {} is invalid; use a whole number of --block {} blocks, e.g. 1GiB",
                    cfg.size, cfg.block));
  }
  if (cfg.repeats < 1 || cfg.repeats > 100) {
    throw InvalidArgument(fmt::format("--repeats {} is invalid; use 1..100", cfg.repeats));
  }
  if (cfg.direct != "auto" && cfg.direct != "on" && cfg.direct != "off") {
    throw InvalidArgument(
        fmt::format("--direct '{}' is invalid; use auto, on (O_DIRECT) or off", cfg.direct));
  }
  // The update pass moves whole blocks of three regions (the tier's master, adam_m and
  // adam_v), so fewer than three blocks leave it nothing to move and its figure, the one
  // estimate --disk-bandwidth takes, would read 0 MB/s.
  if (size / block < 3) {
    throw InvalidArgument(fmt::format(
        "--size {} is {} of --block {}, but the update pass moves whole blocks of three "
        "regions and needs 3 blocks or more; use --size {} or more{}",
        cfg.size, size / block == 1 ? "1 block" : "2 blocks", cfg.block, flag_bytes(3 * block),
        smaller_block_advice(size)));
  }
  return {block, size};
}

int run_bench_io(const Config& cfg) {
  namespace fs = std::filesystem;
  const fs::path dir(cfg.dir);
  const auto [block, size] = checked_sizes(cfg);
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    // The file, and 1 GiB or a tenth of the free space left for everyone else.
    const uint64_t margin = std::min<uint64_t>(uint64_t{1} << 30, free_bytes / 10);
    if (size + margin > free_bytes) {
      throw IoError(fmt::format(
          "bench-io: --size {} does not fit in {}: {} free, and {} are left for others; use a "
          "smaller --size",
          format_bytes(static_cast<double>(size)), cfg.dir,
          format_bytes(static_cast<double>(free_bytes)),
          format_bytes(static_cast<double>(margin))));
    }
  }

  bool direct = cfg.direct != "off";
  auto scratch = std::make_unique<Scratch>(dir, direct);
  if (scratch->fd() < 0 && direct && cfg.direct == "auto" && scratch->error() == EINVAL) {
    direct = false;  // tmpfs and some others refuse O_DIRECT
    scratch = std::make_unique<Scratch>(dir, false);
  }
  if (scratch->fd() < 0) {
    throw IoError(fmt::format("bench-io: cannot create a scratch file in {}: {}{}", cfg.dir,
                              errno_text(scratch->error()),
                              direct && scratch->error() == EINVAL
                                  ? " (the file system refuses O_DIRECT; use --direct auto or off)"
                                  : ""));
  }
  void* raw = nullptr;
  if (::posix_memalign(&raw, kAlign, block) != 0) {
    throw OutOfMemory(fmt::format("bench-io: cannot allocate a --block of {}", cfg.block));
  }
  const std::unique_ptr<std::byte, AlignedFree> buf(static_cast<std::byte*>(raw));

  if (!cfg.json) {
    fmt::print(
        "# zerodp bench-io: {} of {} blocks in {} ({}), best of {}\n",
        format_bytes(static_cast<double>(size)), format_bytes(static_cast<double>(block)), cfg.dir,
        direct ? "O_DIRECT" : "buffered; pages dropped before reading, which the kernel may ignore",
        cfg.repeats);
    std::fflush(stdout);
  }
  Pass best{1e300, 1e300, 1e300, 1e300, 0};
  uint64_t wrong = 0;
  for (int r = 0; r < cfg.repeats; ++r) {
    const Pass p = run_pass(*scratch, buf.get(), size, block, direct);
    best.write_seconds = std::min(best.write_seconds, p.write_seconds);
    best.read_seconds = std::min(best.read_seconds, p.read_seconds);
    best.update_seconds = std::min(best.update_seconds, p.update_seconds);
    best.unsynced_write_seconds = std::min(best.unsynced_write_seconds, p.unsynced_write_seconds);
    wrong += p.wrong_blocks;
  }
  const double s = static_cast<double>(size);
  // The update pass moves whole blocks of three equal regions.
  const double moved = static_cast<double>(size / block / 3 * 3 * block);
  if (cfg.json) {
    fmt::print("{}\n",
               nlohmann::json{{"dir", cfg.dir},
                              {"bytes", size},
                              {"block_bytes", block},
                              {"direct", direct},
                              {"repeats", cfg.repeats},
                              {"write_bytes_per_second", s / best.write_seconds},
                              {"read_bytes_per_second", s / best.read_seconds},
                              {"unsynced_write_bytes_per_second", s / best.unsynced_write_seconds},
                              {"update_bytes_per_second", 2 * moved / best.update_seconds},
                              {"wrong_blocks", wrong}}
                   .dump());
  } else {
    fmt::print("write  {:>10.1f} MB/s  ({:.3f} s, fdatasync included)\n",
               s / best.write_seconds / 1e6, best.write_seconds);
    if (direct) {
      fmt::print(
          "write  {:>10.1f} MB/s  ({:.3f} s before the fdatasync: what an offload file, never "
          "synced, sees)\n",
          s / best.unsynced_write_seconds / 1e6, best.unsynced_write_seconds);
    }
    fmt::print("read   {:>10.1f} MB/s  ({:.3f} s)\n", s / best.read_seconds / 1e6,
               best.read_seconds);
    fmt::print(
        "update {:>10.1f} MB/s  ({:.3f} s; bytes read + written, three regions, block k + 1 "
        "read as block k is written back: the offload tier's pattern)\n",
        2 * moved / best.update_seconds / 1e6, best.update_seconds);
    if (wrong > 0) fmt::print("wrong  {} block(s) read back differ from what was written\n", wrong);
  }
  if (wrong > 0) {
    throw IoError(
        fmt::format("bench-io: {} block(s) read back from {} differ from what was "
                    "written: the disk or file system corrupts data",
                    wrong, cfg.dir));
  }
  return 0;
}

}  // namespace

Runner add_bench_io(CLI::App& app) {
  auto cfg = std::make_shared<Config>();
  app.add_option("dir", cfg->dir, "Directory on the disk to measure")->required();
  app.add_option("--size", cfg->size, "Bytes written then read back per pass")
      ->capture_default_str();
  app.add_option("--block", cfg->block, "Bytes per write and read call (a multiple of 4KiB)")
      ->capture_default_str();
  app.add_option("--direct", cfg->direct,
                 "auto: O_DIRECT where the file system takes it, else buffered with the pages "
                 "dropped before reading; on; off")
      ->capture_default_str();
  app.add_option("--repeats", cfg->repeats, "Passes; the best of each direction is kept")
      ->capture_default_str();
  app.add_flag("--json", cfg->json, "One JSON object on stdout");
  return [cfg](Launch) { return run_bench_io(*cfg); };
}

}  // namespace zerodp::cli
