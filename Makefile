# Entry points; each one installs what it needs first (Debian, as root or with sudo).
#   make demo         tokenizer, shards and a Llama trained on the KJV on 4 local ranks at stage 3
#   make test         release build + every test
#   make sanitize     ASan+UBSan over the fast tests, TSan over the comm tests
#   make format-check clang-format over the sources, changing nothing
#   make fuzz         libFuzzer over the safetensors header, the token-shard parsers and
#                     JSONL lines, 20 s each
#   make structure    layering, function and file lengths (scripts/check_structure.py)
#   make thread-safety clang's -Wthread-safety over the users of core/mutex.h (syntax only)
JOBS ?= $(shell nproc)
RELEASE := build/release
ZERODP := $(RELEASE)/cli/zerodp

.PHONY: deps build demo test example sanitize asan tsan fuzz format format-check structure thread-safety clean

deps:
	@scripts/install-deps.sh

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS)

# A tokenizer trained on the KJV, token shards of it, a Llama trained on them with checkpoints,
# stopped at step 800 and continued to 1200, exported as a Hugging Face directory with its
# tokenizer, and text sampled from that directory.
DEMO := build/demo
demo: build
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(ZERODP) tokenizer train --input kjv --vocab 4096 --out $(DEMO)/tok.model
	$(ZERODP) prepare --tokenizer $(DEMO)/tok.model --out $(DEMO)/shards kjv
	$(ZERODP) train --model llama --data $(DEMO)/shards --ranks 4 --stage 3 --steps 1200 \
	  --checkpoint-dir $(DEMO)/ckpt --checkpoint-every 400 --stop-after 800
	$(ZERODP) train --model llama --data $(DEMO)/shards --ranks 4 --stage 3 --steps 1200 \
	  --checkpoint-dir $(DEMO)/ckpt --resume latest --report $(DEMO)/report.json
	$(ZERODP) report $(DEMO)/report.json --out $(DEMO)/report.html
	$(ZERODP) export $(DEMO)/ckpt --format hf --out $(DEMO)/hf --tokenizer $(DEMO)/tok.model
	@echo "--- zerodp sample $(DEMO)/hf --prompt 'And God said' --temperature 0.8"
	@$(ZERODP) sample $(DEMO)/hf --prompt 'And God said' \
	  --max-tokens 120 --temperature 0.8 --top-k 40 --seed 7; echo

test: build
	ctest --preset release -j $(JOBS)

# The library as another project sees it: install, then build examples/custom_model out of
# tree with find_package(zerodp), and run it.
example: build
	rm -rf build/example-prefix build/example
	cmake --install $(RELEASE) --prefix build/example-prefix >/dev/null
	cmake -S examples/custom_model -B build/example -G Ninja \
	  -DCMAKE_PREFIX_PATH=$(CURDIR)/build/example-prefix >/dev/null
	cmake --build build/example
	build/example/custom_model

asan: deps
	@cmake --preset asan-ubsan >/dev/null
	@cmake --build --preset asan-ubsan -j $(JOBS) --target zerodp_fast_tests
	ctest --preset asan-ubsan -j $(JOBS)

tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS) --target comm_test memory_state_file_test \
	  train_async_save_test
	TSAN_OPTIONS="suppressions=$(CURDIR)/scripts/tsan.supp halt_on_error=1" \
	  build/tsan/tests/comm/comm_test
	TSAN_OPTIONS="suppressions=$(CURDIR)/scripts/tsan.supp halt_on_error=1" \
	  build/tsan/tests/memory/memory_state_file_test
	TSAN_OPTIONS="suppressions=$(CURDIR)/scripts/tsan.supp halt_on_error=1" \
	  build/tsan/tests/train/train_async_save_test

sanitize: asan tsan

# libFuzzer needs clang, and the CMake build is g++, so the target is built here from the few
# sources it needs. It runs over a copy of the seed corpus and writes crash inputs under
# build/fuzz, never into the source tree. 16 MiB for one allocation is 256 times the longest
# input; the target itself fails any input that makes the parser hold more than 32 times its
# size.
FUZZ := build/fuzz
FUZZ_SOURCES := fuzz/safetensors_fuzz.cc src/checkpoint/safetensors.cc \
  src/checkpoint/format.cc src/core/error.cc src/core/files.cc src/core/sha256.cc
$(FUZZ)/safetensors_fuzz: $(FUZZ_SOURCES) src/checkpoint/safetensors.h \
  src/checkpoint/format.h src/checkpoint/safetensors_text.h src/core/error.h src/core/files.h \
  src/core/sha256.h src/tensor/dtype.h
	@mkdir -p $(FUZZ)
	clang++ -std=c++20 -O1 -g -Wall -Wextra -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=all -I src $(FUZZ_SOURCES) -lfmt -o $@

# The token-shard formats (data/shard_format.h): llm.c's shard header and manifest.json.
SHARDS_FUZZ_SOURCES := fuzz/shards_fuzz.cc src/data/shard_format.cc src/core/error.cc \
  src/core/files.cc src/core/sha256.cc
$(FUZZ)/shards_fuzz: $(SHARDS_FUZZ_SOURCES) src/data/shard_format.h src/core/error.h \
  src/core/files.h src/core/sha256.h
	@mkdir -p $(FUZZ)
	clang++ -std=c++20 -O1 -g -Wall -Wextra -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=all -I src $(SHARDS_FUZZ_SOURCES) -lfmt -o $@

# JSONL lines as zerodp prepare parses them (data/corpus.h), against nlohmann's DOM parse.
JSONL_FUZZ_SOURCES := fuzz/jsonl_fuzz.cc src/data/corpus.cc src/core/error.cc src/core/files.cc
$(FUZZ)/jsonl_fuzz: $(JSONL_FUZZ_SOURCES) src/data/corpus.h src/core/error.h src/core/files.h
	@mkdir -p $(FUZZ)
	clang++ -std=c++20 -O1 -g -Wall -Wextra -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=all -I src $(JSONL_FUZZ_SOURCES) -lfmt -o $@

fuzz: deps $(FUZZ)/safetensors_fuzz $(FUZZ)/shards_fuzz $(FUZZ)/jsonl_fuzz
	rm -rf $(FUZZ)/corpus && mkdir -p $(FUZZ)/corpus && cp fuzz/corpus/safetensors/* $(FUZZ)/corpus/
	$(FUZZ)/safetensors_fuzz -max_total_time=20 -max_len=65536 -rss_limit_mb=512 \
	  -malloc_limit_mb=16 -dict=fuzz/safetensors.dict -artifact_prefix=$(FUZZ)/ \
	  -print_final_stats=1 $(FUZZ)/corpus
	rm -rf $(FUZZ)/shards_corpus && mkdir -p $(FUZZ)/shards_corpus && \
	  cp fuzz/corpus/shards/* $(FUZZ)/shards_corpus/
	$(FUZZ)/shards_fuzz -max_total_time=20 -max_len=65536 -rss_limit_mb=512 \
	  -malloc_limit_mb=16 -dict=fuzz/shards.dict -artifact_prefix=$(FUZZ)/ \
	  -print_final_stats=1 $(FUZZ)/shards_corpus
	rm -rf $(FUZZ)/jsonl_corpus && mkdir -p $(FUZZ)/jsonl_corpus && \
	  cp fuzz/corpus/jsonl/* $(FUZZ)/jsonl_corpus/
	$(FUZZ)/jsonl_fuzz -max_total_time=20 -max_len=4096 -rss_limit_mb=512 \
	  -malloc_limit_mb=16 -dict=fuzz/jsonl.dict -artifact_prefix=$(FUZZ)/ \
	  -print_final_stats=1 $(FUZZ)/jsonl_corpus

FORMAT_FILES = $(shell git ls-files '*.h' '*.cc' '*.cpp')
format:
	clang-format -i $(FORMAT_FILES)

format-check:
	clang-format --dry-run --Werror $(FORMAT_FILES)

clean:
	rm -rf build

structure:
	python3 scripts/check_structure.py

# Configures (for compile_commands.json) without building.
thread-safety: deps
	@cmake --preset release >/dev/null
	python3 scripts/check_thread_safety.py -j $(JOBS)
