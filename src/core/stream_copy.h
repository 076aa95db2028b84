// A large copy whose destination bypasses the caches (non-temporal stores), for buffers
// written once and not read back soon by this core: a checkpoint's staging, read next by the
// disk's DMA. A regular store first reads each destination line into the cache
// (read-for-ownership: a third more memory traffic than the copy itself) and evicts the
// training's working set to make room for bytes it will not touch. The bytes are memcpy's.
#pragma once

#include <cstddef>

namespace zerodp {

// Copies `bytes` from `src` to `dst` (which must not overlap). Below kStreamCopyMinBytes it
// is memcpy.
void stream_copy(void* dst, const void* src, size_t bytes);
inline constexpr size_t kStreamCopyMinBytes = size_t{256} << 10;

}  // namespace zerodp
