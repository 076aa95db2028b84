// Byte corpora for language modelling: the King James Bible from Debian's bible-kjv, or
// any file.
//
// The bible-kjv packages ship the text only in the `bible` program's compressed format, so
// the KJV corpus is what `bible -f gen1:1-rev22:21 </dev/null` prints: every verse, one per
// line ("Ge1:1 In the beginning God created the heaven and the earth.\n"), 4,404,412 bytes
// whose SHA-256 is kKjvSha256. It is prepared once into a cache file and verified (length
// and SHA-256) on every load, so training always sees exactly these bytes or fails.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace zerodp {

inline constexpr uint64_t kKjvBytes = 4404412;
inline constexpr const char* kKjvSha256 =
    "cd45f0c9cedab8e4439bd6486c8952c77cc8b0ecc5d1f6ae3513f2039f47229d";
// The cache file's name inside the cache directory; the digest prefix names the version.
inline constexpr const char* kKjvCacheName = "kjv-cd45f0c9cedab8e4.txt";

struct KjvText {
  std::vector<uint8_t> bytes;        // kKjvBytes bytes, verified
  std::filesystem::path cache_file;  // where they are cached
  bool prepared = false;             // true: this call ran `bible` and wrote the cache
  bool replaced_bad_cache = false;   // true: a cache file failed verification and was rebuilt
};

// The KJV text, from `cache_dir`/kKjvCacheName when that file verifies, else prepared by
// running `bible_program` (looked up on PATH unless it contains a '/') and cached. The
// cache directory is created if missing. The cache is written to a unique temporary name
// in the same directory and renamed, so a crash leaves no partial cache and processes
// preparing at once (MPI ranks on one machine) each install a complete, identical file.
// A cache file that fails verification is derived data: it is rebuilt, and the result
// says so. Throws
//   IoError      when `bible_program` is not installed (naming the Debian package
//                bible-kjv), fails, or the cache cannot be written;
//   CorruptData  when the program prints other bytes than the pinned text (length and
//                SHA-256 expected vs actual).
// Measured on the 2-core development VM: preparing 0.36 s (0.13 s of it `bible`, most of
// the rest the fsync), loading a verified cache 0.06 s.
KjvText load_kjv(const std::filesystem::path& cache_dir,
                 const std::string& bible_program = "bible");

// $XDG_CACHE_HOME/zerodp if XDG_CACHE_HOME is set and absolute, else $HOME/.cache/zerodp
// (the XDG base-directory rule). Throws IoError when neither variable gives a directory,
// saying to set one or pass a cache directory explicitly.
std::filesystem::path default_cache_dir();

// Any file as a byte corpus. Throws IoError naming the path when it is missing, is not a
// regular file, or cannot be read; InvalidArgument when it is empty.
std::vector<uint8_t> read_text_corpus(const std::filesystem::path& path);

}  // namespace zerodp
