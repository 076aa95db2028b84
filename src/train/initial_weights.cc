// initial_weights.h is the contract.
#include "train/initial_weights.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "tensor/dtype.h"
#include "train/flat.h"
#include "train/state_store.h"

namespace zerodp {
namespace {

namespace st = safetensors;

bool widenable(st::ElementType t) {
  return t == st::ElementType::kF32 || t == st::ElementType::kBF16 || t == st::ElementType::kF16;
}

// A unit's flat elements, read from the file's tensors and widened to fp32.
class UnitReader {
 public:
  UnitReader(const st::Reader& file, const Unit& unit) : file_(file), unit_(unit) {}

  // Elements [first, first + out.size()) of the unit's flat buffer into `out`.
  void read(size_t first, std::span<float> out) {
    const size_t end = first + out.size();
    for (const TensorSpec& t : unit_.tensors()) {
      const size_t lo = std::max(first, t.offset), hi = std::min(end, t.offset + t.numel);
      if (lo >= hi) continue;
      const st::TensorInfo* found = file_.find(t.name);
      // Checked before training; a file replaced since is caught here.
      if (found == nullptr || found->numel() != t.numel || !widenable(found->type)) {
        throw CorruptData(fmt::format("--init-from {}: tensor {} changed since it was checked",
                                      file_.path().string(), t.name));
      }
      const st::TensorInfo& info = *found;
      std::span<float> into = out.subspan(lo - first, hi - lo);
      const size_t at = lo - t.offset;
      if (info.type == st::ElementType::kF32) {
        file_.read(info, at, std::as_writable_bytes(into));
        continue;
      }
      raw_.resize((hi - lo) * st::element_size(info.type));
      file_.read(info, at, raw_);
      if (info.type == st::ElementType::kBF16) {
        convert(std::span(reinterpret_cast<const BFloat16*>(raw_.data()), hi - lo), into);
      } else {
        convert(std::span(reinterpret_cast<const Float16*>(raw_.data()), hi - lo), into);
      }
    }
  }

 private:
  const st::Reader& file_;
  const Unit& unit_;
  std::vector<std::byte> raw_;
};

}  // namespace

void check_initial_weights(const Model& model, const std::string& model_name,
                           const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    throw InvalidArgument(fmt::format(
        "--init-from {} does not exist; give a safetensors file of the model's weights (zerodp "
        "export writes one)",
        file.string()));
  }
  const st::Reader reader(file);
  const std::string where = fmt::format("--init-from {}", file.string());
  std::set<std::string_view> wanted;
  for (const auto& unit : model) {
    for (const TensorSpec& t : unit->tensors()) {
      wanted.insert(t.name);
      const st::TensorInfo* info = reader.find(t.name);
      if (info == nullptr) {
        throw InvalidArgument(fmt::format(
            "{}: the file has no tensor {} [{}], which {} needs; give weights of this model "
            "(zerodp export writes them) or the model flags that match the file",
            where, t.name, fmt::join(t.shape, ", "), model_name));
      }
      if (info->shape != t.shape) {
        throw InvalidArgument(fmt::format(
            "{}: tensor {} is [{}] in the file, [{}] in {}; give the model flags that match the "
            "file",
            where, t.name, fmt::join(info->shape, ", "), fmt::join(t.shape, ", "), model_name));
      }
      if (!widenable(info->type)) {
        throw InvalidArgument(fmt::format("{}: tensor {} is {}; use F32, BF16 or F16 weights",
                                          where, t.name, st::element_type_name(info->type)));
      }
    }
  }
  // Every value finite: a NaN or an infinity would train into NaN losses without a word.
  std::vector<float> values;
  for (const auto& unit : model) {
    UnitReader read(reader, *unit);
    constexpr size_t kChunk = size_t{1} << 20;
    for (size_t at = 0; at < unit->numel(); at += kChunk) {
      values.resize(std::min(kChunk, unit->numel() - at));
      read.read(at, values);
      const auto bad =
          std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
      if (bad == values.end()) continue;
      const size_t i = at + static_cast<size_t>(bad - values.begin());
      const auto t = std::find_if(unit->tensors().begin(), unit->tensors().end(),
                                  [i](const TensorSpec& x) { return i < x.offset + x.numel; });
      throw InvalidArgument(fmt::format("{}: tensor {} holds {} at element {}; give finite weights",
                                        where, t->name, *bad, i - t->offset));
    }
  }
  for (const st::TensorInfo& info : reader.header().tensors) {
    if (wanted.count(info.name) == 0) {
      throw InvalidArgument(fmt::format(
          "{}: the file holds {} [{}], which {} does not have; give weights of this model "
          "only (tensors under the names zerodp export writes)",
          where, info.name, fmt::join(info.shape, ", "), model_name));
    }
  }
}

void load_initial_weights(RankTrainer& trainer, const std::filesystem::path& file) {
  const st::Reader reader(file);
  ShardedState& state = trainer.state();
  StateStore& store = trainer.store();
  const DType dtype = state.dtype();
  std::vector<float> tmp;
  for (size_t i = 0; i < state.units().size(); ++i) {
    UnitState& u = state.units()[i];
    UnitReader values(reader, *u.unit);
    const Range held = u.held;
    if (held == u.opt_range) {
      // The parameters it holds are those it updates, wherever the store keeps them.
      const StateStore::Job job{i, {0, held.count()}, StateStore::kParams};
      store.stream(std::span(&job, 1), StateStore::Access::kWrite, [&](StateStore::Piece& p) {
        tmp.resize(p.count);
        values.read(held.begin + p.begin, tmp);
        narrow(tmp, p.params, dtype, 0);
      });
    } else {
      tmp.resize(held.count());
      values.read(held.begin, tmp);
      narrow(tmp, u.params.data(), dtype, 0);
    }
    if (state.fp32()) continue;  // the parameters are the master
    const StateStore::Job job{i, {0, u.opt_range.count()}, StateStore::kMaster};
    store.stream(std::span(&job, 1), StateStore::Access::kWrite,
                 [&](StateStore::Piece& p) { values.read(u.opt_range.begin + p.begin, p.master); });
  }
}

}  // namespace zerodp
