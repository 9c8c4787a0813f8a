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

fuzz: setup
	@CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON -DKILN_TESTS=OFF >/dev/null
	@cmake --build build/fuzz -j $(JOBS)
	@mkdir -p fuzz/corpus-work
	build/fuzz/fuzz_gguf_reader fuzz/corpus-work fuzz/corpus/gguf -max_total_time=$${FUZZ_SECONDS:-60} -rss_limit_mb=2048

# The request parsers (chat, completions, tokenize, detokenize bodies through the router).
fuzz-requests: setup
	@CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON -DKILN_TESTS=OFF >/dev/null
	@cmake --build build/fuzz -j $(JOBS) --target fuzz_request_parser
	@mkdir -p fuzz/corpus-work-requests
	build/fuzz/fuzz_request_parser fuzz/corpus-work-requests fuzz/corpus/requests -max_total_time=$${FUZZ_SECONDS:-60} -rss_limit_mb=2048

# The WebSocket frame reader: arbitrary client byte streams, fed in arbitrary pieces.
fuzz-websocket: setup
	@CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON -DKILN_TESTS=OFF >/dev/null
	@cmake --build build/fuzz -j $(JOBS) --target fuzz_websocket_frames
	@mkdir -p fuzz/corpus-work-websocket
	build/fuzz/fuzz_websocket_frames fuzz/corpus-work-websocket -max_total_time=$${FUZZ_SECONDS:-60} -rss_limit_mb=2048

# The output constraints (JSON Schema, regex, GBNF, tools) compiled and run over kiln-tiny's
# vocabulary, each mask checked against accepting tokens one by one.
fuzz-grammar: setup
	@CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON -DKILN_TESTS=OFF >/dev/null
	@cmake --build build/fuzz -j $(JOBS) --target fuzz_grammar
	@mkdir -p fuzz/corpus-work-grammar
	build/fuzz/fuzz_grammar fuzz/corpus-work-grammar fuzz/corpus/grammar -max_total_time=$${FUZZ_SECONDS:-60} -rss_limit_mb=2048

# The Jinja interpreter on arbitrary templates (seeded with the real ones in ../shared/templates).
fuzz-jinja: setup
	@CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON -DKILN_TESTS=OFF >/dev/null
	@cmake --build build/fuzz -j $(JOBS) --target fuzz_jinja
	@mkdir -p fuzz/corpus-work-jinja
	build/fuzz/fuzz_jinja fuzz/corpus-work-jinja ../shared/templates -max_total_time=$${FUZZ_SECONDS:-60} -rss_limit_mb=2048 -max_len=65536

# The output parsers on arbitrary model output in every tool-call format: any chunking must
# give parse_all()'s result.
fuzz-output-parser: setup
	@CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_FUZZ=ON -DKILN_TESTS=OFF >/dev/null
	@cmake --build build/fuzz -j $(JOBS) --target fuzz_output_parser
	@mkdir -p fuzz/corpus-work-output
	build/fuzz/fuzz_output_parser fuzz/corpus-work-output fuzz/corpus/output -max_total_time=$${FUZZ_SECONDS:-60} -rss_limit_mb=2048

format:
	@git ls-files '*.cpp' '*.h' | xargs clang-format -i

clean:
	rm -rf build
