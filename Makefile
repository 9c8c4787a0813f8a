# The two commands of the README: `make test` and `make run`. Everything else is detail.
JOBS ?= $(shell nproc)
RELEASE := build/release
ASAN := build/asan
CMAKE_FLAGS ?=

.PHONY: test run setup build build-asan unit fuzz fuzz-requests fuzz-websocket fuzz-grammar fuzz-jinja fuzz-output-parser format clean

setup:
	@scripts/setup.sh

build: setup
	@cmake -S . -B $(RELEASE) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(RELEASE) -j $(JOBS)

build-asan: setup
	@cmake -S . -B $(ASAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_BENCH=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(ASAN) -j $(JOBS)

# Release build (asserts on) runs every test; the ASan+UBSan build runs the unit tests.
test: build build-asan
	@cd $(RELEASE) && ctest --output-on-failure -j $(JOBS) --timeout 600
	@cd $(ASAN) && ctest --output-on-failure -j $(JOBS) --timeout 900 -L unit

# kiln's main job on the default model: serve the bundled kiln-tiny (models/kiln-tiny.gguf).
PORT ?= 8080
run: build
	@sed -e 's/@PORT@/$(PORT)/g' -e 's|@KILN@|$(CURDIR)/$(RELEASE)/kiln|g' tools/tiny/make_run.txt
	@$(RELEASE)/kiln serve --port $(PORT)

# Fuzzing: a clang build with -DKILN_FUZZ=ON in build/fuzz, then one libFuzzer target for
# FUZZ_SECONDS (default 60) with a 2 GiB RSS limit, new inputs in fuzz/<work dir> (ignored).
FUZZ_CONFIGURE := CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON -DKILN_TESTS=OFF >/dev/null
# $(call run_fuzzer,target,work dir,seed dirs,extra flags)
define run_fuzzer
	@mkdir -p fuzz/$(2)
	build/fuzz/fuzz_$(1) fuzz/$(2) $(3) -max_total_time=$${FUZZ_SECONDS:-60} -rss_limit_mb=2048 $(4)
endef
# $(call fuzz_one,target,work dir,seed dirs,extra flags): builds that target alone, then runs it.
define fuzz_one
	@$(FUZZ_CONFIGURE)
	@cmake --build build/fuzz -j $(JOBS) --target fuzz_$(1)
	$(call run_fuzzer,$(1),$(2),$(3),$(4))
endef

# The GGUF reader (builds every fuzz target).
fuzz: setup
	@$(FUZZ_CONFIGURE)
	@cmake --build build/fuzz -j $(JOBS)
	$(call run_fuzzer,gguf_reader,corpus-work,fuzz/corpus/gguf)

# The request parsers (chat, completions, tokenize, detokenize, Anthropic messages and responses
# bodies through the router).
fuzz-requests: setup
	$(call fuzz_one,request_parser,corpus-work-requests,fuzz/corpus/requests)

# The WebSocket frame reader: arbitrary client byte streams, fed in arbitrary pieces.
fuzz-websocket: setup
	$(call fuzz_one,websocket_frames,corpus-work-websocket,)

# The output constraints (JSON Schema, regex, GBNF, tools) compiled and run over kiln-tiny's
# vocabulary, each mask checked against accepting tokens one by one.
fuzz-grammar: setup
	$(call fuzz_one,grammar,corpus-work-grammar,fuzz/corpus/grammar)

# The Jinja interpreter on arbitrary templates (seeded with the real ones in ../shared/templates).
fuzz-jinja: setup
	$(call fuzz_one,jinja,corpus-work-jinja,../shared/templates,-max_len=65536)

# The output parsers on arbitrary model output in every tool-call format: any chunking must
# give parse_all()'s result.
fuzz-output-parser: setup
	$(call fuzz_one,output_parser,corpus-work-output,fuzz/corpus/output)

format:
	@git ls-files '*.cpp' '*.h' | xargs clang-format -i

clean:
	rm -rf build
