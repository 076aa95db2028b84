#include "comm/ledger.h"

namespace zerodp {

std::string_view comm_kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::kAllReduce:
      return "all_reduce";
    case CommKind::kReduceScatter:
      return "reduce_scatter";
    case CommKind::kAllGather:
      return "all_gather";
    case CommKind::kBroadcast:
      return "broadcast";
    case CommKind::kControl:
      return "control";
  }
  return "unknown";
}

CommCounter CommLedger::total(CommKind kind) const {
  CommCounter sum;
  for (const auto& t : tables_) {
    sum.calls += t[static_cast<int>(kind)].calls;
    sum.bytes += t[static_cast<int>(kind)].bytes;
    sum.cross_node_bytes += t[static_cast<int>(kind)].cross_node_bytes;
  }
  return sum;
}

uint64_t CommLedger::data_bytes(CommPhase phase) const {
  uint64_t sum = 0;
  for (int k = 0; k < kNumCommKinds; ++k) {
    if (static_cast<CommKind>(k) != CommKind::kControl)
      sum += get(phase, static_cast<CommKind>(k)).bytes;
  }
  return sum;
}

}  // namespace zerodp
