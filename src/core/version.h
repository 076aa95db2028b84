// zerodp's version, as the build's project() declares it: written into every report,
// checkpoint and page, and printed by --version.
#pragma once

namespace zerodp {

const char* zerodp_version();

}  // namespace zerodp
