#include "core/version.h"

namespace zerodp {

const char* zerodp_version() { return ZERODP_VERSION; }

}  // namespace zerodp
