// Typed errors, by who can fix them (docs/architecture.md, "Errors").
//
// Library code throws these and never exits; only main() turns one into an exit code.
// Every message names the thing, the value, and what would work.
#pragma once

#include <new>
#include <stdexcept>
#include <string>

namespace zerodp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller asked for something invalid: a bad flag, a mismatched buffer size.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A file could not be read or written.
class IoError : public Error {
 public:
  using Error::Error;
};

// A file's content is not what it claims to be (checksum, format, model mismatch).
class CorruptData : public Error {
 public:
  using Error::Error;
};

// A request does not fit the memory budget of a rank.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// A peer failed, or a collective could not complete. `failed_rank` is the rank at fault
// when it is known, -1 otherwise.
class CommError : public Error {
 public:
  CommError(const std::string& what, int failed_rank) : Error(what), failed_rank_(failed_rank) {}
  int failed_rank() const { return failed_rank_; }

 private:
  int failed_rank_;
};

// A collective waited past its timeout.
class CommTimeout : public CommError {
 public:
  using CommError::CommError;
};

// Inside a catch block: throws the exception in flight again as the same type of this file,
// its message led by `context` (e.g. "rank 1 of 4, step 7"), so a failure reported far from
// where it happened still says where; any other exception becomes an Error.
[[noreturn]] void rethrow_with_context(const std::string& context);

// A failed allocation in words: what ran out and what would help.
std::string out_of_memory_message(const std::bad_alloc& e);

}  // namespace zerodp
