#include "memory/state_file.h"

#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/core.h>

#include "core/error.h"
#include "core/mutex.h"
#include "core/units.h"

namespace zerodp {

struct IoWork::State {
  Mutex mu;
  CondVar cv;
  bool done GUARDED_BY(mu) = false;
  std::exception_ptr error GUARDED_BY(mu);
};

void IoWork::wait() {
  if (!state_) return;
  MutexLock lock(state_->mu);
  while (!state_->done) state_->cv.wait(state_->mu);
  if (state_->error) std::rethrow_exception(state_->error);
}

StateFile::StateFile(const std::filesystem::path& dir, const std::string& name, uint64_t bytes,
                     bool direct)
    : path_(dir / name), size_(bytes) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw InvalidArgument(
        fmt::format("offload: {} is not a directory; give --offload-dir a "
                    "directory on a disk with room for the states",
                    dir.string()));
  }
  constexpr int kFlags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  if (direct) {
    fd_ = ::open(path_.c_str(), kFlags | O_DIRECT, 0600);
    direct_ = fd_ >= 0;
  }
  // tmpfs and some others refuse O_DIRECT with EINVAL, after creating the file (O_EXCL held,
  // so it is ours to remove): buffered I/O still works there.
  const bool refused = direct && fd_ < 0 && errno == EINVAL;
  if (refused) ::unlink(path_.c_str());
  if (!direct || refused) fd_ = ::open(path_.c_str(), kFlags, 0600);
  if (fd_ < 0) {
    throw IoError(
        fmt::format("offload: cannot create {}: {}", path_.string(), std::strerror(errno)));
  }
  ::unlink(path_.c_str());
  if (bytes > 0) {
    const int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      ::close(fd_);
      throw IoError(
          fmt::format("offload: cannot reserve {} for {}: {}{}",
                      format_bytes(static_cast<double>(bytes)), path_.string(), std::strerror(err),
                      err == ENOSPC  ? "; free space there or use another --offload-dir"
                      : err == EFBIG ? "; the file size limit (ulimit -f) is below it: raise it"
                                     : ""));
    }
  }
  worker_ = std::thread([this] { run(); });
}

StateFile::~StateFile() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (fd_ >= 0) ::close(fd_);
}

IoWork StateFile::read_async(uint64_t offset, std::span<std::byte> into) {
  return submit(Job{false, offset, into.data(), into.size(), nullptr, {}});
}

IoWork StateFile::read_async(uint64_t offset, std::span<std::byte> into,
                             std::function<void()> then) {
  return submit(Job{false, offset, into.data(), into.size(), nullptr, std::move(then)});
}

IoWork StateFile::write_async(uint64_t offset, std::span<const std::byte> from) {
  return submit(Job{true, offset, const_cast<std::byte*>(from.data()), from.size(), nullptr, {}});
}

IoWork StateFile::submit(Job job) {
  if (job.offset > size_ || job.bytes > size_ - job.offset) {
    throw InvalidArgument(fmt::format(
        "offload: {} of {} bytes at byte {} is past the end of {} "
        "({} bytes)",
        job.write ? "a write" : "a read", job.bytes, job.offset, path_.string(), size_));
  }
  if (direct_ && (job.offset % kDirectAlign != 0 || job.bytes % kDirectAlign != 0 ||
                  reinterpret_cast<uintptr_t>(job.data) % kDirectAlign != 0)) {
    throw InvalidArgument(fmt::format(
        "offload: {} of {} bytes at byte {} of {} is not aligned to {} bytes, which O_DIRECT "
        "needs",
        job.write ? "a write" : "a read", job.bytes, job.offset, path_.string(), kDirectAlign));
  }
  job.state = std::make_shared<IoWork::State>();
  IoWork work(job.state);
  {
    MutexLock lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return work;
}

void StateFile::transfer(const Job& job) const {
  for (size_t done = 0; done < job.bytes;) {
    const off_t at = static_cast<off_t>(job.offset + done);
    const ssize_t n = job.write ? ::pwrite(fd_, job.data + done, job.bytes - done, at)
                                : ::pread(fd_, job.data + done, job.bytes - done, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw IoError(fmt::format(
          "offload: {} {} at byte {}: {}", job.write ? "writing" : "reading", path_.string(),
          job.offset + done,
          n == 0 ? std::string("unexpected end of file") : std::string(std::strerror(errno))));
    }
    done += static_cast<size_t>(n);
  }
}

void StateFile::run() {
  for (;;) {
    Job job;
    {
      MutexLock lock(mu_);
      while (!stopping_ && queue_.empty()) cv_.wait(mu_);
      if (queue_.empty()) return;  // stopping, and everything queued is done
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      transfer(job);
      if (job.then) job.then();
    } catch (...) {
      error = std::current_exception();
    }
    {
      MutexLock lock(job.state->mu);
      job.state->done = true;
      job.state->error = error;
    }
    job.state->cv.notify_all();
  }
}

}  // namespace zerodp
