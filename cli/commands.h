// The zerodp subcommands. Each registers its flags on a CLI11 subcommand and returns the
// function that runs it; main() owns parsing, MPI start-up and turning errors into exit codes.
#pragma once

#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "checkpoint/format.h"
#include "core/error.h"

namespace zerodp::cli {

// Exit codes: 0 ok, 1 runtime failure (comm, I/O), 2 bad usage or configuration,
// 3 corrupt data. main() maps exceptions onto them.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitCorrupt = 3;

inline int exit_code_for(const std::exception& e) {
  if (dynamic_cast<const InvalidArgument*>(&e) != nullptr) return kExitUsage;
  if (dynamic_cast<const CorruptData*>(&e) != nullptr) return kExitCorrupt;
  return kExitFailure;
}

struct Launch {
  int& argc;
  char**& argv;
};

using Runner = std::function<int(Launch)>;

// The command line without the program name, with `--config FILE` (a JSON object of
// flag names without "--" to values, or a run's report, whose "config" object is used)
// replaced by the flags it holds, placed before the other flags so that those win. Keys
// are checked against the options of the subcommand `app` is about to run. Throws
// InvalidArgument naming the file and the key.
std::vector<std::string> expand_config_file(int argc, char** argv, const CLI::App& app);

Runner add_bench_comm(CLI::App& app);
Runner add_bench_io(CLI::App& app);
Runner add_train(CLI::App& app);
Runner add_estimate(CLI::App& app);
Runner add_sample(CLI::App& app);
Runner add_export(CLI::App& app);
Runner add_report(CLI::App& app);
Runner add_tokenizer(CLI::App& app);
Runner add_prepare(CLI::App& app);

// A text input the user named: "kjv" is the KJV text that train --data kjv uses, prepared
// once into `cache_dir` (empty: ~/.cache/zerodp) and verified; any other name is a path.
std::filesystem::path resolve_text_input(const std::string& input, const std::string& cache_dir);

}  // namespace zerodp::cli
