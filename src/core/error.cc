// error.h is the contract.
#include "core/error.h"

namespace zerodp {

std::string out_of_memory_message(const std::bad_alloc& e) {
  return std::string("out of memory: an allocation failed (") + e.what() +
         "); use a higher --stage, fewer ranks per process, a smaller --micro-batch, "
         "--checkpoint-activations or --offload optimizer (zerodp estimate shows what each "
         "needs)";
}

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
  } catch (const std::bad_alloc& e) {
    // Its what() is the type's name alone; the user needs what ran out and what helps.
    throw OutOfMemory(context + ": " + out_of_memory_message(e));
  } catch (const std::exception& e) {
    throw Error(at(e));
  }
}

}  // namespace zerodp
