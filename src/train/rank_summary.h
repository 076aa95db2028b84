// A rank's summary for the report: its memory as training left it and its traffic, packed
// into the doubles of one control gather and unpacked on rank 0 by one walk of its fields.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "train/rank_trainer.h"
#include "train/result.h"

namespace zerodp {

// A rank's memory as training left it, in its summary's fields (the comm tables and the
// samples digest are filled in when it is packed).
RankSummary memory_summary(RankTrainer& trainer);
// `s` with `comm`'s tables and the samples digest (hex), as the doubles rank 0 gathers.
std::vector<double> pack_summary(RankSummary s, Communicator& comm, const std::string& samples);
// Rank `rank`'s summary from its packed doubles.
RankSummary unpack_summary(std::span<const double> v, int rank);

}  // namespace zerodp
