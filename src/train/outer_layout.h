// What a rank allocates for DiLoCo's outer step (train/outer_step.h), computed before anything
// is allocated: the one description OuterStep allocates its buffers from and the planner
// (rank_holdings, the forecast, the preflight, the report's plan) sums, so what a rank holds
// and what the plan says of its outer state cannot drift. OuterStep also derives the same
// sizes from the fragment pieces it runs on and refuses to start when they differ.
//
// These buffers are the rank's, once however many islands it hosts: the global weights and
// momentum are the column's, which every island it holds merges into. What is kept per island
// (state_layout.h's error_feedback, an island's compression error of its own ranges) is an
// entry of the state layout instead, counted once per hosted island beside the island's other
// states; both land in the ledger's outer_state.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "train/plan.h"

namespace zerodp {

// Rank `rank`'s part of fragment f (Streaming DiLoCo's, [f P / F, (f + 1) P / F) of the
// model's P elements, units concatenated): its own ranges of the units (Partition(numel, n),
// cut on the grain, index rank % n) within it; and, with --outer-quant, the fragment's blocks
// of kOuterQuantBlock in the model, those its own elements touch (a scale each in its
// payload) and its payload's bytes (those scales, then its packed codes). 0 unquantized.
struct OuterFragment {
  uint64_t count = 0;
  uint64_t blocks = 0;
  uint64_t touched = 0;
  uint64_t payload = 0;
  bool operator==(const OuterFragment&) const = default;
};
OuterFragment outer_fragment(std::span<const uint64_t> unit_numel, const IslandLayout& l, int rank,
                             int f);

// The outer step's buffers on rank `rank`, in elements of their type. Empty without islands.
struct OuterLayout {
  // Per unit, its own range's elements: the fp32 global weights, and as many of momentum.
  std::vector<uint64_t> own;
  std::vector<OuterFragment> fragments;
  uint64_t exchange = 0;  // fp32: the largest fragment's count, its pseudo-gradient in flight
  // fp32: stage 0 at 16 bits offloaded, islands of more than one rank: each rank's whole master
  // is in its file, so a merge gathers it a unit at a time through a buffer of the largest.
  uint64_t whole_master = 0;
  // --outer-quant: a fragment's block maxima (fp32, the most blocks of a fragment), its codes
  // (int8, one per element of the exchange), this rank's payload and every island's gathered
  // over the column (bytes, the largest fragment payload each).
  uint64_t amax = 0;
  uint64_t codes = 0;
  uint64_t payload = 0;
  uint64_t gathered = 0;
  uint64_t bytes() const;
  // The exchange's buffers from `fragments`, each as large as the largest fragment needs:
  // the one rule the planner and the outer step's own pieces both size by.
  void size_exchange(bool quantized, int islands);
};
OuterLayout outer_layout(std::span<const uint64_t> unit_numel, const IslandLayout& l, int rank);
// The first size in which `got` differs from `want`, named ("fragment 1's payload: 12, not
// 16"), for the outer step's refusal; empty when they agree.
std::string outer_layout_difference(const OuterLayout& want, const OuterLayout& got);

}  // namespace zerodp
