// error.h is the contract.
#include "core/error.h"

namespace zerodp {

void rethrow_with_context(const std::string& context) {
  const auto at = [&context](const std::exception& e) { return context + ": " + e.what(); };
  try {
    throw;
  } catch (const CommTimeout& e) {
    throw CommTimeout(at(e), e.failed_rank());
  } catch (const CommError& e) {
    throw CommError(at(e), e.failed_rank());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(at(e));
  } catch (const CorruptData& e) {
    throw CorruptData(at(e));
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(at(e));
  } catch (const IoError& e) {
    throw IoError(at(e));
  } catch (const std::exception& e) {
    throw Error(at(e));
  }
}

}  // namespace zerodp
