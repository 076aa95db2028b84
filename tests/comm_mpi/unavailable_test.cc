// In a build without MPI the mpi backend says so, and says how to get it.
#include <string>

#include <gtest/gtest.h>

#include "comm/mpi.h"
#include "core/error.h"

namespace zerodp {
namespace {

TEST(MpiUnavailableTest, ReportsItselfUnavailable) { EXPECT_FALSE(mpi_backend_available()); }

TEST(MpiUnavailableTest, SessionThrowsSayingHowToGetMpi) {
  int argc = 0;
  char** argv = nullptr;
  try {
    MpiSession session(argc, argv);
    ADD_FAILURE() << "MpiSession was created in a build without MPI";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("built without MPI"), std::string::npos) << what;
    EXPECT_NE(what.find("libopenmpi-dev"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace zerodp
