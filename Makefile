# Entry points; each one installs what it needs first (Debian, as root or with sudo).
#   make demo         train the GPT on the KJV text across 4 local ranks at stage 3
#   make test         release build + every test
#   make sanitize     ASan+UBSan over the fast tests, TSan over the comm tests
#   make format-check clang-format over the sources, changing nothing
JOBS ?= $(shell nproc)
RELEASE := build/release
ZERODP := $(RELEASE)/cli/zerodp

.PHONY: deps build demo test example sanitize asan tsan format format-check clean

deps:
	@scripts/install-deps.sh

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS)

demo: build
	$(ZERODP) train --ranks 4 --stage 3 --steps 1000 --report build/demo-report.json

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
	@cmake --build --preset asan-ubsan -j $(JOBS)
	ctest --preset asan-ubsan -j $(JOBS)

tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS) --target comm_test
	TSAN_OPTIONS="suppressions=$(CURDIR)/scripts/tsan.supp halt_on_error=1" \
	  build/tsan/tests/comm/comm_test

sanitize: asan tsan

FORMAT_FILES = $(shell git ls-files '*.h' '*.cc' '*.cpp')
format:
	clang-format -i $(FORMAT_FILES)

format-check:
	clang-format --dry-run --Werror $(FORMAT_FILES)

clean:
	rm -rf build
