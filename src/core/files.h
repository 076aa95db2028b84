// Files the user names on the command line: inputs refused before they can block, outputs
// that never destroy an input, another output, or what a link or device stands for.
//
// Every function takes `what`, the flag or role the user knows the path by ("--report",
// "checkpoint shard"), and every error names it with the path and what would work:
// InvalidArgument for a path that can never work (a directory, a FIFO as input, two outputs
// on one file), IoError for one the system refuses (read-only, full, missing parent).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace zerodp::files {

namespace fs = std::filesystem;

// Feeds the whole file to `take` in reads of 1 MiB (the last one shorter), for digests of
// files too large to hold. Throws IoError "WHAT: cannot open PATH for reading" or "WHAT: read
// error in PATH".
void read_in_chunks(std::string_view what, const fs::path& path,
                    const std::function<void(std::span<const std::byte>)>& take);

// An input that must be a regular file, symlinks followed. A FIFO would block the first
// read forever and a device would never end, so both are refused before anything opens
// them. Returns the file's size.
uint64_t require_regular_input(std::string_view what, const fs::path& path);

// What stands at `path` (links followed) when it exists and is not a regular file: "a
// directory", "a FIFO", "a character device", ...; nullopt for a regular file or nothing.
std::optional<std::string_view> non_regular_kind(const fs::path& path);

// The file a path finally names: every symlink followed, also a dangling one (whose target
// is where a new file will be created), and the result absolute.
fs::path final_target(const fs::path& path);

// Writes all of `text` to `fd`, through short writes and EINTR. On failure closes `fd` and
// throws IoError "WHAT: cannot write 'PATH': reason" (a write that takes nothing is ENOSPC).
void write_all(std::string_view what, int fd, const fs::path& path, std::string_view text);

// One path the user named, and the flag or role it was named by.
struct Named {
  std::string what;
  fs::path path;
};

// Refuses (InvalidArgument) an output that is the same file as an input or as another
// output: the same device and inode when both exist, the same path with symlinks and ".."
// resolved when not. An input that is a directory (a checkpoint) also claims every path
// inside it. Outputs that are devices (/dev/null, /dev/stdout) may repeat.
void check_distinct(std::span<const Named> inputs, std::span<const Named> outputs);

// An output written whole or not at all.
//
// A regular file, or a name not yet taken, is written as a temporary beside its final
// target (symlinks followed, so a link stays a link and its target is replaced), then
// fsynced and renamed over it: a reader sees the old file or the new one, never half. Any
// other existing file (a device such as /dev/null, a FIFO) is written in place, as the user
// named it: renaming over it would replace the device node itself. A directory is refused.
class Output {
 public:
  Output(std::string what, const fs::path& path);
  ~Output();  // uncommitted: removes the temporary
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  // Where the bytes go: the temporary, or the target itself when written in place. The
  // writer opens, fills, fsyncs and closes it before commit().
  const fs::path& write_path() const { return write_path_; }
  const fs::path& target() const { return target_; }
  bool in_place() const { return in_place_; }

  // Renames the temporary over the target and fsyncs its directory (nothing in place).
  void commit();

 private:
  std::string what_;
  fs::path target_;
  fs::path write_path_;
  bool in_place_ = false;
  bool committed_ = false;
};

// Opens an output that is written in place (a log appended as it goes, a device, a FIFO) for
// writing with `flags` (O_WRONLY and what else the writer wants). A FIFO is opened without
// blocking: one that nobody reads would otherwise hold the open, and with it the process,
// deaf to SIGTERM, until a reader came. Such a FIFO is refused (IoError naming `what`, the
// path and what would work); one with a reader is returned in blocking mode. Returns the fd.
int open_in_place(std::string_view what, const fs::path& path, int flags);

// `text` to `path` through an Output: written, fsynced (regular files), committed.
void write_output(std::string_view what, const fs::path& path, std::string_view text);

// Before a long job, so it does not fail only at its end: can `path` be written? Its
// directory must exist (InvalidArgument) and take a new file (a probe is created, written
// and removed; IoError); an existing device or FIFO must be writable. Names `what`.
void probe_output(std::string_view what, const fs::path& path);

// The same for a directory the job will write into, created (with its parents) if missing.
void probe_directory(std::string_view what, const fs::path& dir);

}  // namespace zerodp::files
