// zerodp: data-parallel training with ZeRO stages 0-3, and the tools around it.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include <fmt/core.h>

#include "comm/communicator.h"
#include "commands.h"
#include "core/error.h"
#include "core/version.h"

int main(int argc, char** argv) {
  using namespace zerodp;
  // A write past `ulimit -f` would kill the process by SIGXFSZ (exit 153, nothing said);
  // ignored, the write fails with EFBIG and goes the way of a full disk: a message naming
  // the file, the checkpoint left uncommitted, the report written.
  std::signal(SIGXFSZ, SIG_IGN);
  // Likewise a reader that leaves (--metrics into `head`): the write fails with EPIPE and is
  // named, instead of the process vanishing mid-run with exit 141.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"zerodp " + std::string(zerodp_version()) +
                   ": data-parallel training with ZeRO stages 0-3, measured.\n"
                   "Every stage's memory and communication is counted per rank and reported.",
               "zerodp"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "zerodp " + std::string(zerodp_version()));
  app.footer(
      "Examples:\n"
      "  zerodp train --ranks 4 --stage 3 --steps 200 --report run.json\n"
      "  zerodp estimate --params 7.5e9 --ranks 64 --memory-per-rank 32GB\n"
      "  zerodp bench-comm --ranks 4 --max-bytes 64MiB\n"
      "  mpirun -np 2 zerodp bench-comm --backend mpi --json\n"
      "  zerodp bench-io /scratch --size 4GiB\n"
      "  zerodp train --layers 40 --embd 2048 --heads 16 --offload optimizer --offload-dir "
      "/scratch\n"
      "  zerodp train --steps 200 --checkpoint-dir ckpt --checkpoint-every 50\n"
      "  zerodp train --steps 400 --checkpoint-dir ckpt --resume latest\n"
      "  zerodp export ckpt --out model.safetensors\n"
      "  zerodp sample model.safetensors --prompt 'In the beginning' --max-tokens 200\n"
      "  zerodp report s0.json s3.json --metrics s3.jsonl --out runs.html\n"
      "  zerodp tokenizer train --input kjv --vocab 4096 --out kjv4k.model\n"
      "  zerodp prepare --tokenizer kjv4k.model --out kjv-shards kjv\n"
      "Run 'zerodp SUBCOMMAND --help' for a subcommand's options.");

  std::map<const CLI::App*, cli::Runner> runners;
  CLI::App* train = app.add_subcommand("train", "Train a model data-parallel at a ZeRO stage");
  runners[train] = cli::add_train(*train);
  CLI::App* estimate = app.add_subcommand(
      "estimate", "Per-rank memory and comm per step for each stage, before training");
  runners[estimate] = cli::add_estimate(*estimate);
  CLI::App* bench = app.add_subcommand("bench-comm", "Time every collective, like nccl-tests");
  runners[bench] = cli::add_bench_comm(*bench);
  CLI::App* bench_io = app.add_subcommand(
      "bench-io", "Sequential write and read bandwidth of a directory's disk, like fio");
  runners[bench_io] = cli::add_bench_io(*bench_io);
  CLI::App* exp = app.add_subcommand(
      "export",
      "Consolidate a sharded checkpoint into one fp32 safetensors file, or a Hugging Face "
      "model directory (--format hf)");
  runners[exp] = cli::add_export(*exp);
  CLI::App* sample = app.add_subcommand(
      "sample", "Generate text from a trained gpt or llama (an exported file or a checkpoint)");
  runners[sample] = cli::add_sample(*sample);
  CLI::App* report = app.add_subcommand(
      "report", "Run reports and metrics logs as one self-contained HTML page of charts");
  runners[report] = cli::add_report(*report);
  CLI::App* tokenizer = app.add_subcommand(
      "tokenizer", "Train a SentencePiece tokenizer; encode text to token ids and decode them");
  runners[tokenizer] = cli::add_tokenizer(*tokenizer);
  CLI::App* prepare = app.add_subcommand(
      "prepare", "Tokenize text and JSONL files into llm.c token shards with a manifest");
  runners[prepare] = cli::add_prepare(*prepare);

  std::vector<std::string> args;
  try {
    args = cli::expand_config_file(argc, argv, app);
  } catch (const Error& e) {
    fmt::print(stderr, "zerodp: {}\n", e.what());
    return cli::kExitUsage;
  }
  try {
    std::reverse(args.begin(), args.end());  // CLI11 takes a vector last-first
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line that names the value; --help teaches the rest.
    fmt::print(stderr, "zerodp: {} (see zerodp --help)\n", e.what());
    return cli::kExitUsage;
  }
  try {
    for (const auto& [sub, run] : runners) {
      if (sub->parsed()) return run(cli::Launch{argc, argv});
    }
  } catch (const std::bad_alloc& e) {
    fmt::print(stderr, "zerodp: {}\n", zerodp::out_of_memory_message(e));
    return cli::exit_code_for(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "zerodp: {}\n", e.what());
    return cli::exit_code_for(e);
  }
  return cli::kExitUsage;
}
