// The checkpoint directory and its commit protocol; reading a checkpoint's shards back.
//
//   DIR/step_00000012/meta.json, rank_00000.safetensors, ..., history.jsonl
//                                                               a committed checkpoint
//   DIR/latest                                                  "step_00000012\n"
//   DIR/.tmp.step_00000012/                                     being written
//
// Commit (the engine drives it; every rank takes part):
//   1. rank 0 creates the temporary directory; the ranks meet;
//   2. every rank writes and fsyncs its shard file there (rank 0 the history too) and
//      reports its sha256;
//   3. the ranks agree that every write succeeded (else all fail, nothing is committed);
//   4. rank 0 writes meta.json (with the checksums) and fsyncs it and the directory,
//      renames the directory into place, fsyncs DIR, then replaces `latest` by rename and
//      fsyncs DIR again; only then are checkpoints beyond --keep deleted.
// A crash at any point leaves `latest` naming a fully committed checkpoint (or absent):
// a step directory exists only after its meta.json was durable, and `latest` moves only
// to a directory that exists. Leftover temporaries are removed at the next start.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"

namespace zerodp::checkpoint {

namespace fs = std::filesystem;

// --- durability -----------------------------------------------------------------------

void fsync_path(const fs::path& path);  // a file or a directory; throws IoError
// Writes `text` to path via path + ".tmp", fsync, rename, fsync of the parent.
void write_file_atomically(const fs::path& path, std::string_view text);

// --- the directory --------------------------------------------------------------------

fs::path temp_dir(const fs::path& root, uint64_t step);  // root/.tmp.step_...
fs::path step_dir(const fs::path& root, uint64_t step);  // root/step_...
// Whether `name`, directly under a checkpoint root, is one the store writes, renames or
// removes: latest and its temporary, step_* directories, .tmp.* temporaries, and the run's
// .lock. A user's file under such a name would be replaced, pruned or swept away.
bool owned_by_store(std::string_view name);
// Refuses (InvalidArgument) an output `out` (named by `what`) that is, or lies inside, a
// name the store owns under `root` (named by `root_what`): symlinks are followed, so a
// link into the directory counts as what it points at.
void check_not_store_owned(std::string_view what, const fs::path& out, std::string_view root_what,
                           const fs::path& root);
// Removes temporaries (".tmp.*", "latest.tmp") a crashed run left in root.
// Returns how many it removed.
int clean_leftovers(const fs::path& root);
// Rank 0's part of step 2: the loss history into `temp` (kHistoryFile, fsynced), returned
// as the entry meta.json lists with its size and sha256.
FileMeta write_history(const fs::path& temp, const std::vector<StepHistory>& steps);
// Step 4 above, for rank 0: meta.json into `temp`, then rename into place, `latest`, prune.
// `keep` = 0 keeps every checkpoint.
void commit(const fs::path& root, const fs::path& temp, const Meta& meta, int keep);
// Deletes all but the `keep` newest committed checkpoints (never step `newest`); 0 keeps all.
// On node-local storage each host prunes once every host has committed `newest`, so no host
// deletes a step another still needs.
void prune(const fs::path& root, int keep, uint64_t newest);
// The step directory `latest` names, if `latest` exists and names a committed checkpoint;
// throws CorruptData when `latest` names something that is not one.
std::optional<fs::path> find_latest(const fs::path& root);
// Committed step directories in root, oldest first.
std::vector<fs::path> list_checkpoints(const fs::path& root);
// What a checkpoint argument means: a step directory (holding meta.json), or a checkpoint
// root (holding `latest`). Throws InvalidArgument, naming `flag`, when it is neither.
fs::path resolve(const fs::path& path, std::string_view flag = "--resume");

// --- failure injection for tests ------------------------------------------------------

// When the environment variable ZERODP_FAILPOINT is "BOUNDARY" or "BOUNDARY:RANK" and
// equals `boundary` (and `rank`), the process kills itself with SIGKILL: a crash at that
// exact point of the protocol. Boundaries: shard-written, meta-written, renamed,
// latest-written. Costs one getenv per boundary.
void failpoint(std::string_view boundary, int rank);

// --- reading --------------------------------------------------------------------------

// A step directory's meta.json, read and parsed with no shard touched: CorruptData when it
// is missing, not a regular file, past 64 MiB or malformed. Checkpoint starts with it;
// callers that check a checkpoint's model before hashing its shards use it alone.
Meta read_meta(const fs::path& dir);

// A committed checkpoint opened for reading. Opening verifies everything before anyone
// uses a byte: meta.json parses, every file listed exists with its size and sha256, and
// each rank file holds exactly the tensors the meta describes with the right dtype and
// shape. Any failure is CorruptData naming the file, the tensor and expected vs actual.
class Checkpoint {
 public:
  // `this_host`: on node-local storage (Meta::hosts), the host reading it; the files other
  // hosts wrote are not expected here, and reading a range from one of them fails naming
  // the host that holds it and how to gather the shards.
  explicit Checkpoint(const fs::path& dir, std::string_view this_host = {});
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;

  const fs::path& dir() const { return dir_; }
  const Meta& meta() const { return meta_; }
  // Index of a unit by name; throws CorruptData naming it when absent.
  size_t unit_index(std::string_view name) const;
  // Whether the files hold "<unit>.master" (16-bit checkpoints) or only params (fp32).
  bool has_master() const { return meta_.precision != "fp32"; }
  // The steps that led here, from kHistoryFile (verified and parsed when opened); empty for
  // a checkpoint of an earlier version, which has none.
  const std::vector<StepHistory>& history() const { return history_; }

  // Elements [first, first + count) of a unit's flat `kind` ("params", "master", "adam_m",
  // "adam_v") as saved, read from the rank files whose ranges overlap it: resharding is
  // this. `out` holds count elements of the kind's dtype (params: the checkpoint's
  // precision; the rest fp32).
  // With islands (Meta::islands), `island`'s states; the outer state ("outer_params",
  // "outer_momentum") is island 0's.
  void read(size_t unit, std::string_view kind, uint64_t first, std::span<std::byte> out,
            int island = 0) const;
  // Elements [first, first + n) of rank `rank`'s own tensor `kind` of `unit`, in that file's
  // indexing: for tensors whose length is not the rank's range (an int8 checkpoint's scales
  // and fp32 moments, Meta::int8_moments), which the caller maps. length(): its elements.
  void read_rank(int rank, size_t unit, std::string_view kind, uint64_t first,
                 std::span<std::byte> out, int island = 0) const;
  uint64_t length(int rank, size_t unit, std::string_view kind, int island = 0) const;
  // The unit's fp32 master weights (fp32 checkpoints: its params) over [first, first+count).
  void read_master(size_t unit, uint64_t first, std::span<float> out, int island = 0) const;
  // Whether the shards hold tensors of `kind` (island 0's, unit 0's).
  bool holds(std::string_view kind) const;
  // The model's weights: the master, or with islands the global weights of the last outer
  // step (the only ones every island agrees on; mid-round progress is in the islands'
  // states until the next outer step). What export and sample read.
  void read_weights(size_t unit, uint64_t first, std::span<float> out) const;

 private:
  fs::path dir_;
  Meta meta_;
  std::vector<std::optional<safetensors::Reader>> files_;  // absent: another host's
  std::vector<StepHistory> history_;
  std::vector<std::vector<uint64_t>> starts_;  // [unit][rank]: first element rank r saved
};

}  // namespace zerodp::checkpoint
