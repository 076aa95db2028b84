// rank_summary.h is the contract.
#include "train/rank_summary.h"

#include <type_traits>

#include <fmt/core.h>

#include "tensor/gemm.h"

namespace zerodp {
namespace {

// Each field of a rank's summary in the one order its doubles travel in (the samples digest
// follows as 32 bytes): packing and unpacking are this walk in the two directions, so they
// cannot disagree.
template <typename F>
void each_field(RankSummary& s, F&& f) {
  for (auto& x : s.model_state) f(x);
  for (auto& x : s.peak) f(x);
  f(s.peak_total);
  f(s.gemm_bf16_copy_bytes);
  f(s.nvme_bytes);
  f(s.offload_bytes_read);
  f(s.offload_bytes_written);
  f(s.offload_wait_seconds);
  f(s.offload_update_bytes);
  f(s.offload_update_seconds);
  f(s.offload_direct);
  for (auto* table : {&s.comm_train, &s.comm_other}) {
    for (auto& c : *table) {
      f(c.calls);
      f(c.bytes);
      f(c.cross_node_bytes);
    }
  }
}

}  // namespace

RankSummary memory_summary(RankTrainer& trainer) {
  RankSummary s;
  s.model_state = trainer.ledger().current_table();
  s.peak = trainer.ledger().peak_table();
  s.peak_total = trainer.ledger().peak_total();
  s.gemm_bf16_copy_bytes = gemm_bf16_copy_bytes();
  s.nvme_bytes = trainer.ledger().disk();
  if (OffloadTier* tier = trainer.offload()) {
    const OffloadTier::Counters c = trainer.offload_counters();
    s.offload_bytes_read = c.bytes_read;
    s.offload_bytes_written = c.bytes_written;
    s.offload_wait_seconds = c.wait_seconds;
    s.offload_update_bytes = c.update_bytes;
    s.offload_update_seconds = c.update_seconds;
    s.offload_direct = tier->file().direct();
  }
  return s;
}

std::vector<double> pack_summary(RankSummary s, Communicator& comm, const std::string& samples) {
  s.comm_train = comm.ledger().table(CommPhase::kTrain);
  s.comm_other = comm.ledger().table(CommPhase::kOther);
  std::vector<double> v;
  each_field(s, [&](const auto& x) { v.push_back(static_cast<double>(x)); });
  for (size_t i = 0; i < 64; i += 2) v.push_back(std::stoi(samples.substr(i, 2), nullptr, 16));
  return v;
}

RankSummary unpack_summary(std::span<const double> v, int rank) {
  RankSummary s;
  s.rank = rank;
  size_t k = 0;
  each_field(s, [&](auto& x) { x = static_cast<std::remove_reference_t<decltype(x)>>(v[k++]); });
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += fmt::format("{:02x}", static_cast<int>(v[k++]));
  s.samples_sha256 = hex;
  return s;
}

}  // namespace zerodp
