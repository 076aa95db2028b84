// MemoryLedger: every large buffer of a rank, by category, with current and peak bytes.
//
// Categories follow the ZeRO accounting: the persistent model states (params, grads, master,
// adam_m, adam_v) and the transient buffers (gathered stage-3 unit params, grad_buckets,
// grad_accum (the canonical order's fp32 accumulator), hpz_params (hpZ's copy of stage 3's
// parameters sharded within the node), activations, comm_buffers, workspace, offload_staging
// (the pieces of the offload file in flight)). States kept on disk by the offload tier are
// not memory: they are counted apart, as `disk` bytes (the report's "nvme").
// `peak_total` is the peak of the sum over categories, not the sum of their peaks. An optional
// budget (the accelerator's capacity,
// `--memory-per-rank`) makes a reservation past it fail with OutOfMemory naming the rank,
// the category, the request, the budget and what is held, plus the caller's advice on
// which stage or rank count would fit.
//
// Buffer<T> is the RAII owner through which zerodp allocates: zeroed, 64-byte aligned,
// released to the ledger when destroyed. A ledger is used by its rank's thread only; it
// must outlive its buffers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace zerodp {

enum class MemCategory : uint8_t {
  kParams,
  kGrads,
  kMaster,
  kAdamM,
  kAdamV,
  kGathered,
  kGradBuckets,
  kGradAccum,
  kHpzParams,
  kActivations,
  kCommBuffers,
  kWorkspace,
  kOffloadStaging,
  kOuterState,         // DiLoCo: the global weights and the outer momentum of the own ranges
  kCheckpointStaging,  // --checkpoint-async: the shard's copy its writer thread writes
};
inline constexpr int kNumMemCategories = 15;
std::string_view mem_category_name(MemCategory c);  // "params", "adam_m", "grad_buckets", ...

class MemoryLedger {
 public:
  using Table = std::array<uint64_t, kNumMemCategories>;

  // `advice`: as set_advice.
  explicit MemoryLedger(int rank = 0, std::optional<uint64_t> budget_bytes = std::nullopt,
                        std::string advice = {})
      : rank_(rank), budget_(budget_bytes), advice_(std::move(advice)) {}
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  // Records `bytes` more in category `c`; throws OutOfMemory (recording nothing) when the
  // total would pass the budget.
  void reserve(MemCategory c, uint64_t bytes);
  void release(MemCategory c, uint64_t bytes);

  uint64_t current(MemCategory c) const { return current_[static_cast<int>(c)]; }
  uint64_t peak(MemCategory c) const { return peak_[static_cast<int>(c)]; }
  uint64_t current_total() const { return current_total_; }
  uint64_t peak_total() const { return peak_total_; }
  const Table& current_table() const { return current_; }
  const Table& peak_table() const { return peak_; }

  // Bytes of this rank's states kept in files (the offload tier), apart from the categories:
  // they take no memory and no budget.
  void add_disk(uint64_t bytes) { disk_ += bytes; }
  uint64_t disk() const { return disk_; }

  // Starts a new measurement window: peaks become the current values.
  void reset_peaks();

  int rank() const { return rank_; }
  std::optional<uint64_t> budget() const { return budget_; }
  // Appended to budget errors, e.g. "stage 3 on 4 ranks would need 1.2 GiB per rank".
  void set_advice(std::string advice) { advice_ = std::move(advice); }

 private:
  int rank_;
  std::optional<uint64_t> budget_;
  std::string advice_;
  Table current_{};
  Table peak_{};
  uint64_t current_total_ = 0;
  uint64_t peak_total_ = 0;
  uint64_t disk_ = 0;
};

namespace detail {
void* allocate_zeroed(size_t bytes);
void deallocate(void* p) noexcept;
}  // namespace detail

// Owns `count` zeroed elements of T, accounted in one category of one ledger.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(MemoryLedger& ledger, MemCategory category, size_t count)
      : ledger_(&ledger), category_(category), count_(count) {
    ledger.reserve(category, bytes());
    try {
      data_ = static_cast<T*>(detail::allocate_zeroed(bytes()));
    } catch (...) {
      ledger.release(category, bytes());
      throw;
    }
  }
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ledger_ = std::exchange(o.ledger_, nullptr);
      category_ = o.category_;
      count_ = std::exchange(o.count_, 0);
      data_ = std::exchange(o.data_, nullptr);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Frees the memory now and returns it to the ledger.
  void reset() noexcept {
    if (ledger_ != nullptr) {
      detail::deallocate(data_);
      ledger_->release(category_, bytes());
    }
    ledger_ = nullptr;
    data_ = nullptr;
    count_ = 0;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  bool empty() const { return count_ == 0; }
  MemCategory category() const { return category_; }
  std::span<T> span() { return {data_, count_}; }
  std::span<const T> span() const { return {data_, count_}; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  MemoryLedger* ledger_ = nullptr;
  MemCategory category_ = MemCategory::kWorkspace;
  size_t count_ = 0;
  T* data_ = nullptr;
};

}  // namespace zerodp
