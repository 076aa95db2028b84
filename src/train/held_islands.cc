// held_islands.h is the contract.
#include "train/held_islands.h"

#include <stdexcept>
#include <utility>

namespace zerodp {

HeldIslands::HeldIslands(ShardedState& state, std::unique_ptr<OffloadTier> tier)
    : state_(state), parked_(1), memory_(state), store_(&memory_) {
  if (tier != nullptr) {
    tiers_.push_back(std::move(tier));
    store_.point_at(tiers_.front().get());
  }
}

void HeldIslands::add(std::vector<UnitState> units, std::unique_ptr<OffloadTier> tier) {
  if ((tier != nullptr) != !tiers_.empty()) {
    throw std::logic_error("HeldIslands: every island offloaded, or none");
  }
  parked_.push_back(std::move(units));
  if (tier != nullptr) tiers_.push_back(std::move(tier));
}

OffloadTier::Counters HeldIslands::offload_counters() const {
  OffloadTier::Counters sum;
  for (const auto& tier : tiers_) sum += tier->counters();
  return sum;
}

void HeldIslands::for_each(const std::function<void(int)>& f) {
  // However f ends, island 0's units go back in place. A throw is already the error to
  // report, so switching back then drops what the switch itself might raise.
  struct Restore {
    HeldIslands& islands;
    ~Restore() {
      if (islands.active_ == 0) return;
      try {
        if (islands.before_switch_) islands.before_switch_();
      } catch (...) {  // NOLINT(bugprone-empty-catch): see above
      }
      islands.swap_in(0);
    }
  } restore{*this};
  for (int v = 0; v < size(); ++v) {
    activate_island(v);
    f(v);
  }
  activate_island(0);  // an update's error surfaces here, as at any switch
}

void HeldIslands::activate_island(int v) {
  if (v == active_) return;
  if (before_switch_) before_switch_();
  swap_in(v);
}

void HeldIslands::swap_in(int v) {
  std::swap(state_.units(), parked_[index(active_)]);
  std::swap(state_.units(), parked_[index(v)]);
  active_ = v;
  if (!tiers_.empty()) store_.point_at(tiers_[index(v)].get());
}

}  // namespace zerodp
