// checkpoint_save.h is the contract.
#include "train/checkpoint_save.h"

#include <algorithm>
#include <chrono>
#include <system_error>
#include <utility>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "core/sysinfo.h"

namespace zerodp {
namespace {

// A CRC-32C as the control channel carries it (a double holds it exactly) and back as hex.
double crc_value(const std::string& hex) {
  return hex.empty() ? 0.0 : static_cast<double>(std::stoul(hex, nullptr, 16));
}
std::string crc_hex(double v) { return fmt::format("{:08x}", static_cast<uint32_t>(v)); }

// Every rank's host name, in rank order (64 bytes each through the control channel).
std::vector<std::string> rank_hosts(Communicator& comm) {
  constexpr size_t kBytes = 64;
  const std::string mine = host_name().substr(0, kBytes);
  std::vector<double> bytes(kBytes, 0.0);
  for (size_t i = 0; i < mine.size(); ++i) bytes[i] = static_cast<unsigned char>(mine[i]);
  const std::vector<double> all = comm.gather_control(bytes);
  std::vector<std::string> hosts(static_cast<size_t>(comm.size()));
  for (size_t r = 0; r < hosts.size(); ++r) {
    for (size_t i = 0; i < kBytes && all[r * kBytes + i] != 0; ++i) {
      hosts[r] += static_cast<char>(all[r * kBytes + i]);
    }
  }
  return hosts;
}

// The ranks that create, commit and prune the checkpoint directory: rank 0 on shared
// storage; on node-local storage the first rank of each host, each in its own directory.
bool directory_owner(const TrainConfig& cfg, const std::vector<std::string>& hosts, int rank) {
  if (!cfg.node_local_checkpoints) return rank == 0;
  for (int q = 0; q < rank; ++q) {
    if (hosts[static_cast<size_t>(q)] == hosts[static_cast<size_t>(rank)]) return false;
  }
  return true;
}

}  // namespace

std::filesystem::path SaveTicket::file(int index) const {
  return temp / checkpoint::rank_file_name(index);
}

SaveTicket begin_save(const SaveParty& party, int64_t step, checkpoint::Meta meta) {
  Communicator& comm = *party.comm;
  const TrainConfig& cfg = *party.cfg;
  namespace ck = checkpoint;
  SaveTicket t;
  t.step = step;
  t.meta = std::move(meta);
  t.temp = ck::temp_dir(cfg.checkpoint_dir, static_cast<uint64_t>(step));
  const int rank = comm.rank();
  if (cfg.node_local_checkpoints) t.hosts = rank_hosts(comm);
  t.owner = directory_owner(cfg, t.hosts, rank);
  std::string error;
  if (t.owner) {
    try {
      std::filesystem::remove_all(t.temp);
      std::filesystem::create_directories(t.temp);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (comm.sum_control(error.empty() ? 0.0 : 1.0) > 0) {
    if (t.owner && !error.empty()) {
      throw CheckpointNotCommitted(fmt::format("checkpoint at step {}: {}", step, error));
    }
    throw CheckpointNotCommitted(fmt::format("checkpoint at step {}: {} could not create {}", step,
                                             cfg.node_local_checkpoints ? "a host" : "rank 0",
                                             t.temp.string()));
  }
  return t;
}

ShardWritten write_shards(const SaveParty& party, const SaveTicket& t, const RankShards& shards,
                          const std::vector<checkpoint::StepHistory>& history) {
  ShardWritten w;
  try {
    if (shards.writer) {
      HeldIslands& islands = *shards.islands;
      islands.for_each([&](int v) {
        const RankShards::Island& island = shards.held[static_cast<size_t>(v)];
        const std::filesystem::path file = t.file(island.file);
        party.faults->shard_write(t.step, file);
        const std::string crc = write_shard(island.tensors, islands.store(), file);
        w.files.push_back({crc, std::filesystem::file_size(file)});
      });
    }
    if (party.comm->rank() == 0) w.history = checkpoint::write_history(t.temp, history);
  } catch (const std::exception& e) {
    w.error = e.what();
  }
  return w;
}

checkpoint::Meta agree_save(const SaveParty& party, const SaveTicket& t, const ShardWritten& w) {
  Communicator& comm = *party.comm;
  const TrainConfig& cfg = *party.cfg;
  namespace ck = checkpoint;
  const int64_t step = t.step;
  const std::string& error = w.error;
  // Agreement: every rank's verdict, size and digest, and rank 0's of the history (every
  // host's meta.json lists it).
  // Per rank: the verdict, then each shard's size and digest (one per island it holds),
  // then the history's.
  const auto hosted = static_cast<size_t>(party.files_per_rank);
  std::vector<double> mine{error.empty() ? 1.0 : 0.0};
  for (size_t v = 0; v < hosted; ++v) {
    const ShardWritten::File none;
    const ShardWritten::File& f = v < w.files.size() ? w.files[v] : none;
    mine.push_back(static_cast<double>(f.bytes));
    mine.push_back(crc_value(f.crc32c));
  }
  const size_t history_at = 1 + 2 * hosted;
  mine.push_back(static_cast<double>(w.history.bytes));
  mine.push_back(crc_value(w.history.crc32c));
  const std::vector<double> all = comm.gather_control(mine);
  const auto entry = [&](int r) { return all.data() + static_cast<size_t>(r) * mine.size(); };
  std::vector<int> failed;
  for (int r = 0; r < comm.size(); ++r) {
    if (entry(r)[0] != 1.0) failed.push_back(r);
  }
  ck::Meta meta = t.meta;
  // Shard R is rank R % N's (R / N)-th: islands in turn write island v's as v N + r; an HSDP
  // replica's rank writes none.
  const int n = comm.size();
  for (int file = 0; failed.empty() && file < meta.shard_files(); ++file) {
    const double* v = entry(file % n) + 1 + 2 * static_cast<size_t>(file / n);
    meta.files.push_back({.name = ck::rank_file_name(file),
                          .bytes = static_cast<uint64_t>(v[0]),
                          .crc32c = crc_hex(v[1]),
                          .sha256 = {}});
    if (cfg.node_local_checkpoints) meta.hosts.push_back(t.hosts[static_cast<size_t>(file % n)]);
  }
  meta.files.push_back({.name = std::string(ck::kHistoryFile),
                        .bytes = static_cast<uint64_t>(all[history_at]),
                        .crc32c = crc_hex(all[history_at + 1]),
                        .sha256 = {}});
  if (cfg.node_local_checkpoints) meta.hosts.push_back(t.hosts[0]);
  if (!failed.empty()) {
    // Every rank names the cause (the file and the system's reason), whichever rank met it
    // and whichever rank's message the run reports.
    const std::string cause = first_error(comm, error);
    // Every rank has finished with the temporary: what it holds can never be committed, and
    // on a full disk its space is what the user needs back.
    if (t.owner) {
      std::error_code ec;
      std::filesystem::remove_all(t.temp, ec);
    }
    throw CheckpointNotCommitted(
        fmt::format("checkpoint at step {} not committed: rank(s) {} could not write "
                    "their files{}{}",
                    step, fmt::join(failed, ", "), cause.empty() ? "" : ": ", cause));
  }
  return meta;
}

std::string first_error(Communicator& comm, const std::string& error) {
  // One message is plenty: the rest of a long one is cut.
  constexpr size_t kMostChars = 1024;
  const size_t mine_chars = std::min(error.size(), kMostChars);
  const auto width = static_cast<size_t>(comm.max_control(static_cast<double>(mine_chars))) + 1;
  std::vector<double> mine(width, 0.0);
  mine[0] = static_cast<double>(mine_chars);
  for (size_t i = 0; i < mine_chars; ++i) mine[1 + i] = static_cast<unsigned char>(error[i]);
  const std::vector<double> all = comm.gather_control(mine);
  for (size_t at = 0; at + width <= all.size(); at += width) {
    const auto n = static_cast<size_t>(all[at]);
    if (n == 0) continue;
    std::string text(n, ' ');
    for (size_t i = 0; i < n; ++i) text[i] = static_cast<char>(static_cast<int>(all[at + 1 + i]));
    return text;
  }
  return {};
}

std::string commit_save(const SaveParty& party, const SaveTicket& t, const checkpoint::Meta& meta) {
  if (!t.owner) return {};
  const TrainConfig& cfg = *party.cfg;
  try {
    party.faults->commit(t.step, cfg.checkpoint_dir);
    // On node-local storage a host prunes only once every host has committed.
    checkpoint::commit(cfg.checkpoint_dir, t.temp, meta, cfg.node_local_checkpoints ? 0 : cfg.keep);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

void settle_commit(const TrainConfig& cfg, int64_t step, bool owner, bool any_failed,
                   const std::string& error) {
  if (any_failed) {
    throw CheckpointNotCommitted(fmt::format("checkpoint at step {} not committed: {}", step,
                                             !error.empty() ? error
                                             : cfg.node_local_checkpoints
                                                 ? "a host failed to commit it"
                                                 : "rank 0 failed to commit it"));
  }
  if (owner && cfg.node_local_checkpoints) {
    checkpoint::prune(cfg.checkpoint_dir, cfg.keep, static_cast<uint64_t>(step));
  }
}

void finish_save(const SaveParty& party, const SaveTicket& t, const ShardWritten& w) {
  const checkpoint::Meta meta = agree_save(party, t, w);
  const std::string error = commit_save(party, t, meta);
  Communicator& comm = *party.comm;
  const bool failed = comm.sum_control(error.empty() ? 0.0 : 1.0) > 0;
  settle_commit(*party.cfg, t.step, t.owner, failed, failed ? first_error(comm, error) : "");
}

void save_checkpoint(const SaveParty& party, int64_t step,
                     const std::vector<checkpoint::StepHistory>& history) {
  CommPhaseScope phase(party.comm->ledger(), CommPhase::kOther);
  const Tracer::Span span(party.tracer, "checkpoint", "checkpoint");
  SaveContent content = party.content(step);
  const SaveTicket t = begin_save(party, step, std::move(content.meta));
  const ShardWritten w = write_shards(party, t, content.shards, history);
  checkpoint::failpoint("shard-written", party.comm->rank());
  finish_save(party, t, w);
}

std::optional<int64_t> SyncSaver::at_boundary(const SaveBoundary& b) {
  if (!b.due && !b.last && !b.interrupted) return std::nullopt;
  ++stats_.requested;
  const auto t0 = std::chrono::steady_clock::now();
  save_checkpoint(party_, b.step, *b.history);
  stats_.stall_seconds.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  ++stats_.committed;
  return b.step;
}

}  // namespace zerodp
