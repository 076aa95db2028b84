// libFuzzer target for JSONL lines (`make fuzz`): corpus::parse_jsonl_line, the streaming
// parse zerodp prepare runs on every line of a .jsonl file, data/corpus.h.
//
// The input is one line (field "text"). parse_jsonl_line must not throw, and must agree with
// nlohmann::json's whole-document parse of the same bytes: a parse error exactly when that
// fails, "not an object" exactly when the value is no object, "no field" / "not a string" as
// the object's "text" member says, and otherwise that member's string, byte for byte.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "data/corpus.h"

namespace {

namespace corpus = zerodp::corpus;
using Json = nlohmann::json;

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "jsonl_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) die(what, detail);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  const std::string field = "text";
  corpus::JsonlText got;
  try {
    got = corpus::parse_jsonl_line(line, field);
  } catch (const std::exception& e) {
    die("parse_jsonl_line threw", e.what());
  }
  Json whole;
  bool parsed = true;
  try {
    whole = Json::parse(line);
  } catch (const Json::exception&) {
    parsed = false;
  }
  using P = corpus::LineProblem;
  if (!parsed) {
    check(got.problem == P::kNotJson, "the DOM parse fails, the line parse does not", got.detail);
    check(got.detail.starts_with("is not JSON"), "detail", got.detail);
    return 0;
  }
  check(got.problem != P::kNotJson, "the DOM parse succeeds, the line parse does not", got.detail);
  if (!whole.is_object()) {
    check(got.problem == P::kNotObject, "a non-object accepted", got.detail);
    return 0;
  }
  const auto it = whole.find(field);
  if (it == whole.end()) {
    check(got.problem == P::kNoField, "a missing field not named", got.detail);
  } else if (!it->is_string()) {
    check(got.problem == P::kNotString, "a non-string field accepted", got.detail);
  } else {
    check(got.problem == P::kNone, "a good line refused", got.detail);
    check(got.text == it->get<std::string>(), "the text differs", got.text);
  }
  return 0;
}
