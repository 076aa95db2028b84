// A rank's states on disk (the offload tier, docs/offload.md): one scratch file of byte
// ranges at fixed offsets, read and written by a worker thread in the order the calls were
// made, so the next unit's read runs while the caller computes on the current one.
//
// The file is scratch, never a checkpoint: it is unlinked as soon as it is open (a killed
// run leaves nothing behind), and its space is reserved up front (posix_fallocate), so a
// directory that cannot hold it fails at the start, naming it, not in the middle of a step.
// Every I/O error names the file, the byte offset and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "core/mutex.h"

namespace zerodp {

// Handle to a queued read or write. wait() returns when it is done or rethrows its IoError;
// a default IoWork is complete.
class [[nodiscard]] IoWork {
 public:
  struct State;
  IoWork() = default;
  explicit IoWork(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void wait();

 private:
  std::shared_ptr<State> state_;
};

class StateFile {
 public:
  // Creates `name` under `dir` with `bytes` bytes reserved. Throws InvalidArgument when
  // `dir` is not a directory, IoError when the file cannot be created or its space reserved.
  // `direct`: open with O_DIRECT where the file system takes it (not tmpfs), so reads and
  // writes go to the device and its pages do not crowd the page cache; then every offset,
  // length and buffer address must be a multiple of kDirectAlign.
  StateFile(const std::filesystem::path& dir, const std::string& name, uint64_t bytes,
            bool direct = false);
  static constexpr uint64_t kDirectAlign = 4096;
  // Waits for the queued I/O (its errors are dropped: the caller is unwinding or done).
  ~StateFile();
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  uint64_t size() const { return size_; }
  // Whether O_DIRECT was asked for and taken.
  bool direct() const { return direct_; }
  // Where the file was created (it has no name on disk any more).
  const std::filesystem::path& path() const { return path_; }

  // Queue a read of into.size() bytes at `offset`, or a write of `from`. The buffer must stay
  // alive and untouched until the work is waited for. InvalidArgument for a range past the
  // end of the file.
  IoWork read_async(uint64_t offset, std::span<std::byte> into);
  // The same, then `then` on the worker once the read succeeded, before the work completes
  // (e.g. copying out of a bounce buffer the next queued read reuses). What it throws is the
  // work's error.
  IoWork read_async(uint64_t offset, std::span<std::byte> into, std::function<void()> then);
  IoWork write_async(uint64_t offset, std::span<const std::byte> from);

 private:
  struct Job {
    bool write = false;
    uint64_t offset = 0;
    std::byte* data = nullptr;
    size_t bytes = 0;
    std::shared_ptr<IoWork::State> state;
    std::function<void()> then;
  };
  IoWork submit(Job job);
  void run();
  void transfer(const Job& job) const;

  std::filesystem::path path_;
  uint64_t size_ = 0;
  bool direct_ = false;
  int fd_ = -1;
  Mutex mu_;
  CondVar cv_;
  std::deque<Job> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace zerodp
