#include "train/outputs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/store.h"
#include "core/error.h"

namespace zerodp {
namespace {

bool is_builtin_data(const std::string& data) {
  return data == "kjv" || data == "fashion-mnist" || data == "synthetic";
}

// An output that is a hard link to a checkpoint's file would truncate it in place, whatever
// its path says: compared by inode, against every file under `root` (a store or one step of
// it: two levels hold them all). Only outputs with more than one link can be such a file.
void check_not_linked_into(const files::Named& out, std::string_view root_what,
                           const std::filesystem::path& root) {
  struct stat o {};
  if (::stat(out.path.c_str(), &o) != 0 || !S_ISREG(o.st_mode) || o.st_nlink < 2) return;
  std::error_code ec;
  const auto options = std::filesystem::directory_options::skip_permission_denied;
  for (std::filesystem::recursive_directory_iterator it(root, options, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it.depth() >= 1) it.disable_recursion_pending();
    struct stat f {};
    if (::lstat(it->path().c_str(), &f) != 0 || f.st_dev != o.st_dev || f.st_ino != o.st_ino) {
      continue;
    }
    throw InvalidArgument(fmt::format(
        "{} '{}' is a hard link to {} '{}', which {} '{}' holds: writing it would overwrite "
        "the checkpoint; write the output to a new file, e.g. one outside '{}'",
        out.what, out.path.string(), it->path().filename().string(), it->path().string(), root_what,
        root.string(), root.string()));
  }
}

}  // namespace

void check_outputs(const TrainConfig& cfg, std::span<const files::Named> extra_inputs) {
  std::vector<files::Named> inputs(extra_inputs.begin(), extra_inputs.end());
  if (!cfg.data.empty() && !is_builtin_data(cfg.data)) inputs.push_back({"--data", cfg.data});
  if (!cfg.resume.empty() && cfg.resume != "latest") inputs.push_back({"--resume", cfg.resume});
  if (!cfg.config_file.empty()) inputs.push_back({"--config", cfg.config_file});
  if (!cfg.init_from.empty()) inputs.push_back({"--init-from", cfg.init_from});
  std::vector<files::Named> outputs;
  if (!cfg.report_path.empty()) outputs.push_back({"--report", cfg.report_path});
  if (!cfg.metrics_path.empty()) outputs.push_back({"--metrics", cfg.metrics_path});
  if (!cfg.trace_path.empty()) outputs.push_back({"--trace", cfg.trace_path});
  files::check_distinct(inputs, outputs);
  if (!cfg.checkpoint_dir.empty()) {
    for (const files::Named& out : outputs) {
      checkpoint::check_not_store_owned(out.what, out.path, "--checkpoint-dir", cfg.checkpoint_dir);
      check_not_linked_into(out, "--checkpoint-dir", cfg.checkpoint_dir);
    }
  }
  if (!cfg.resume.empty() && cfg.resume != "latest") {
    for (const files::Named& out : outputs) check_not_linked_into(out, "--resume", cfg.resume);
  }
  // The offload scratch lives in --offload-dir under names nobody sees (unlinked at once);
  // the directory itself is what no output may be.
  if (cfg.offload != Offload::kNone) {
    for (const files::Named& out : outputs) {
      std::error_code ec;
      if (std::filesystem::equivalent(out.path, cfg.offload_dir, ec)) {
        throw InvalidArgument(fmt::format(
            "{} '{}' is --offload-dir, where the offload scratch lives; write the output to a "
            "file, e.g. {}/report.json",
            out.what, out.path.string(), cfg.offload_dir));
      }
    }
  }
  // The directory first: it is created if missing, and outputs may be named inside it.
  if (!cfg.checkpoint_dir.empty()) files::probe_directory("--checkpoint-dir", cfg.checkpoint_dir);
  for (const files::Named& out : outputs) files::probe_output(out.what, out.path);
}

CheckpointDirLock::CheckpointDirLock(const std::filesystem::path& dir) {
  if (dir.empty()) return;
  const std::filesystem::path path = dir / ".lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw IoError(fmt::format("--checkpoint-dir {}: cannot open its lock file {}: {}", dir.string(),
                              path.string(), std::strerror(errno)));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (e != EWOULDBLOCK) {
      throw IoError(fmt::format("--checkpoint-dir {}: cannot lock {}: {}", dir.string(),
                                path.string(), std::strerror(e)));
    }
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "another process";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    throw InvalidArgument(fmt::format(
        "--checkpoint-dir {} is in use by another zerodp run ({}); wait for it to end or "
        "choose another directory",
        dir.string(), who));
  }
  char host[256] = {};
  (void)::gethostname(host, sizeof host - 1);
  const std::string me = fmt::format("pid {} on {}\n", ::getpid(), host);
  // Best effort: the lock itself is what protects the directory; the text names its holder.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, me.data(), me.size(), 0);
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace zerodp
