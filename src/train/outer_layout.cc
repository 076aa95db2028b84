// outer_layout.h is the contract.
#include "train/outer_layout.h"

#include <algorithm>
#include <optional>

#include <fmt/core.h>

#include "train/state_layout.h"

namespace zerodp {

OuterFragment outer_fragment(std::span<const uint64_t> unit_numel, const IslandLayout& l, int rank,
                             int f) {
  uint64_t total = 0;
  for (uint64_t numel : unit_numel) total += numel;
  const Range frag = balanced_range(total, l.fragments, f);
  const uint64_t lo = frag.begin, hi = frag.end;
  const uint64_t block = kOuterQuantBlock;
  OuterFragment s;
  uint64_t touched = 0;
  uint64_t at = 0;
  std::optional<uint64_t> last;  // the last block touched
  for (uint64_t numel : unit_numel) {
    const Range own = own_range(numel, l.ranks, rank % l.ranks, l.grain);
    const uint64_t b = std::max<uint64_t>(lo, at + own.begin);
    const uint64_t e = std::min<uint64_t>(hi, at + own.end);
    if (b < e) {
      s.count += e - b;
      const uint64_t first = (b - lo) / block, end = (e - 1 - lo) / block + 1;
      touched += end - first - (last == first ? 1 : 0);
      last = end - 1;
    }
    at += numel;
  }
  if (l.quant_bits != 0) {
    s.blocks = (hi - lo + block - 1) / block;
    s.touched = touched;
    s.payload = 4 * touched + (l.quant_bits == 4 ? (s.count + 1) / 2 : s.count);
  }
  return s;
}

void OuterLayout::size_exchange(bool quantized, int islands) {
  exchange = amax = payload = codes = gathered = 0;
  for (const OuterFragment& f : fragments) {
    exchange = std::max(exchange, f.count);
    amax = std::max(amax, f.blocks);
    payload = std::max(payload, f.payload);
  }
  if (quantized) {
    codes = exchange;
    gathered = payload * static_cast<uint64_t>(islands);
  }
}

OuterLayout outer_layout(std::span<const uint64_t> unit_numel, const IslandLayout& l, int rank) {
  OuterLayout o;
  if (l.islands == 1) return o;
  for (uint64_t numel : unit_numel) {
    o.own.push_back(own_range(numel, l.ranks, rank % l.ranks, l.grain).count());
  }
  for (int f = 0; f < l.fragments; ++f)
    o.fragments.push_back(outer_fragment(unit_numel, l, rank, f));
  o.size_exchange(l.quant_bits != 0, l.islands);
  if (l.gathers_master && l.master_offloaded && l.ranks > 1) {
    for (uint64_t numel : unit_numel) o.whole_master = std::max(o.whole_master, numel);
  }
  return o;
}

uint64_t OuterLayout::bytes() const {
  uint64_t owned = 0;
  for (uint64_t n : own) owned += n;
  return 4 * (2 * owned + exchange + whole_master + amax) + codes + payload + gathered;
}

std::string outer_layout_difference(const OuterLayout& want, const OuterLayout& got) {
  struct Size {
    std::string name;
    uint64_t want, got;
  };
  std::vector<Size> sizes{{"units", want.own.size(), got.own.size()}};
  for (size_t i = 0; i < std::min(want.own.size(), got.own.size()); ++i) {
    sizes.push_back({fmt::format("unit {}'s own range", i), want.own[i], got.own[i]});
  }
  sizes.push_back({"fragments", want.fragments.size(), got.fragments.size()});
  for (size_t f = 0; f < std::min(want.fragments.size(), got.fragments.size()); ++f) {
    const OuterFragment &w = want.fragments[f], &g = got.fragments[f];
    const std::string at = fmt::format("fragment {}'s ", f);
    sizes.push_back({at + "count", w.count, g.count});
    sizes.push_back({at + "blocks", w.blocks, g.blocks});
    sizes.push_back({at + "touched blocks", w.touched, g.touched});
    sizes.push_back({at + "payload", w.payload, g.payload});
  }
  sizes.push_back({"exchange", want.exchange, got.exchange});
  sizes.push_back({"whole master", want.whole_master, got.whole_master});
  sizes.push_back({"block maxima", want.amax, got.amax});
  sizes.push_back({"codes", want.codes, got.codes});
  sizes.push_back({"payload", want.payload, got.payload});
  sizes.push_back({"gathered payloads", want.gathered, got.gathered});
  for (const Size& s : sizes) {
    if (s.want != s.got) return fmt::format("{}: {}, not {}", s.name, s.got, s.want);
  }
  return {};
}

}  // namespace zerodp
